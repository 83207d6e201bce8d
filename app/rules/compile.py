"""Semantic compilation of a validated :class:`Rule`: expressions, aggregates,
joins and stateful functions, checked against the source schema.

Problems are reported through a callback with the YAML path of the offending
value, so the loader can print ``file:line:col`` for each of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from app.errors import ExpressionError
from app.events import Schema
from app.rules.aggregates import AggSpec, compile_aggregate
from app.rules.baselines import BaselineSpec, Collector
from app.rules.durations import MAX_DURATION_MS
from app.rules.expr import Compiled, Synthetic, compile_expr
from app.rules.model import Rule
from app.rules.template import filter_problems, placeholders, static_problem, template_problem
from app.tables import TABLES, enriched_fields

Report = Callable[[tuple[str | int, ...], str], None]

_UNIT_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}
_UNIT_MS["WEEK"] = 7 * _UNIT_MS["DAY"]


@dataclass(frozen=True)
class PctChange:
    """``pct_change(field, lookback)``: percent change against the newest value
    at least ``lookback_ms`` older, per group. Computed into column ``column``."""

    column: str
    field: str
    lookback_ms: int


@dataclass(frozen=True)
class RuleParts:
    fields: dict[str, str]
    where: Compiled | None = None
    clear: Compiled | None = None
    aggs: tuple[AggSpec, ...] = ()
    having: Compiled | None = None
    steps: tuple[Compiled, ...] = ()
    arms: tuple[tuple[Compiled | None, str], ...] = ()
    pct_changes: tuple[PctChange, ...] = field(default_factory=tuple)
    #: baseline calls of ``where``/``clear`` (threshold rules) and of ``having`` (windows)
    baselines: tuple[BaselineSpec, ...] = ()
    having_baselines: tuple[BaselineSpec, ...] = ()


def _interval_ms(node: exp.Expression) -> int:
    unit = node.args.get("unit")
    if not isinstance(node, exp.Interval) or unit is None or not isinstance(node.this, exp.Literal):
        msg = "expected a duration such as 1d, 15m or 1h as the second argument"
        raise ValueError(msg)
    name = unit.name.upper()
    if name not in _UNIT_MS:
        msg = f"unsupported duration unit {name}"
        raise ValueError(msg)
    return int(str(node.this.this)) * _UNIT_MS[name]


class WhereFunctions:
    """What a threshold rule's ``where`` and ``clear`` may call beyond the plain functions:
    ``pct_change`` and the baselines, each resolved to a synthetic column (an
    :data:`app.rules.expr.Synthetic` resolver) and collected."""

    def __init__(self, fields: Mapping[str, str], source: str) -> None:
        self.fields, self.source = fields, source
        self.pct: dict[str, PctChange] = {}
        self.baselines = Collector(fields, f"the {source} schema")

    def resolve(self, name: str, args: list[exp.Expression]) -> tuple[str, str] | None:
        if name != "pct_change":
            return self.baselines.resolve(name, args)
        if len(args) != 2 or not isinstance(args[0], exp.Column):
            msg = "expected pct_change(field, lookback), e.g. pct_change(adj_close, 1d)"
            raise ValueError(msg)
        fname = args[0].name
        if self.fields.get(fname) not in ("long", "double"):
            msg = f"'{fname}' is not a numeric field of the {self.source} schema"
            raise ValueError(msg)
        lookback = _interval_ms(args[1])
        if lookback <= 0:
            msg = "the lookback must be above 0, e.g. pct_change(adj_close, 1d)"
            raise ValueError(msg)
        if lookback > MAX_DURATION_MS:
            msg = "the lookback is longer than the maximum of 366d"
            raise ValueError(msg)
        col = f"pct_change({fname}, {lookback}ms)"
        self.pct[col] = PctChange(col, fname, lookback)
        return col, "double"


def check_condition(text: str, source: str, schema: Schema) -> None:
    """Compile an event condition (``where``, ``clear``) of a rule that did not validate,
    against its source's own fields (no enrichment): :class:`ExpressionError` names an unknown
    field, a type mismatch or a syntax error in the same round as the rule's other problems.
    ``pct_change`` and the baselines are taken whatever the rule's kind (a kind that may not
    call them is told once the rule validates)."""
    fields = dict(enriched_fields(schema, ()))
    resolve = WhereFunctions(fields, source).resolve
    compile_expr(text, fields, boolean=True, allow_intervals=True, synthetic=resolve, check_literals=True)


def compile_parts(rule: Rule, schema: Schema, report: Report) -> RuleParts | None:
    """Compile everything the evaluator needs; report each problem; None if any."""
    problems = 0

    def fail(path: tuple[str | int, ...], message: str) -> None:
        nonlocal problems
        problems += 1
        report(path, message)

    fields: dict[str, str] = dict(enriched_fields(schema, rule.enrich))
    seen_as: set[str] = set()
    for i, spec in enumerate(rule.enrich):
        if spec.on not in schema.all_fields():
            fail(("enrich", i, "on"), f"join field '{spec.on}' is not in the {rule.source} schema")
        if spec.as_ in seen_as or spec.as_ in fields:
            fail(("enrich", i, "as"), f"'{spec.as_}' is used twice or clashes with a field")
        seen_as.add(spec.as_)
        if spec.table not in TABLES:
            fail(("enrich", i, "table"), f"unknown table '{spec.table}'")
    for i, g in enumerate(rule.group_by):
        if g not in fields:
            fail(("group_by", i), f"group_by field '{g}' is not in the {rule.source} schema")

    functions = WhereFunctions(fields, rule.source)
    synthetic_where = functions.resolve
    pct, base_where = functions.pct, functions.baselines

    def expr(
        path: tuple[str | int, ...],
        text: str | None,
        scope: Mapping[str, str] | None = None,
        synthetic: Synthetic | None = None,
    ) -> Compiled | None:
        if text is None:
            return None
        try:
            return compile_expr(
                text,
                fields if scope is None else scope,
                boolean=True,
                allow_intervals=True,
                synthetic=synthetic,
                check_literals=True,
            )
        except ExpressionError as exc:
            fail(path, str(exc))
            return None

    where = expr(("where",), rule.where, synthetic=synthetic_where if rule.kind == "threshold" else None)
    clear = expr(("clear",), rule.clear, synthetic=synthetic_where if rule.kind == "threshold" else None)

    aggs: list[AggSpec] = []
    for name, text in rule.aggregate.items():
        if name in fields:
            fail(("aggregate", name), f"aggregate name '{name}' clashes with a field")
            continue
        try:
            aggs.append(compile_aggregate(name, text, fields, check_literals=True))
        except ExpressionError as exc:
            fail(("aggregate", name), str(exc))
    having = None
    base_having = Collector({}, "the aggregates")
    if rule.having is not None and len(aggs) == len(rule.aggregate):
        agg_types = {a.name: a.type for a in aggs}
        having_schema = {**{g: fields[g] for g in rule.group_by if g in fields}, **agg_types}
        windowed = rule.window is not None and rule.window.type in ("tumbling", "hopping")
        base_having = Collector(
            agg_types, "the aggregates", None if windowed else "baselines need a tumbling or hopping window"
        )

        def synthetic_having(name: str, args: list[exp.Expression]) -> tuple[str, str] | None:
            if name != "prev":
                return base_having.resolve(name, args)
            if len(args) != 1 or not isinstance(args[0], exp.Column) or args[0].name not in agg_types:
                msg = f"expected prev(<aggregate name>), one of {', '.join(agg_types)}"
                raise ValueError(msg)
            return f"prev.{args[0].name}", agg_types[args[0].name]

        having = expr(("having",), rule.having, scope=having_schema, synthetic=synthetic_having)

    steps = tuple(expr(("sequence", i, "where"), s.where) for i, s in enumerate(rule.sequence))
    arms = tuple((expr(("branch", i, "when"), a.when), a.topic) for i, a in enumerate(rule.branch))
    for path, fname in (
        (("change",), rule.change),
        (("new_term", "field"), rule.new_term and rule.new_term.field),
    ):
        if fname is not None and fname not in fields:
            fail(path, f"field '{fname}' is not in the {rule.source} schema")
    if rule.expect_from is not None and rule.group_by != (schema.key,):
        fail(("expect_from",), f"expect_from needs group_by: [{schema.key}]")

    known = set(fields) | {a.name for a in aggs} | {"previous", "count", "window_start", "window_end"}
    if pct:
        known.add("pct_change")  # the value of the rule's (first) pct_change() call
    # what each name an annotation may use holds (window_start/end: epoch milliseconds;
    # previous: the change field's value); a filter of the wrong type is refused
    types = {**fields, **{a.name: a.type for a in aggs}, "count": "long", "pct_change": "double"}
    types.update(window_start="long", window_end="long")
    if rule.change is not None and rule.change in fields:
        types["previous"] = fields[rule.change]
    for name, value in rule.labels.items():
        problem = static_problem(value)
        if problem is not None:
            fail(("labels", name), problem)
    for name, template in rule.annotations.items():
        try:
            unknown = [p for p in placeholders(template) if p not in known]
        except ValueError as exc:
            fail(("annotations", name), str(exc))
            continue
        problem = template_problem(template)
        if problem is not None:
            fail(("annotations", name), problem)
            continue
        if unknown:
            fail(("annotations", name), f"template names unknown field(s): {', '.join(unknown)}")
            continue
        for problem in filter_problems(template, types):
            fail(("annotations", name), problem)
    if problems:
        return None
    return RuleParts(
        fields=fields,
        where=where,
        clear=clear,
        aggs=tuple(aggs),
        having=having,
        steps=tuple(s for s in steps if s is not None),
        arms=arms,
        pct_changes=tuple(pct.values()),
        baselines=tuple(base_where.specs.values()),
        having_baselines=tuple(base_having.specs.values()),
    )
