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
(``jobs.transitions``).

What is decided per stream partition (``jobs.windows.native_partitions``): with the event-time
bound on (``APP_MAX_EVENT_SKEW``), a partition where the bound would hold an event leaves the
rule to the evaluator there; where none is held, the bound admits every event as it comes,
at the running maximum, which is what is computed here.

What stays on the stream path (:func:`native_problem` says why): a ``where`` Spark SQL cannot
express, ``group_by`` on a non-string field, ``enrich``, and any rule-model field this module
does not reproduce.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from app.events import SCHEMAS, Event
from app.placement import partition_for
from app.rules.loader import CompiledRule
from app.rules.logic.base import DictStore, state_key
from app.rules.logic.events import AbsenceLogic
from app.tables import Tables
from jobs.compile import SparkPlan
from jobs.decode import source_struct
from jobs.state import HOLDS, with_native_condition
from jobs.streams import stream_key
from jobs.transitions import (
    AFTER,
    BEFORE,
    EVENT_ALERT_FIELDS,
    ON_EVENT,
    GroupStep,
    Transitions,
    common_problem,
    placed,
    stepped,
)
from jobs.windows import at_clock, clocked, stream_of, taken

#: the rule-model fields a native absence rule may set (any other, set, keeps it where it was)
NATIVE_FIELDS = EVENT_ALERT_FIELDS | {
    "absent_for",
    "allowed_lateness",
    "expect_from",
}
_SEED, _EVENT = 0, 1  # a row's __o: at one (partition, offset), the seed comes before the event


def native_problem(rule: CompiledRule) -> str | None:
    """Why absence rule ``rule`` cannot run natively in a Spark backtest, or None when it can."""
    return common_problem(rule, "absence", NATIVE_FIELDS)


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
    ev = clocked(decoded, stream_of(plan, rule), skip=skip)
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


def run_group(rule: CompiledRule, group: tuple[str, ...], sk: str, rows: list[dict[str, Any]]) -> Transitions:
    """One group's kept rows (of :func:`gap_rows`, fields joined: ``__fields``), in order,
    through the evaluator's ``AbsenceLogic`` (reading the condition Spark computed)."""
    rule = with_native_condition(rule) if rule.where is not None else rule
    logic = AbsenceLogic(rule)
    store = DictStore()
    key = state_key(rule, group)
    key_field = SCHEMAS[rule.rule.source].key
    out = Transitions(sk, key)
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
            out.add(alerts, r["__part"], r["__offset"], ON_EVENT, 0)
        at, st = r["__at"], store.get(key)
        if r["__cap"] and at is not None and st is not None:
            due = logic._due(st["last_event"])  # noqa: SLF001 - the timer's due, its place in the heap
            here = r["__o"] == _EVENT and (at["__part"], at["__offset"]) == (r["__part"], r["__offset"])
            out.add(
                logic.on_timer(store, key, at["__clock"]),
                at["__part"],
                at["__offset"],
                AFTER if here else BEFORE,
                due,
            )
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

    Each row carries its place among its event's rows (``jobs.transitions.AT_EVENT``)."""
    if not rules:
        return None
    tables = tables or Tables()
    kept: DataFrame | None = None
    for rule in rules:
        mine = gap_rows(decoded, plan, rule, stream_path.get(rule.id, frozenset()), tables, partitions)
        mine = mine.withColumn("__rule", F.lit(rule.id))
        kept = mine if kept is None else kept.unionByName(mine)
    assert kept is not None  # noqa: S101
    return placed(stepped(decoded, kept, GroupStep(rules, order, run_group)))
