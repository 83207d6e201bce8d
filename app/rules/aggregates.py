"""Window aggregates: ``count(*)``, ``count(x)``, ``count(distinct x)``, ``sum``, ``avg``,
``min``, ``max`` and exact ``percentile(x, p)``, with SQL semantics.

Aggregates skip NULL inputs; over no (non-NULL) input ``count`` is 0 and the
others are NULL, as in Spark. Accumulator states are plain JSON data so they
can live in a Faust table and survive a restart.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
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
        if self.func == "count_distinct":
            return {}
        if self.func == "percentile":
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
    """count(distinct): the state maps each value's token to 1 (JSON, found in O(1)); a
    list is a state written before, of the values themselves."""
    if v is not None:
        if isinstance(state, list):
            state = {_token(k): 1 for k in state}
        key = _token(v)
        if key not in state and len(state) < MAX_VALUES:
            state[key] = 1
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


class _Sliding:
    """One aggregate of a sliding window: values enter newest last and leave oldest first.
    The common base makes every call from :class:`SlidingAggregates` a native one when
    compiled (typed as ``Any``, each was a Python method call)."""

    __slots__ = ()

    def add(self, ts: int, v: Any) -> None:
        raise NotImplementedError

    def remove(self, ts: int, v: Any) -> None:
        raise NotImplementedError

    def result(self) -> Any:
        raise NotImplementedError


class _Count(_Sliding):
    """count(*) (``star``) or count(x) of a sliding window."""

    __slots__ = ("n", "star")

    def __init__(self, star: bool) -> None:
        self.n, self.star = 0, star

    def add(self, ts: int, v: Any) -> None:
        if self.star or v is not None:
            self.n += 1

    def remove(self, ts: int, v: Any) -> None:
        if self.star or v is not None:
            self.n -= 1

    def result(self) -> Any:
        return self.n


def _grow(partials: list[float], x: float) -> None:
    """Add ``x`` exactly to the non-overlapping ``partials`` (Shewchuk, as ``math.fsum``)."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


class _Sum(_Sliding):
    """sum(x) or avg(x) of a sliding window, exact: integers as a Python int, floats
    as exact partials, so removing a value leaves no rounding behind. The result is
    the correctly rounded sum of the window's values (an int when they all are)."""

    __slots__ = ("avg", "floats", "ints", "n", "partials")

    def __init__(self, avg: bool) -> None:
        self.avg = avg
        self.ints, self.n, self.floats = 0, 0, 0
        self.partials: list[float] = []

    def add(self, ts: int, v: Any) -> None:
        if v is None:
            return
        self.n += 1
        if isinstance(v, int):
            self.ints += v
        else:
            self.floats += 1
            _grow(self.partials, float(v))

    def remove(self, ts: int, v: Any) -> None:
        if v is None:
            return
        self.n -= 1
        if isinstance(v, int):
            self.ints -= v
        else:
            self.floats -= 1
            if self.floats:
                _grow(self.partials, -float(v))
            else:
                self.partials = []

    def result(self) -> Any:
        if not self.n:
            return None
        total = math.fsum([*self.partials, self.ints]) if self.floats else self.ints
        return total / self.n if self.avg else total


class _Extreme(_Sliding):
    """min(x) or max(x) of a sliding window: a monotonic queue of ``(ts, value)``
    candidates, the oldest first; among equal extremes the earliest wins, as in
    :func:`_add_min`. The queue is a list from ``head`` on (a list's own operations are
    native when compiled, a deque's are Python calls); the left part is cut off once it is
    half the list, so each candidate is moved O(1) times."""

    __slots__ = ("head", "queue", "smallest")

    def __init__(self, smallest: bool) -> None:
        self.queue: list[tuple[int, Any]] = []
        self.head = 0
        self.smallest = smallest

    def add(self, ts: int, v: Any) -> None:
        if v is None:
            return
        q, head = self.queue, self.head
        if self.smallest:
            while len(q) > head and q[-1][1] > v:
                q.pop()
        else:
            while len(q) > head and q[-1][1] < v:
                q.pop()
        q.append((ts, v))

    def remove(self, ts: int, v: Any) -> None:
        # the window's oldest value is either the queue's head or was dropped by a
        # later, strictly more extreme one (which is then ahead of any equal value)
        q, head = self.queue, self.head
        if v is not None and len(q) > head and q[head][0] == ts and q[head][1] == v:
            head += 1
            if head * 2 >= len(q):
                del q[:head]
                head = 0
            self.head = head

    def result(self) -> Any:
        q = self.queue
        return q[self.head][1] if len(q) > self.head else None


class _Distinct(_Sliding):
    """count(distinct x) of a sliding window: a count per distinct value."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[Any, int] = {}

    def add(self, ts: int, v: Any) -> None:
        if v is not None:
            k = _distinct_key(v)
            self.counts[k] = self.counts.get(k, 0) + 1

    def remove(self, ts: int, v: Any) -> None:
        if v is not None:
            k = _distinct_key(v)
            left = self.counts[k] - 1
            if left:
                self.counts[k] = left
            else:
                del self.counts[k]

    def result(self) -> Any:
        return min(len(self.counts), MAX_VALUES)  # as the capped list of first values


class _Percentile(_Sliding):
    """percentile(x, p) of a sliding window: its values kept sorted."""

    __slots__ = ("p", "values")

    def __init__(self, p: float) -> None:
        self.p = p
        self.values: list[Any] = []

    def add(self, ts: int, v: Any) -> None:
        if v is not None:
            bisect.insort(self.values, v)

    def remove(self, ts: int, v: Any) -> None:
        if v is not None:
            del self.values[bisect.bisect_left(self.values, v)]

    def result(self) -> Any:
        return percentile(self.values, self.p) if self.values else None


class SlidingAggregates:
    """The aggregates of a window that slides forward in time: values enter newest
    last and leave oldest first, each in O(1) amortised (percentile: O(log n)), so
    evaluating a window at every change point costs no re-aggregation. The results
    are those of folding the window's values in time order with :data:`ADDERS`,
    except that a float sum is the correctly rounded one, and a percentile over
    more than :data:`MAX_VALUES` values (``capped``: the caller recomputes it)."""

    __slots__ = ("accs", "size")

    def __init__(self, specs: Sequence[AggSpec]) -> None:
        self.accs: list[_Sliding] = [_sliding(a) for a in specs]
        self.size = 0

    def add(self, ts: int, inputs: Sequence[Any]) -> None:
        self.size += 1
        for acc, v in zip(self.accs, inputs):
            acc.add(ts, v)

    def remove(self, ts: int, inputs: Sequence[Any]) -> None:
        self.size -= 1
        for acc, v in zip(self.accs, inputs):
            acc.remove(ts, v)

    def results(self, specs: Sequence[AggSpec]) -> dict[str, Any]:
        return {a.name: acc.result() for a, acc in zip(specs, self.accs)}

    def capped(self) -> bool:
        return self.size > MAX_VALUES and any(isinstance(a, _Percentile) for a in self.accs)


def _sliding(spec: AggSpec) -> _Sliding:
    func = spec.func
    if func in ("count_star", "count"):
        return _Count(star=func == "count_star")
    if func in ("sum", "avg"):
        return _Sum(avg=func == "avg")
    if func in ("min", "max"):
        return _Extreme(smallest=func == "min")
    if func == "count_distinct":
        return _Distinct()
    return _Percentile(float(spec.param or 0.0))


def _distinct_key(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _token(v: Any) -> str:
    """A value as a JSON object key that keeps SQL's distinctness: 2 and 2.0 are one
    value, 2 and '2' two."""
    k = _distinct_key(v)
    if isinstance(k, str):
        return "s" + k
    if isinstance(k, bool | int):
        return "i" + str(int(k))
    if isinstance(k, float):
        return "f" + repr(k)
    return "j" + orjson.dumps(k, option=orjson.OPT_SORT_KEYS).decode()


def percentile(values: Sequence[int | float], p: float) -> float:
    """Exact percentile with linear interpolation between closest ranks (Spark's ``percentile``)."""
    if len(values) == 1:
        return float(values[0])
    pos = p * (len(values) - 1)
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return float(values[lo] + (values[hi] - values[lo]) * (pos - lo))


_SIMPLE: dict[type[exp.Expression], str] = {exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}


def compile_aggregate(
    name: str, text: str, schema: Mapping[str, str], *, check_literals: bool = False
) -> AggSpec:
    """Parse ``text`` (one aggregate call) against the source ``schema``. ``check_literals``:
    refuse the literal arguments a function cannot mean, as in a condition
    (:func:`app.rules.expr.compile_expr`). Raises :class:`ExpressionError` naming ``text``."""
    node = parse(text)

    def arg_of(n: exp.Expression) -> Compiled:
        compiled = compile_expr(text, schema, check_literals=check_literals, part=n)
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
        got = ""
        if len(args) == 2 and isinstance(args[1], exp.Literal) and not args[1].is_string:
            p = float(str(args[1].this))
            if 0.0 <= p <= 1.0:
                arg = arg_of(args[0])
                if arg.type in ("long", "double"):
                    return AggSpec(name, "percentile", arg, p, "double", text)
            else:
                got = f"; got p = {args[1].this}"  # as written, not as the float it was read as
        msg = f"in {text!r}: expected percentile(field, p) with 0 <= p <= 1{got}"
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
