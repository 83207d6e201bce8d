"""Window aggregates: ``count(*)``, ``count(x)``, ``count(distinct x)``, ``sum``, ``avg``,
``min``, ``max`` and exact ``percentile(x, p)``, with SQL semantics.

Aggregates skip NULL inputs; over no (non-NULL) input ``count`` is 0 and the
others are NULL, as in Spark. Accumulator states are plain JSON data so they
can live in a Faust table and survive a restart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from app.errors import ExpressionError
from app.rules.expr import Compiled, compile_expr, parse
from app.rules.functions import call_args

#: Per-window cap on values kept by count(distinct) and percentile, to bound memory.
MAX_VALUES = 100_000

Row = Mapping[str, Any]


@dataclass(frozen=True)
class AggSpec:
    """One named aggregate, e.g. ``avg_t: avg(temperature)``."""

    name: str
    func: str  # count_star, count, count_distinct, sum, avg, min, max, percentile
    arg: Compiled | None
    param: float | None
    type: str
    text: str

    def init(self) -> Any:
        if self.func in ("count_star", "count"):
            return 0
        if self.func in ("sum", "avg"):
            return [0, 0]
        if self.func in ("count_distinct", "percentile"):
            return []
        return None  # min, max

    def input(self, row: Row) -> Any:
        """The value this aggregate reads from a row (None for count(*))."""
        return None if self.arg is None else self.arg(row)

    def add_value(self, state: Any, v: Any) -> Any:
        """Fold in a value already read with :meth:`input`."""
        return ADDERS[self.func](state, v)

    def result(self, state: Any) -> Any:
        if self.func in ("count_star", "count"):
            return state
        if self.func == "sum":
            return None if state[1] == 0 else state[0]
        if self.func == "avg":
            return None if state[1] == 0 else state[0] / state[1]
        if self.func == "count_distinct":
            return len(state)
        if self.func == "percentile":
            return percentile(sorted(state), float(self.param or 0.0)) if state else None
        return state


def _add_count_star(state: Any, v: Any) -> Any:
    return state + 1


def _add_count(state: Any, v: Any) -> Any:
    return state if v is None else state + 1


def _add_sum(state: Any, v: Any) -> Any:  # sum and avg: [total, non-NULL count]
    return state if v is None else [state[0] + v, state[1] + 1]


def _add_min(state: Any, v: Any) -> Any:
    return v if v is not None and (state is None or v < state) else state


def _add_max(state: Any, v: Any) -> Any:
    return v if v is not None and (state is None or v > state) else state


def _add_distinct(state: Any, v: Any) -> Any:
    if v is not None:
        key = _distinct_key(v)
        if key not in state and len(state) < MAX_VALUES:
            state.append(key)
    return state


def _add_percentile(state: Any, v: Any) -> Any:
    if v is not None and len(state) < MAX_VALUES:
        state.append(v)
    return state


#: Per aggregate function: fold one input value (NULL skipped) into the accumulator.
ADDERS: dict[str, Callable[[Any, Any], Any]] = {
    "count_star": _add_count_star,
    "count": _add_count,
    "sum": _add_sum,
    "avg": _add_sum,
    "min": _add_min,
    "max": _add_max,
    "count_distinct": _add_distinct,
    "percentile": _add_percentile,
}


def _many(add: Callable[[Any, Any], Any]) -> Callable[[Any, Sequence[Any]], Any]:
    def add_many(state: Any, values: Sequence[Any]) -> Any:
        for v in values:
            state = add(state, v)
        return state

    return add_many


def _many_sum(state: Any, values: Sequence[Any]) -> Any:
    total, n = state
    for v in values:  # one by one, left to right: the same float rounding as _add_sum
        if v is not None:
            total += v
            n += 1
    return [total, n]


def _many_min(state: Any, values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return state
    return min(present) if state is None else min(state, *present)  # ties keep the earlier, as _add_min


def _many_max(state: Any, values: Sequence[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return state
    return max(present) if state is None else max(state, *present)


#: Per aggregate function: fold a list of input values, in order; the same result as
#: :data:`ADDERS` one value at a time.
MANY_ADDERS: dict[str, Callable[[Any, Sequence[Any]], Any]] = {
    **{func: _many(add) for func, add in ADDERS.items()},
    "count_star": lambda state, values: state + len(values),
    "count": lambda state, values: state + sum(v is not None for v in values),
    "sum": _many_sum,
    "avg": _many_sum,
    "min": _many_min,
    "max": _many_max,
}


def _distinct_key(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def percentile(values: list[float], p: float) -> float:
    """Exact percentile with linear interpolation between closest ranks (Spark's ``percentile``)."""
    if len(values) == 1:
        return float(values[0])
    pos = p * (len(values) - 1)
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return float(values[lo] + (values[hi] - values[lo]) * (pos - lo))


_SIMPLE: dict[type[exp.Expression], str] = {exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}


def compile_aggregate(name: str, text: str, schema: Mapping[str, str]) -> AggSpec:
    """Parse ``text`` (one aggregate call) against the source ``schema``."""
    node = parse(text)

    def arg_of(n: exp.Expression) -> Compiled:
        compiled = compile_expr(n.sql(dialect="spark"), schema)
        if compiled.type == "boolean":
            msg = f"in {text!r}: aggregate argument must be a value, not a condition"
            raise ExpressionError(msg)
        return compiled

    if isinstance(node, exp.Count):
        inner = node.this
        if isinstance(inner, exp.Star):
            return AggSpec(name, "count_star", None, None, "long", text)
        if isinstance(inner, exp.Distinct):
            return AggSpec(name, "count_distinct", arg_of(inner.expressions[0]), None, "long", text)
        return AggSpec(name, "count", arg_of(inner), None, "long", text)
    for cls, func in _SIMPLE.items():
        if isinstance(node, cls):
            arg = arg_of(node.this)
            if func in ("sum", "avg") and arg.type not in ("long", "double"):
                msg = f"in {text!r}: {func}() needs a number"
                raise ExpressionError(msg)
            rtype = "double" if func == "avg" or (func == "sum" and arg.type == "double") else arg.type
            return AggSpec(name, func, arg, None, rtype, text)
    fname = node.name.lower() if isinstance(node, exp.Anonymous) else ""
    if isinstance(node, exp.Func) and (fname in ("percentile", "count_distinct") or _is_percentile(node)):
        args = call_args(node)
        if fname == "count_distinct" and len(args) == 1:
            return AggSpec(name, "count_distinct", arg_of(args[0]), None, "long", text)
        if len(args) == 2 and isinstance(args[1], exp.Literal) and not args[1].is_string:
            p = float(str(args[1].this))
            if 0.0 <= p <= 1.0:
                arg = arg_of(args[0])
                if arg.type in ("long", "double"):
                    return AggSpec(name, "percentile", arg, p, "double", text)
        msg = f"in {text!r}: expected percentile(field, p) with 0 <= p <= 1"
        raise ExpressionError(msg)
    allowed = "count(*), count(x), count(distinct x), sum, avg, min, max, percentile(x, p)"
    msg = f"in {text!r}: expected one aggregate call: {allowed}"
    raise ExpressionError(msg)


def _is_percentile(node: exp.Expression) -> bool:
    return type(node).__name__.lower() in ("percentilecont", "percentile", "quantile")


AggFn = Callable[[Row], Any]


def empty_results(specs: list[AggSpec]) -> dict[str, Any]:
    """The aggregates of an empty window (count 0, the rest NULL)."""
    return {s.name: s.result(s.init()) for s in specs}
