"""Absence rules natively in a Spark backtest: the gaps in the JVM, the evaluator's
``AbsenceLogic`` only on the events around the silences that can fire.

What :class:`app.rules.logic.events.AbsenceLogic` does per event is decided, in a backtest
where the whole input is known, by a few window functions over each group's events
(those its ``where`` takes, in (partition, offset) order, on the rule's stream partition):

* **the newest time** ``L`` after each event: a running ``max`` of the group's event times
  (an older event moves nothing; a resolving one sets ``max(ts, last)``: the same). With
  ``expect_from``, a registry key Kafka's partitioner puts on a stream partition starts
  its wait at that partition's first event, at its clock (``StreamEvaluator``'s
  ``_expect_registry``): a *seed* row there, before the event, whose time is that clock.
* **the silence deadline** after each row: ``L + absent_for + allowed_lateness + 1``
  (``AbsenceLogic._due``). The partition's timers run at every event of the stream
  partition, before and after the rule's ``on_event``, at the partition's clock (a running
  ``max``, ``jobs.windows.clocked``). So the gap after row ``i`` *can fire* exactly when the
  clock reaches the deadline by the group's next row (its clock then), or by the partition's
  final clock when there is none; at row ``i`` itself when its own clock is already there
  (an event late by more than the silence: the timer set by ``on_event`` runs at once).
  Where it fires: the first event of the partition whose clock reaches the deadline
  (an as-of lookup on the partition's clock, ``jobs.windows.at_clock``).
* whether a gap that can fire does depends on the group's state: not while it is already
  firing. A firing group is resolved by its next event at or after the silence's start
  (``L + absent_for``). When every gap that can fire is followed by such an event, or by
  none, the group is never firing at a gap, and only the rows around those gaps can change
  an alert: the row before each (its newest time) and the one after (the resolution). The
  rest only move the newest time, which each kept row carries (``__lb``: the group's newest
  time before it). A group where some event after such a gap does not resolve it (it is
  older than the silence's start: a backlog arriving behind the clock) keeps every row.

The kept rows of each group then go, in order, through the evaluator's own ``AbsenceLogic``
(composed: it may be compiled): ``expect`` for a seed, ``on_event`` for an event, ``on_timer``
at each gap that can fire, in one Python call per shuffle partition (:class:`AbsenceStep`).
Each transition is an output row at its own event, in the evaluator's order there
(:func:`native_output`), ``idx`` from ``IDX_BASE`` on.

What is decided per stream partition (``jobs.windows.native_partitions``): with the event-time
bound on (``APP_MAX_EVENT_SKEW``), a partition where the bound would hold an event leaves the
rule to the evaluator there; where none is held, the bound admits every event as it comes,
at the running maximum, which is what is computed here.

What stays on the stream path (:func:`native_problem` says why): a ``where`` Spark SQL cannot
express, ``group_by`` on a non-string field, ``enrich``, and any rule-model field this module
does not reproduce.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import groupby
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from app.events import SCHEMAS, Event
from app.placement import partition_for
from app.rules.loader import CompiledRule
from app.rules.logic.base import DictStore, state_key
from app.rules.logic.events import AbsenceLogic
from app.rules.spark_sql import SPARK_RULE_FIELDS
from app.tables import Tables
from app.topics import ALERTS
from jobs.compile import SparkPlan, native_where
from jobs.decode import source_struct
from jobs.state import HOLDS, OUTPUT_SCHEMA, with_native_condition
from jobs.streams import IDX_BASE, stream_key
from jobs.windows import at_clock, clocked, stream_of, taken

#: the rule-model fields a native absence rule may set (any other, set, keeps it where it was)
NATIVE_FIELDS = (SPARK_RULE_FIELDS - {"for_ms", "consecutive"}) | {
    "absent_for",
    "allowed_lateness",
    "expect_from",
}
#: the Python step's output: the output rows (``idx`` set after) and their place at their
#: event (the phase, the timer's due, the state key, the group's sequence, the rule's place)
_STEP = pa.schema(
    [
        ("kind", pa.string()),
        ("topic", pa.string()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("part", pa.int32()),
        ("offset", pa.int64()),
        ("idx", pa.int32()),
        ("rule", pa.string()),
        ("status", pa.string()),
        ("alert_id", pa.string()),
        ("__ph", pa.int32()),
        ("__due", pa.int64()),
        ("__key", pa.string()),
        ("__seq", pa.int32()),
        ("__r", pa.int32()),
    ]
)
_STEP_DDL = f"{OUTPUT_SCHEMA}, __ph int, __due bigint, __key string, __seq int, __r int"
_OUTPUT_COLUMNS = [c.strip().split(" ")[0] for c in OUTPUT_SCHEMA.split(",")]
_SEED, _EVENT = 0, 1  # a row's __o: at one (partition, offset), the seed comes before the event
_BEFORE, _ON_EVENT, _AFTER = 0, 1, 2  # a transition's phase at its event (see native_output)


def native_problem(rule: CompiledRule) -> str | None:
    """Why absence rule ``rule`` cannot run natively in a Spark backtest, or None when it can."""
    r = rule.rule
    if r.kind != "absence":
        return "only absence rules run natively here"
    for name, info in type(r).model_fields.items():
        if name not in NATIVE_FIELDS and getattr(r, name) != info.get_default(call_default_factory=True):
            return f"'{info.alias or name}' is not reproduced natively"
    if r.where is not None and native_where(rule) is None:
        return "where is not expressible in Spark SQL"
    types = rule.schema.all_fields()
    if any(types.get(g) != "string" for g in r.group_by):
        return "group_by on a non-string field"
    return None


def native_rules(plan: SparkPlan) -> list[CompiledRule]:
    """The stream-path absence rules of ``plan`` that can run natively."""
    return [r for r in plan.stream_rules if native_problem(r) is None]


def seeds(
    ev: DataFrame, plan: SparkPlan, rule: CompiledRule, tables: Tables, partitions: int
) -> DataFrame | None:
    """``expect_from``: one seed row per registry key on each stream partition with events (of
    ``ev``, :func:`jobs.windows.clocked`), at that partition's first event and clock."""
    table = rule.rule.expect_from
    if table is None:
        return None
    name = stream_of(plan, rule).name
    keys = [(stream_key(name, partition_for(k.encode(), partitions)), k) for k in tables.keys(table)]
    schema = StructType([StructField("__sk", StringType()), StructField("__dev", StringType())])
    registry = ev.sparkSession.createDataFrame(keys, schema)
    first = ev.groupBy("__sk").agg(F.min(F.struct("__part", "__offset", "__clock")).alias("__f"))
    return (
        F.broadcast(registry)
        .join(first, "__sk")
        .select(
            "__sk",
            F.array(F.col("__dev")).alias("__g"),
            F.col("__f.__part").alias("__part"),
            F.col("__f.__offset").alias("__offset"),
            F.lit(_SEED).alias("__o"),
            F.col("__f.__clock").alias("__ts_ms"),
            F.col("__f.__clock").alias("__clock"),
        )
    )


def gap_rows(
    decoded: DataFrame, plan: SparkPlan, rule: CompiledRule, skip: frozenset[str], tables: Tables,
    partitions: int,
) -> DataFrame:  # fmt: skip
    """The rows of ``rule``'s groups that can change an alert (see the module), on stream keys
    not in ``skip``: ``__sk``, ``__g``, ``__part``, ``__offset``, ``__o`` (seed or event),
    ``__ts_ms``, ``__lb`` (the group's newest time before the row), ``__cap`` (the gap after
    it can fire) and ``__at`` (where: the event and its clock; NULL when it cannot)."""
    r = rule.rule
    ev = clocked(decoded, stream_of(plan, rule))
    if skip:
        ev = ev.where(~F.col("__sk").isin(sorted(skip)))
    final = ev.groupBy("__sk").agg(F.max("__clock").alias("__final"))
    mine = taken(ev, rule).withColumn(
        "__q", F.from_json(F.col("__fields"), source_struct(r.source, only=set(r.group_by)))
    )
    group = F.array(*(F.coalesce(F.col("__q").getField(g), F.lit("")) for g in r.group_by))
    rows = mine.select(
        "__sk", group.cast("array<string>").alias("__g"), "__part", "__offset",
        F.lit(_EVENT).alias("__o"), "__ts_ms", "__clock",
    )  # fmt: skip
    seeded = seeds(ev, plan, rule, tables, partitions)
    if seeded is not None:
        rows = rows.unionByName(seeded)
    w = Window.partitionBy("__sk", "__g").orderBy("__part", "__offset", "__o")
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    whole = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    absent = int(r.absent_for or 0)
    rows = rows.join(F.broadcast(final), "__sk").select(
        "*",
        F.max("__ts_ms").over(before).alias("__lb"),
        F.max("__ts_ms").over(upto).alias("__l"),
        F.lead(F.struct("__clock", "__ts_ms")).over(w).alias("__next"),
    )
    due = F.col("__l") + (absent + r.allowed_lateness + 1)
    reached = F.coalesce(F.col("__next.__clock"), F.col("__final")) >= due
    rows = rows.select(
        "*",
        due.alias("__due"),
        (F.col("__clock") >= due).alias("__imm"),
        ((F.col("__clock") >= due) | reached).alias("__cap"),
    )
    # a gap that can fire, followed by an event older than the silence's start: keep the group
    stays = F.col("__cap") & F.col("__next").isNotNull() & (F.col("__next.__ts_ms") < F.col("__l") + absent)
    rows = rows.select(
        "*",
        F.max(stays.cast("int")).over(whole).alias("__irr"),
        F.coalesce(F.lag("__cap").over(w), F.lit(False)).alias("__after"),
    )
    kept = rows.where((F.col("__irr") == 1) | F.col("__cap") | F.col("__after"))
    cols = ["__sk", "__g", "__part", "__offset", "__o", "__ts_ms", "__lb", "__cap"]
    here = F.struct(F.col("__part"), F.col("__offset"), F.col("__clock"))
    at_once = kept.where(~F.col("__cap") | F.col("__imm")).select(
        *cols, F.when(F.col("__cap"), here).alias("__at")
    )
    later = at_clock(ev, kept.where(F.col("__cap") & ~F.col("__imm")).select(*cols, "__due"), "__due")
    return at_once.unionByName(later.select(*cols, "__at"))


class AbsenceStep:
    """Picklable ``mapInArrow`` function: a shuffle partition's kept rows (whole groups)
    through the evaluator's ``AbsenceLogic``; rows of :data:`_STEP`."""

    def __init__(self, rules: Sequence[CompiledRule], order: Mapping[str, int]) -> None:
        self.rules = {r.id: r for r in rules}
        self.order = dict(order)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = [r for b in batches for r in b.to_pylist()]
        if not rows:
            return
        rows.sort(key=lambda r: (r["__rule"], r["__sk"], r["__g"], r["__part"], r["__offset"], r["__o"]))
        logics: dict[str, tuple[CompiledRule, AbsenceLogic]] = {}
        out: list[tuple[Any, ...]] = []
        whose = lambda r: (r["__rule"], r["__sk"], tuple(r["__g"]))  # noqa: E731
        for (rid, _, group), members in groupby(rows, key=whose):
            if rid not in logics:
                rule = self.rules[rid]
                rule = with_native_condition(rule) if rule.where is not None else rule
                logics[rid] = (rule, AbsenceLogic(rule))
            rule, logic = logics[rid]
            out += [(*o, self.order[rid]) for o in run_group(rule, logic, group, list(members))]
        if out:
            yield pa.RecordBatch.from_arrays(
                [pa.array([o[i] for o in out], _STEP.field(i).type) for i in range(len(_STEP))], schema=_STEP
            )


def run_group(
    rule: CompiledRule, logic: AbsenceLogic, group: tuple[str, ...], rows: Sequence[Mapping[str, Any]]
) -> list[tuple[Any, ...]]:
    """One group's kept rows (of :func:`gap_rows`, fields joined: ``__fields``), in order,
    through ``logic`` (``rule`` reading the condition Spark computed): its transitions as
    rows of :data:`_STEP` without the rule's place (the last column)."""
    store = DictStore()
    key = state_key(rule, group)
    key_field = SCHEMAS[rule.rule.source].key
    out: list[tuple[Any, ...]] = []

    def emit(alerts: list[Any], part: int, offset: int, phase: int, due: int) -> None:
        for a in alerts:
            out.append(
                ("alert", ALERTS, a.fingerprint, a.to_json().decode(), part, offset, 0, a.rule_id, a.status,
                 a.alert_id, phase, due, key, len(out))
            )  # fmt: skip

    for r in rows:
        if r["__o"] == _SEED:
            logic.expect(store, key, group, r["__ts_ms"])
        else:
            st, newest = store.get(key), r["__lb"]
            if newest is not None and (st is None or newest > st["last_event"]):
                # the rows dropped before this one: each moved the newest time, nothing else
                firing = None if st is None else st["firing_since"]
                due = None if firing is not None else logic._due(newest)  # noqa: SLF001
                store.put(
                    key, {"group": list(group), "last_event": newest, "firing_since": firing, "due": due}
                )
            fields = orjson.loads(r["__fields"])
            row = {**fields, HOLDS: True}
            event = Event(str(fields.get(key_field)), r["__ts_ms"], fields)
            alerts, _ = logic.on_event(store, key, group, event, row)
            emit(alerts, r["__part"], r["__offset"], _ON_EVENT, 0)
        at, st = r["__at"], store.get(key)
        if r["__cap"] and at is not None and st is not None:
            due = logic._due(st["last_event"])  # noqa: SLF001 - the timer's due, its place in the heap
            here = r["__o"] == _EVENT and (at["__part"], at["__offset"]) == (r["__part"], r["__offset"])
            phase = _AFTER if here else _BEFORE
            emit(logic.on_timer(store, key, at["__clock"]), at["__part"], at["__offset"], phase, due)
    return out


def native_output(
    decoded: DataFrame, plan: SparkPlan, rules: Sequence[CompiledRule],
    stream_path: Mapping[str, frozenset[str]], tables: Tables | None, partitions: int,
    order: Mapping[str, int],
) -> DataFrame | None:  # fmt: skip
    """The output rows (``jobs.state.OUTPUT_SCHEMA``) of every rule of ``rules``, each on the
    stream keys ``stream_path`` does not leave to the stream path; ``tables``: the backtest's
    registry rows (static); ``partitions``: the emulated partition count; ``order``: each
    rule's place in the evaluator's per-event order.

    At one event the rows come in the evaluator's order: rule by rule, each rule's timers
    due at the clock (by due time, then state key: its timer heap), then its ``on_event``,
    then the timer that ``on_event`` made due at once."""
    if not rules:
        return None
    tables = tables or Tables()
    shuffle = int(decoded.sparkSession.conf.get("spark.sql.shuffle.partitions") or "2")
    kept: DataFrame | None = None
    for rule in rules:
        mine = gap_rows(decoded, plan, rule, stream_path.get(rule.id, frozenset()), tables, partitions)
        mine = mine.withColumn("__rule", F.lit(rule.id))
        kept = mine if kept is None else kept.unionByName(mine)
    assert kept is not None  # noqa: S101
    # the kept rows are few: their fields are joined back (not carried through the sorts)
    fields = decoded.where(F.col("__dlq").isNull()).select("__part", "__offset", "__fields")
    rows = kept.join(fields, ["__part", "__offset"], "left").repartition(shuffle, "__rule", "__sk", "__g")
    stepped = rows.mapInArrow(AbsenceStep(rules, order), _STEP_DDL)
    at_event = Window.partitionBy("part", "offset").orderBy("__r", "__ph", "__due", "__key", "__seq")
    idx = F.lit(IDX_BASE) + F.row_number().over(at_event) - 1
    return stepped.withColumn("idx", idx.cast("int")).select(*_OUTPUT_COLUMNS)
