"""Threshold rules natively in a Spark backtest: the per-event work in the JVM, the
evaluator's ``ThresholdLogic`` only on the events that can change an alert.

Per (rule, group), in the order the evaluator takes a group's events ((partition, offset):
one group's events all meet on one stream partition), Spark SQL computes each event's
``holds`` (``where IS TRUE``), ``clr`` (``clear IS TRUE``; without ``clear`` the evaluator
ends an episode where the condition is not TRUE, so ``clr = NOT holds``) and drops what
:meth:`ThresholdLogic.on_event <app.rules.logic.threshold.ThresholdLogic.on_event>`
provably does nothing with (for the rules :func:`native_problem` admits: no
``keep_firing_for``, ``no_data``, ``pct_change()``, baselines, ``order: event_time``, late
copies; so no timer, and at most one transition per event):

1. **before the group's first TRUE ``holds``**: a group without state stays without state
   on a not-TRUE event (``on_event`` returns before touching anything);
2. **late events**: from that first TRUE on the group has state, never deleted, and an
   event is late (skipped, nothing changes) exactly when its time is below the newest time
   of the group's earlier events (``last_event`` is set at every event that is not late,
   each at least the one before: a running ``max``; a late event does not move it). What
   is left is in time order, so no drop below changes another event's lateness;
3. **repeats**: the rest falls into *segments*, runs of consecutive events with the same
   ``(holds, clr)``. After an event with ``holds`` not TRUE the group is quiet, or (with
   ``clear``, ``clr`` not TRUE) firing; the next event of the same signature leaves it so,
   with no transition: a segment with ``holds`` not TRUE needs its first event only. After
   one with ``holds`` TRUE and ``clr`` not TRUE the group is firing or pending; a pending
   one fires at the first event of the segment at position ``p`` (from 0) with ``p + 1 >=
   consecutive`` and ``ts - ts(segment start) >= for``, or earlier (a streak begun before
   the segment only makes it earlier: ``streak`` is at least ``p + 1``, ``streak_since`` at
   most the segment's start), so such a segment is needed up to and including that event;
   after it the group fires and each event only adds 1 to ``streak``. ``(TRUE, TRUE)``
   events can fire or pend when the group is not firing and resolve when it is: each one
   is kept.

All of it is window functions over one sort of the source's events per (source,
``group_by``) *cohort* of rules (:func:`kept_rows`: each rule's steps as conditional
aggregates over the same order, no per-rule filter), the fields joined back for the kept
rows only. The kept rows of each group then go, in order, through the evaluator's ``ThresholdLogic``
(composed, not subclassed: it may be compiled), its condition and ``clear`` read from the
values Spark computed (as the keyed path reads ``holds``), in one Python call per shuffle
partition (:class:`ThresholdStep`). Each kept row carries the number of dropped ``holds``
TRUE rows before it and the group's newest time before it, added to the state's ``streak``
and ``last_event`` before the call, so the state is the evaluator's at every kept row (the
rows dropped after a group's last kept row change only its final, unseen, state).

Each transition is an output row at its own event, ``idx`` = ``base`` + the rule's place in
the evaluator's per-event order (:func:`evaluation_order`): at one event, native threshold
transitions come in the evaluator's order among themselves, after the keyed path's and
before the stream path's (which is how the keyed path already orders them).

What is decided per stream partition (``jobs.windows.native_partitions``): with the
event-time bound on (``APP_MAX_EVENT_SKEW``) every rule is on the stream path, and a
partition where some event is more than the skew ahead of the clock before it leaves the
rule to the evaluator there (the bound would hold that event and evaluate it later, in
another order); where no event is, the bound admits every event as it comes, and a
threshold rule (no timer) does exactly what it does without the bound.

**Registry columns** (``enrich``): a backtest's registry rows are static (``--table`` rows, or
none), so each join is a broadcast join on ``str(value)`` of the ``on`` field, as the evaluator
looks the row up (a NULL field looks up ``"None"``; a string ``on`` field only, whose text
is its value in both), the columns typed as :class:`app.tables.Tables` holds them (validated:
strings and floats; the tables have no other types) and nested as ``<as>.<column>``; a
missing row drops the event for the rule (``missing: skip``, the evaluator skips it: it is
not late, not counted, moves nothing) or gives NULL columns (``missing: null``). Python joins
the kept rows again with the evaluator's own join, so the alert's values and annotations
read the same row.

What stays where it was (:func:`native_problem` says why): ``keep_firing_for`` and
``no_data`` (timers), ``pct_change()`` and baselines (history per group), ``order:
event_time``, ``late_policy: side`` (late copies), a ``where`` or ``clear`` Spark SQL cannot
express, ``group_by`` on a non-string field (the evaluator groups by ``str(value)``), a join
on a non-string field.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from itertools import groupby
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

from app.errors import ExpressionError
from app.events import SCHEMAS, Event
from app.rules.evaluator import StreamEvaluator, ThresholdLogic, group_values, state_key
from app.rules.expr import Compiled
from app.rules.loader import CompiledRule
from app.rules.logic.base import DictStore
from app.rules.spark_sql import SPARK_RULE_FIELDS, SparkExpr, UdfCall, to_spark_sql
from app.tables import TABLES, Tables
from app.topics import ALERTS
from jobs.compile import SparkPlan, native_where, unreproduced
from jobs.decode import source_struct
from jobs.state import HOLDS, OUTPUT_SCHEMA, with_native_condition
from jobs.streams import evaluator_streams
from jobs.transitions import OUTPUT_ARROW
from jobs.udfs import guarded
from jobs.windows import stream_of

logger = logging.getLogger(__name__)

#: the rule-model fields a native threshold rule may set (any other, set, keeps it where it was)
NATIVE_FIELDS = SPARK_RULE_FIELDS | {"clear", "enrich"}
#: the Spark types of registry columns, as ``Tables`` holds them (validated: str, float)
_TABLE_TYPES = {"string": StringType(), "double": DoubleType()}
#: where a row carries ``clear`` as Spark computed it (NUL: no schema field starts with it)
CLEARS = "\x00clears"


def _sql(rule: CompiledRule, text: str | None) -> SparkExpr | None:
    """``text`` as Spark SQL over the typed struct of the rule's fields, registry columns
    (``<as>.<column>``, a nested struct per join) included; None when Spark cannot express it."""
    if text is None or rule.parts is None:
        return None
    try:
        return to_spark_sql(text, rule.parts.fields, qualifier=f"__{rule.rule.source}")
    except ExpressionError:
        return None


def native_condition(rule: CompiledRule) -> SparkExpr | None:
    """The rule's ``where`` as Spark SQL (``native_where``, or over its registry columns)."""
    if not rule.rule.enrich:
        return native_where(rule)
    if rule.where is None or rule.where.synthetic:
        return None
    return _sql(rule, rule.rule.where)


def native_clear(rule: CompiledRule) -> SparkExpr | None:
    """The rule's ``clear`` as Spark SQL over the typed struct, or None."""
    return _sql(rule, rule.rule.clear)


def native_problem(rule: CompiledRule) -> str | None:
    """Why threshold rule ``rule`` cannot run natively in a Spark backtest, or None when it can."""
    r = rule.rule
    if r.kind != "threshold":
        return "only threshold rules run natively here"
    found = unreproduced(rule, NATIVE_FIELDS)
    if found is not None:
        return found
    parts = rule.parts
    if parts is None or parts.pct_changes or parts.baselines:
        return "pct_change() or baselines keep history per group"
    if native_condition(rule) is None:
        return "where is not expressible in Spark SQL"
    if r.clear is not None and (native_clear(rule) is None or parts.clear is None or parts.clear.synthetic):
        return "clear is not expressible in Spark SQL"
    types = rule.schema.all_fields()
    if any(types.get(g) != "string" for g in r.group_by):
        return "group_by on a non-string field"
    for spec in r.enrich:
        # the evaluator looks a row up by str(value): Spark's text of a number differs
        if types.get(spec.on) != "string":
            return f"enrich on the non-string field {spec.on}"
        table = TABLES[spec.table]
        if any(t not in _TABLE_TYPES for t in table.columns.values()):
            return f"enrich: table {spec.table} has columns of other types than string and double"
    return None


def native_rules(plan: SparkPlan) -> list[CompiledRule]:
    """The threshold rules of ``plan`` (keyed path or stream path) that can run natively."""
    rules = [r.rule for r in plan.rules] + list(plan.stream_rules)
    return [r for r in rules if native_problem(r) is None]


def without(plan: SparkPlan, rule_ids: frozenset[str]) -> SparkPlan:
    """``plan`` without the keyed-path rules ``rule_ids`` (they run natively)."""
    return dataclasses.replace(plan, rules=tuple(r for r in plan.rules if r.rule.id not in rule_ids))


def evaluation_order(rules: Sequence[CompiledRule]) -> dict[str, int]:
    """Each rule's place in the evaluator's per-event order (``rules`` in rule-set order):
    its source's streams in the evaluator's order, each stream's rules in turn."""
    ids = [rid for _, _, _, stream in evaluator_streams(rules) for rid in stream]
    return {rid: i for i, rid in enumerate(ids)}


def registry(decoded: DataFrame, tables: Tables, table: str, j: int) -> DataFrame:
    """The rows of registry ``table`` (static in a backtest), typed as ``Tables`` holds them:
    ``__k{j}`` (the key), ``__e{j}_<column>`` (the key column too)."""
    schema = TABLES[table]
    names = [schema.key, *schema.columns]
    types = {schema.key: "string", **schema.columns}
    struct = StructType(
        [StructField(f"__k{j}", StringType())]
        + [StructField(f"__e{j}_{c}", _TABLE_TYPES[types[c]]) for c in names]
    )
    rows = [(key, *(row.get(c) for c in names)) for key, row in sorted(tables.rows.get(table, {}).items())]
    return decoded.sparkSession.createDataFrame(rows, struct)


def _cohorts(rules: Sequence[CompiledRule]) -> list[list[CompiledRule]]:
    """``rules`` by (source, group_by): each cohort's groups are one partitioning of its events."""
    out: dict[tuple[str, tuple[str, ...]], list[CompiledRule]] = {}
    for r in rules:
        out.setdefault((r.rule.source, r.rule.group_by), []).append(r)
    return list(out.values())


def cohort_events(
    decoded: DataFrame, plan: SparkPlan, rules: Sequence[CompiledRule],
    stream_path: Mapping[str, frozenset[str]], tables: Tables,
) -> DataFrame:  # fmt: skip
    """The events of a cohort's source, one row each: ``__g`` (group values), ``__part``,
    ``__offset``, ``__ts_ms``, and per rule ``k`` of the cohort ``__s{k}`` (the rule sees the
    event: not on a stream key left to the stream path, not skipped for a missing registry
    row), ``__h{k}`` (holds) and ``__c{k}`` (clr).

    Each rule reads a struct of its own (``__q{k}``): the event's fields its conditions and
    groups read, and per join of ``enrich`` the registry row's columns as a struct named by
    its ``as`` (all NULL when the row is missing), looked up by ``str(value)`` of the ``on``
    field as the evaluator looks it up (a NULL is ``"None"``). One left join per distinct
    (table, on field), broadcast (the registry rows)."""
    source, group_by = rules[0].rule.source, rules[0].rule.group_by
    ev = decoded.where(F.col("__dlq").isNull() & (F.col("__source") == source))
    exprs = [(native_condition(r), native_clear(r)) for r in rules]
    event_fields = set(SCHEMAS[source].all_fields())
    fields = set(group_by) | {s.on for r in rules for s in r.rule.enrich}
    for where, clear in exprs:
        for e in (where, clear):
            fields |= (e.columns & event_fields) if e is not None else set()
    own = sorted(fields)
    ev = ev.withColumn("__ev", F.from_json(F.col("__fields"), source_struct(source, only=own)))
    joins: dict[tuple[str, str], int] = {}
    for r in rules:
        for spec in r.rule.enrich:
            if (spec.table, spec.on) not in joins:
                j = joins[(spec.table, spec.on)] = len(joins)
                reg = F.broadcast(registry(decoded, tables, spec.table, j))
                key = F.coalesce(F.col("__ev").getField(spec.on), F.lit("None"))
                ev = ev.join(reg, key == F.col(f"__k{j}"), "left")
    group = F.array(*(F.coalesce(F.col("__ev").getField(g), F.lit("")) for g in group_by))
    cols: list[Column] = [
        group.cast("array<string>").alias("__g"), F.col("__part"), F.col("__offset"), F.col("__ts_ms"),
    ]  # fmt: skip
    structs: list[Column] = []
    for k, r in enumerate(rules):
        parts = [F.col("__ev").getField(f).alias(f) for f in own]
        seen: Column = F.lit(True)
        for spec in r.rule.enrich:
            j, schema = joins[(spec.table, spec.on)], TABLES[spec.table]
            parts.append(
                F.struct(*(F.col(f"__e{j}_{c}").alias(c) for c in (schema.key, *schema.columns))).alias(
                    spec.as_
                )
            )
            if spec.missing == "skip":
                seen = seen & F.col(f"__k{j}").isNotNull()
        skip = stream_path.get(r.id, frozenset())
        if skip:
            seen = seen & ~F.col("__streams")[stream_of(plan, r).position].isin(sorted(skip))
        structs.append(F.struct(*parts).alias(f"__q{k}"))
        cols.append(seen.alias(f"__s{k}"))
    ev = ev.select(*cols, *structs)
    texts, calls = [], []
    for k, (where, clear) in enumerate(exprs):
        for e in (where, clear):
            texts.append(_qualified(rules[k], e.sql, k) if e is not None else "")
            calls += [_qualified_call(rules[k], c, k) for c in (e.calls if e is not None else ())]
    ev, texts = guarded(ev, texts, calls)  # the geo UDFs only where they can give a value
    out: list[Column] = [
        F.to_json("__g").alias("__gk"),
        *(F.col(c) for c in ("__g", "__part", "__offset", "__ts_ms")),
    ]
    for k, (where, clear) in enumerate(exprs):
        assert where is not None  # noqa: S101 - native_problem admits only these
        holds = F.coalesce(F.expr(texts[2 * k]), F.lit(False))
        clr = F.coalesce(F.expr(texts[2 * k + 1]), F.lit(False)) if clear is not None else ~holds
        out += [F.col(f"__s{k}"), (F.col(f"__s{k}") & holds).alias(f"__h{k}"), clr.alias(f"__c{k}")]
    return ev.select(*out)


def _qualified(rule: CompiledRule, sql: str, k: int) -> str:
    """``sql`` (over ``__<source>``) over the rule's own struct ``__q{k}``."""
    return sql.replace(f"`__{rule.rule.source}`.", f"`__q{k}`.")


def _qualified_call(rule: CompiledRule, call: UdfCall, k: int) -> UdfCall:
    args = tuple(_qualified(rule, a, k) for a in call.args)
    return UdfCall(_qualified(rule, call.sql, k), args, call.type)


def kept_rows(events: DataFrame, rules: Sequence[CompiledRule]) -> DataFrame:
    """The rows of :func:`cohort_events` that can change an alert (the module's steps 1 to 3),
    one per (rule, event) kept: ``__rule``, ``__g``, ``__part``, ``__offset``, ``__ts_ms``,
    ``__h``, ``__c``, ``__skipped`` (dropped ``holds`` TRUE rows since the group's previous
    kept row), ``__newest`` (the group's newest time before it, NULL for its first) and
    ``__late`` (on the group's first row, the count of its rows the rule takes that are late:
    dropped here, counted by the evaluator's ``stats.late``; 0 on the others).

    Every step is a window function over one order of the cohort's events per group
    ((partition, offset)): per rule, a row the rule does not take is passed over by
    conditional aggregates (``last(... ignorenulls)``, counts), never filtered out, so the
    events are sorted once whatever the number of rules. Within a segment the rows taken are
    in time order and their position grows, so once one meets ``consecutive`` and ``for``
    every later one does: a row comes after the fire point exactly when the row before it
    in the segment (position - 1, the group's newest time before it) meets them."""
    w = Window.partitionBy("__gk").orderBy("__part", "__offset")
    whole = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    order = F.struct("__part", "__offset")
    n = range(len(rules))
    base = ["__gk", "__g", "__part", "__offset", "__ts_ms"]
    hc = [c for k in n for c in (f"__h{k}", f"__c{k}")]

    def col(name: str, k: int) -> Column:
        return F.col(f"__{name}{k}")

    # 1. from the group's first TRUE on (the rows the rule takes: __st)
    ev = events.select(
        *base,
        *hc,
        *(F.col(f"__s{k}") for k in n),
        *(F.min(F.when(col("h", k), order)).over(whole).alias(f"__f{k}") for k in n),
    )
    ev = ev.select(*base, *hc, *((col("s", k) & (order >= col("f", k))).alias(f"__st{k}") for k in n))
    # 2. not late: at or above the newest time of the group's earlier rows taken (__n); __o: on time
    ev = ev.select(
        *base,
        *hc,
        *(F.col(f"__st{k}") for k in n),
        *(F.max(F.when(col("st", k), F.col("__ts_ms"))).over(before).alias(f"__n{k}") for k in n),
    )
    on = [
        F.coalesce(col("st", k) & (col("n", k).isNull() | (F.col("__ts_ms") >= col("n", k))), F.lit(False))
        for k in n
    ]
    # the group's late rows (taken, not on time), counted on its first row taken (no newest
    # time before it: always kept, below)
    late = [
        F.when(col("n", k).isNull() & on[k], F.count(F.when(col("st", k) & ~on[k], 1)).over(whole)) for k in n
    ]
    ev = ev.select(
        *base,
        *hc,
        *(col("n", k) for k in n),
        *(on[k].alias(f"__o{k}") for k in n),
        *(late[k].alias(f"__l{k}") for k in n),
    )
    # 3. segments of equal (holds, clr) among the on-time rows: __b, a segment's first row
    sig = [F.struct(col("h", k).alias("h"), col("c", k).alias("c")) for k in n]
    keep3 = [*hc, *(col("n", k) for k in n), *(col("o", k) for k in n), *(col("l", k) for k in n)]
    ev = ev.select(
        *base, *keep3,
        *(F.last(F.when(col("o", k), sig[k]), ignorenulls=True).over(before).alias(f"__p{k}") for k in n),
        *(F.count(F.when(col("o", k), 1)).over(upto).alias(f"__cnt{k}") for k in n),
        *(F.count(F.when(col("o", k) & col("h", k), 1)).over(upto).alias(f"__t{k}") for k in n),
    )  # fmt: skip
    starts = [col("o", k) & (col("p", k).isNull() | (col("p", k) != sig[k])) for k in n]
    keep4 = [*keep3, *(col("cnt", k) for k in n), *(col("t", k) for k in n)]
    ev = ev.select(*base, *keep4, *(starts[k].alias(f"__b{k}") for k in n))
    # the count and the time at the segment's first row
    ev = ev.select(
        *base, *keep4, *(col("b", k) for k in n),
        *(F.last(F.when(col("b", k), col("cnt", k)), True).over(upto).alias(f"__bc{k}") for k in n),
        *(F.last(F.when(col("b", k), F.col("__ts_ms")), True).over(upto).alias(f"__bt{k}") for k in n),
    )  # fmt: skip
    keep = []
    for k, r in enumerate(rules):
        position = col("cnt", k) - col("bc", k)  # from 0 at the segment's first row
        fired = (position >= r.rule.consecutive) & (col("n", k) - col("bt", k) >= r.rule.for_ms)
        h, c = col("h", k), col("c", k)
        keep.append(col("o", k) & (col("b", k) | (h & c) | (h & ~fired)))
    ev = ev.select(
        *base,
        *hc,
        *(col("n", k) for k in n),
        *(col("t", k) for k in n),
        *(col("l", k) for k in n),
        *(keep[k].alias(f"__kp{k}") for k in n),
    )
    ev = ev.select(
        "*",
        *(
            F.last(F.when(col("kp", k), col("t", k)), ignorenulls=True).over(before).alias(f"__kt{k}")
            for k in n
        ),
    )
    kept = []
    for k, r in enumerate(rules):
        skipped = col("t", k) - col("h", k).cast("long") - F.coalesce(col("kt", k), F.lit(0))
        row = F.struct(
            F.lit(r.id).alias("__rule"), col("h", k).alias("__h"), col("c", k).alias("__c"),
            skipped.cast("long").alias("__skipped"), col("n", k).alias("__newest"),
            F.coalesce(col("l", k), F.lit(0)).cast("long").alias("__late"),
        )  # fmt: skip
        kept.append(F.when(col("kp", k), row))
    rows = ev.select(*base[1:], F.explode(F.filter(F.array(*kept), lambda x: x.isNotNull())).alias("__k"))
    return rows.select(
        "__k.__rule",
        "__g",
        "__part",
        "__offset",
        "__ts_ms",
        "__k.__h",
        "__k.__c",
        "__k.__skipped",
        "__k.__newest",
        "__k.__late",
    )


def _clears(row: Any) -> Any:
    return row.get(CLEARS)


def with_native_clear(rule: CompiledRule) -> CompiledRule:
    """``rule`` whose ``where`` and ``clear`` read the values Spark computed into the row."""
    rule = with_native_condition(rule)
    parts = rule.parts
    if parts is None or parts.clear is None:
        return rule
    c = parts.clear
    stand_in = Compiled(fn=_clears, type="boolean", text=c.text, columns=c.columns)
    return dataclasses.replace(rule, parts=dataclasses.replace(parts, clear=stand_in))


class ThresholdStep:
    """Picklable ``mapInArrow`` function: a shuffle partition's kept rows (whole groups)
    through the evaluator's ``ThresholdLogic``; output rows of ``jobs.state.OUTPUT_SCHEMA``."""

    def __init__(self, rules: Sequence[CompiledRule], idx: Mapping[str, int], tables: Tables) -> None:
        self.rules = {r.id: r for r in rules}
        self.idx = dict(idx)
        #: the registry rows, for the rules with ``enrich`` (only theirs: the rest is not shipped)
        self.tables = tables if any(r.rule.enrich for r in rules) else Tables()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = [r for b in batches for r in b.to_pylist()]
        if not rows:
            return
        rows.sort(key=lambda r: (r["__rule"], r["__g"], r["__part"], r["__offset"]))
        prepared: dict[str, tuple[CompiledRule, ThresholdLogic]] = {}
        out: list[tuple[Any, ...]] = []
        for (rid, _), members in groupby(rows, key=lambda r: (r["__rule"], tuple(r["__g"]))):
            if rid not in prepared:
                rule = with_native_clear(self.rules[rid])
                prepared[rid] = (rule, ThresholdLogic(rule))
            rule, logic = prepared[rid]
            out += self.run_group(rule, logic, list(members))
        if out:
            yield pa.RecordBatch.from_arrays(
                [pa.array([o[i] for o in out], OUTPUT_ARROW.field(i).type) for i in range(len(OUTPUT_ARROW))],
                schema=OUTPUT_ARROW,
            )

    def run_group(
        self,
        rule: CompiledRule,
        logic: ThresholdLogic,
        rows: list[dict[str, Any]],
        store: DictStore | None = None,
    ) -> list[tuple[Any, ...]]:
        """One group's kept rows, in order, through ``logic`` (``rule`` as :func:`with_native_clear`
        makes it), its state in ``store`` (a new one by default): its output rows."""
        store = store if store is not None else DictStore()
        idx, key_field = self.idx[rule.id], SCHEMAS[rule.rule.source].key
        out: list[tuple[Any, ...]] = []
        key, dropped = "", 0
        # the evaluator's own join (composed), for rules with enrich: the row its logic reads
        joiner = StreamEvaluator("native", [rule], DictStore(), self.tables) if rule.rule.enrich else None
        joins = joiner.joins(rule) if joiner is not None else []
        cache: dict[tuple[str, str], dict | None] = {}
        for r in rows:
            fields = orjson.loads(r["__fields"])
            row = fields if joiner is None else joiner.join(joins, fields, cache)
            if row is None:  # pragma: no cover - the native join dropped these events
                msg = f"rule {rule.id}: a kept row has no registry row"
                raise RuntimeError(msg)
            group = group_values(rule, row)
            key = key or state_key(rule, group)
            st = store.get(key)
            if st is not None:  # the dropped rows' effect: the firing streak's count, the newest time
                st["streak"] += r["__skipped"]
                if r["__newest"] is not None and r["__newest"] > st["last_event"]:
                    st["last_event"] = r["__newest"]
            dropped += r.get("__late") or 0
            row[HOLDS], row[CLEARS] = r["__h"], r["__c"]
            ev = Event(str(fields.get(key_field)), r["__ts_ms"], fields)
            alerts, late = logic.on_event(store, key, group, ev, row)
            if late:  # pragma: no cover - kept_rows drops every late row
                msg = f"rule {rule.id}: a kept row was late at {r['__ts_ms']}"
                raise RuntimeError(msg)
            for a in alerts:
                body = a.to_json().decode()
                out.append(
                    ("alert", ALERTS, a.fingerprint, body, r["__part"], r["__offset"], idx, a.rule_id,
                     a.status, a.alert_id)
                )  # fmt: skip
        if dropped:  # the group's late events, which kept_rows dropped: counted as the evaluator does
            out.append(("late", None, None, str(dropped), None, None, idx, rule.id, None, None))
        return out


def native_output(
    decoded: DataFrame, plan: SparkPlan, rules: Sequence[CompiledRule],
    stream_path: Mapping[str, frozenset[str]], idx: Mapping[str, int], tables: Tables | None = None,
) -> DataFrame | None:  # fmt: skip
    """The output rows (``jobs.state.OUTPUT_SCHEMA``) of every rule of ``rules``, each on the
    stream keys ``stream_path`` does not leave to the stream path; ``idx``: per rule, its
    output rows' ``idx``; ``tables``: the backtest's registry rows (static)."""
    if not rules:
        return None
    tables = tables or Tables()
    partitions = int(decoded.sparkSession.conf.get("spark.sql.shuffle.partitions") or "2")
    kept: DataFrame | None = None
    for cohort in _cohorts(rules):
        events = cohort_events(decoded, plan, cohort, stream_path, tables).repartition(partitions, "__gk")
        mine = kept_rows(events, cohort)
        kept = mine if kept is None else kept.unionByName(mine)
    assert kept is not None  # noqa: S101
    # the kept rows are few: their fields are joined back (not carried through the sort)
    fields = decoded.where(F.col("__dlq").isNull()).select("__part", "__offset", "__fields")
    rows = kept.join(fields, ["__part", "__offset"]).repartition(partitions, "__rule", "__g")
    return rows.mapInArrow(ThresholdStep(rules, idx, tables), OUTPUT_SCHEMA)
