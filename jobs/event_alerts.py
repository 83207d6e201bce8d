"""Event-alert rules (new term, change) natively in a Spark backtest: which events trigger an
alert in the JVM, the evaluator's alert lifecycle only on those.

**New terms.** What :class:`app.rules.logic.events.NewTermLogic` decides per event is, in a
backtest where the whole input is known, a pair of window functions over the events its
``where`` takes with a non-NULL field (others create no state), in the order the evaluator
takes a group's events (partition, offset), on the rule's stream partition:

* **the group's first event** time (``first_event``): the first ``horizon`` after it only
  learns;
* **the term's last sighting** (``seen``): the newest time of the group's earlier events with
  the same term (``str(value)``). Order-insensitive, as the evaluator keeps the newest.

An event *triggers* when it is past the learning period and its term was never seen or not
within ``horizon`` of it.

**Change.** :class:`app.rules.logic.events.ChangeLogic` skips a group's *late* events (older
than the newest of its earlier ones with a value: a running ``max``; events without a value,
or that its ``where`` does not take, touch nothing the alerts read) and triggers on an
on-time event whose value differs from the previous on-time event's (``last(...
ignorenulls)`` over the earlier on-time rows).

Neither depends on alert state, so only the triggers go to Python, where the evaluator's own
one-shot lifecycle (the logic's ``oneshot``: a trigger fires a quiet group and extends a
firing one, which resolves ``resolve_after`` after its last trigger) runs on them with the
partition's clock at each (:func:`run_group`). A resolution is placed at
the first event of the stream partition whose clock reaches it (``jobs.windows.at_clock``), or
at the trigger itself when its own clock is already past (a trigger late by more than
``resolve_after``: the evaluator's timer runs right after it).

**Pruning** (new terms). The evaluator forgets the terms older than ``horizon`` each time a group's term
count reaches a multiple of 1,000. An event arriving out of order may then find its term
forgotten where it would otherwise have found it within the horizon. So a group with 1,000
distinct terms or more keeps every event, and the evaluator's ``on_event`` runs on them all.

What stays on the stream path (:func:`native_problem` says why): a ``where`` Spark SQL cannot
express, ``group_by`` on a non-string field, a term or changing field that is not a string or
an integer (Spark's text of a double differs from Python's ``str``; Python's ``1 == 1.0``),
``late_policy: side`` (change: the late copies), ``order: event_time``, ``enrich`` and any
rule-model field this module does not reproduce.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from app.events import SCHEMAS, Event
from app.rules.loader import CompiledRule
from app.rules.logic.base import DictStore, state_key
from app.rules.logic.events import ChangeLogic, NewTermLogic
from jobs.compile import SparkPlan
from jobs.decode import source_struct
from jobs.state import HOLDS, with_native_condition
from jobs.transitions import (
    AFTER,
    BEFORE,
    EVENT_ALERT_FIELDS,
    ON_EVENT,
    GroupStep,
    Transitions,
    common_problem,
    late_count,
    placed,
    stepped,
)
from jobs.windows import at_clock, clocked, stream_of, taken

#: per kind, the rule-model fields a native rule may set (any other, set, keeps it where it was)
NATIVE_FIELDS = {
    "new_term": EVENT_ALERT_FIELDS | {"new_term", "resolve_after"},
    "change": EVENT_ALERT_FIELDS | {"change", "resolve_after"},
}
#: NewTermLogic prunes a group's terms when their count reaches a multiple of this
PRUNE_EVERY = 1000
_VALUE_TYPES = frozenset({"string", "long"})


def native_problem(rule: CompiledRule) -> str | None:
    """Why event-alert rule ``rule`` cannot run natively in a Spark backtest, or None when it can."""
    r = rule.rule
    kind = r.kind if r.kind in NATIVE_FIELDS else "new_term"
    found = common_problem(rule, kind, NATIVE_FIELDS[kind])
    if found is not None:
        return found
    field = _field(rule)
    kind_of = rule.schema.all_fields().get(field)
    if kind_of not in _VALUE_TYPES:
        what = "term" if kind == "new_term" else "changing"
        return f"a {what} field of type {kind_of} (Spark's text of it differs)"
    return None


def _field(rule: CompiledRule) -> str:
    r = rule.rule
    return r.new_term.field if r.new_term is not None else str(r.change)


def native_rules(plan: SparkPlan) -> list[CompiledRule]:
    """The stream-path new-term and change rules of ``plan`` that can run natively."""
    return [r for r in plan.stream_rules if native_problem(r) is None]


def valued_rows(ev: DataFrame, rule: CompiledRule) -> DataFrame:
    """The rows of ``ev`` (:func:`jobs.windows.clocked`) that ``rule``'s ``where`` takes:
    ``__sk``, ``__g``, ``__part``, ``__offset``, ``__ts_ms``, ``__clock`` and ``__v`` (the
    term's or changing field's value, NULL where the event has none), marked: ``__late``
    (change: older than the newest of its group's earlier rows with a value) and, among those
    with a value, ``__trig`` (it triggers), ``__all`` (the group keeps every row) and
    ``__prev`` (change: the previous on-time value)."""
    r = rule.rule
    field = _field(rule)
    parsed = F.from_json(F.col("__fields"), source_struct(r.source, only={*r.group_by, field}))
    mine = taken(ev, rule).withColumn("__q", parsed)
    group = F.array(*(F.coalesce(F.col("__q").getField(g), F.lit("")) for g in r.group_by))
    rows = mine.select(
        "__sk", group.cast("array<string>").alias("__g"), "__part", "__offset", "__ts_ms", "__clock",
        F.col("__q").getField(field).alias("__v"),
    )  # fmt: skip
    if r.new_term is None:
        return _changes(rows)
    # a new term's events without a value touch nothing, and none is ever late
    terms = _new_terms(rows.where(F.col("__v").isNotNull()), r.new_term.horizon)
    return terms.withColumn("__late", F.lit(False))


def trigger_rows(rows: DataFrame, ev: DataFrame) -> DataFrame:
    """The rows of :func:`valued_rows` the Python step needs (see the module), with
    ``__final`` (the partition's final clock, from ``ev``) and ``__o``."""
    final = ev.groupBy("__sk").agg(F.max("__clock").alias("__final"))
    kept = rows.where(F.col("__trig") | F.col("__all")).join(F.broadcast(final), "__sk")
    cols = ["__sk", "__g", "__part", "__offset", "__ts_ms", "__clock", "__final", "__trig", "__all", "__prev"]
    return kept.select(*cols, F.lit(1).alias("__o"))


def _new_terms(rows: DataFrame, horizon: int) -> DataFrame:
    """``__trig``: a new term; ``__all``: the group has ``PRUNE_EVERY`` terms or more."""
    rows = rows.withColumn("__term", F.col("__v").cast("string"))
    by_term = Window.partitionBy("__sk", "__g", "__term").orderBy("__part", "__offset")
    rows = rows.select(
        "*",
        F.max("__ts_ms").over(by_term.rowsBetween(Window.unboundedPreceding, -1)).alias("__seen"),
        (F.row_number().over(by_term) == 1).cast("int").alias("__new"),
    )
    by_group = Window.partitionBy("__sk", "__g").orderBy("__part", "__offset")
    upto = by_group.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    whole = by_group.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    rows = rows.select(
        "*", F.first("__ts_ms").over(upto).alias("__first"), F.sum("__new").over(whole).alias("__n")
    )
    learnt = F.col("__ts_ms") >= F.col("__first") + horizon
    fresh = F.col("__seen").isNull() | (F.col("__ts_ms") - F.col("__seen") > horizon)
    return rows.select(
        "*",
        (learnt & fresh).alias("__trig"),
        (F.col("__n") >= PRUNE_EVERY).alias("__all"),
        F.lit(None).cast("string").alias("__prev"),
    )


def _changes(rows: DataFrame) -> DataFrame:
    """``__late``: older than the newest of the group's earlier rows with a value, as
    ``ChangeLogic`` decides before it reads the value; ``__trig``: an on-time value other than
    the previous on-time one (``__prev``)."""
    w = Window.partitionBy("__sk", "__g").orderBy("__part", "__offset")
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    valued = F.col("__v").isNotNull()
    newest = F.max(F.when(valued, F.col("__ts_ms"))).over(before)
    rows = rows.withColumn("__late", F.coalesce(F.col("__ts_ms") < newest, F.lit(False)))
    on = valued & ~F.col("__late")
    previous = F.last(F.when(on, F.col("__v")), ignorenulls=True).over(before)
    rows = rows.withColumn("__prev", previous)
    trig = on & F.col("__prev").isNotNull() & (F.col("__prev") != F.col("__v"))
    return rows.select("*", trig.alias("__trig"), F.lit(False).alias("__all"))


def run_group(rule: CompiledRule, group: tuple[str, ...], sk: str, rows: list[dict[str, Any]]) -> Transitions:
    """One group's rows (of :func:`trigger_rows`, fields joined: ``__fields``), in order, through
    the evaluator's ``NewTermLogic`` or ``ChangeLogic``: its one-shot lifecycle on the triggers,
    or ``on_event`` on every row of a group that keeps them all; its timer at each row's clock."""
    rule = with_native_condition(rule) if rule.where is not None else rule
    logic = NewTermLogic(rule) if rule.rule.new_term is not None else ChangeLogic(rule)
    field = _field(rule)
    store = DictStore()
    key = state_key(rule, group)
    key_field = SCHEMAS[rule.rule.source].key
    out = Transitions(sk, key)

    def expire(clock: int, part: int | None, offset: int | None, phase: int) -> None:
        st = store.get(key)
        if st is not None and st.get("firing_since") is not None and clock >= st["resolves_at"]:
            due = st["resolves_at"]
            out.add(logic.on_timer(store, key, clock), part, offset, phase, due)

    for r in rows:
        clock = r["__clock"]
        expire(clock, None, None, BEFORE)  # at the first event whose clock reached it: placed later
        fields = orjson.loads(r["__fields"])
        ts = r["__ts_ms"]
        if r["__all"]:
            event = Event(str(fields.get(key_field)), ts, fields)
            alerts, _ = logic.on_event(store, key, group, event, {**fields, HOLDS: True})
        else:
            st = store.get(key) or {"group": list(group), "last_event": ts, "firing_since": None}
            st["last_event"] = max(st["last_event"], ts)
            values = {field: fields.get(field)}
            if r["__prev"] is not None:  # change
                values["previous"] = r["__prev"]
            alerts = logic.oneshot.trigger(st, group, fields, ts, ts, values)
            logic._save(store, key, st)  # noqa: SLF001 - the evaluator's own bookkeeping
        out.add(alerts, r["__part"], r["__offset"], ON_EVENT, 0)
        expire(clock, r["__part"], r["__offset"], AFTER)
    if rows:
        expire(rows[0]["__final"], None, None, BEFORE)
    return out


def native_output(
    decoded: DataFrame, plan: SparkPlan, rules: Sequence[CompiledRule],
    stream_path: Mapping[str, frozenset[str]], order: Mapping[str, int],
) -> DataFrame | None:  # fmt: skip
    """The output rows (``jobs.state.OUTPUT_SCHEMA``) of every rule of ``rules``, each on the
    stream keys ``stream_path`` does not leave to the stream path; ``order``: each rule's place
    in the evaluator's per-event order (each row carries its place among its event's rows,
    ``jobs.transitions.AT_EVENT``)."""
    out: DataFrame | None = None
    for rule in rules:
        ev = clocked(decoded, stream_of(plan, rule), skip=stream_path.get(rule.id, ()))
        marked = valued_rows(ev, rule)
        kept = trigger_rows(marked, ev).withColumn("__rule", F.lit(rule.id))
        done = stepped(decoded, kept, GroupStep([rule], order, run_group))
        # a row the step did not place (a resolve at a later clock) goes where its due is
        # reached: one as-of lookup over every row, so the Python step runs once
        rows = at_clock(ev, done, "__due")
        rows = rows.withColumn("part", F.coalesce(F.col("part"), F.col("__at.__part")))
        rows = rows.withColumn("offset", F.coalesce(F.col("offset"), F.col("__at.__offset"))).drop("__at")
        rows = placed(rows)
        if rule.rule.new_term is None:
            rows = rows.unionByName(late_count(marked.where(F.col("__late")), rule.id, order[rule.id]))
        out = rows if out is None else out.unionByName(rows)
    return out
