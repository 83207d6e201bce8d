"""What the native plans of timer kinds share (``jobs.absence``, ``jobs.event_alerts``): the
Python step that runs the evaluator's own logic over each group's kept rows, and the order
of its transitions at one event, which is the evaluator's.

At one event the evaluator runs rule by rule (its per-event order): each rule's timers due
at the partition clock (by due time, then state key: its timer heap), then its
``on_event``, then the timer that ``on_event`` made due at once. Each transition carries
its rule's place in that order, its phase among those three, its timer's due, its state key
and its place in its group's run (:data:`AT_EVENT`), so a backtest's one sort of all its
output rows by (partition, offset, :data:`AT_EVENT`) rebuilds that order, whichever plan
(native or the evaluator's) gave each row (:func:`jobs.backtest.run_backtest`). Where the
time bound held an event, the evaluator's rows keep its own order (:func:`placed_by_idx`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import groupby
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from app.alerts import Alert
from app.rules.loader import CompiledRule
from app.rules.spark_sql import SPARK_RULE_FIELDS
from app.topics import ALERTS
from jobs.compile import native_where, unreproduced
from jobs.state import OUTPUT_SCHEMA
from jobs.streams import IDX_BASE, IDX_HELD

#: a transition's phase at its event: a timer before the rule's ``on_event``, its own, one after
BEFORE, ON_EVENT, AFTER = 0, 1, 2
#: the rule-model fields every event-alert kind run through :func:`stepped` may set (one with a
#: hold, ``for``/``consecutive``, keeps the evaluator); each kind adds its own
EVENT_ALERT_FIELDS = SPARK_RULE_FIELDS - {"for_ms", "consecutive"}
#: the output rows (``jobs.state.OUTPUT_SCHEMA``) as Arrow batches of a Python step
OUTPUT_ARROW = pa.schema(
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
    ]
)
#: the Python step's output: the output rows (``idx`` set after; ``part`` and ``offset`` NULL
#: for a transition still to be placed at its due) and their place at their event
STEP = pa.schema(
    [
        *OUTPUT_ARROW,
        ("__ph", pa.int32()),
        ("__due", pa.int64()),
        ("__key", pa.string()),
        ("__seq", pa.int32()),
        ("__sk", pa.string()),
        ("__r", pa.int32()),
    ]
)
STEP_DDL = f"{OUTPUT_SCHEMA}, __ph int, __due bigint, __key string, __seq int, __sk string, __r int"
OUTPUT_COLUMNS = [c.strip().split(" ")[0] for c in OUTPUT_SCHEMA.split(",")]
#: an output row's place among its event's rows (see the module): its rule's place in the
#: evaluator's per-event order, its phase, its timer's due, its state key, its place in its
#: group's run
AT_EVENT = ("__r", "__ph", "__due", "__key", "__seq")

#: one group's run: (rule, group values, stream key, its kept rows in order) -> transitions
GroupRun = Callable[[CompiledRule, tuple[str, ...], str, list[dict[str, Any]]], "Transitions"]


class Transitions:
    """One group's transitions as rows of :data:`STEP` (without the rule's place)."""

    def __init__(self, sk: str, key: str) -> None:
        self.sk, self.key = sk, key
        self.rows: list[tuple[Any, ...]] = []

    def add(self, alerts: list[Alert], part: int | None, offset: int | None, phase: int, due: int) -> None:
        for a in alerts:
            self.rows.append(
                ("alert", ALERTS, a.fingerprint, a.to_json().decode(), part, offset, 0, a.rule_id, a.status,
                 a.alert_id, phase, due, self.key, len(self.rows), self.sk)
            )  # fmt: skip


class GroupStep:
    """Picklable ``mapInArrow`` function: a shuffle partition's kept rows (whole groups:
    ``__rule``, ``__sk``, ``__g``, ``__part``, ``__offset``, ``__o``) through ``run``, group
    by group in order; rows of :data:`STEP`."""

    def __init__(self, rules: Sequence[CompiledRule], order: Mapping[str, int], run: GroupRun) -> None:
        self.rules = {r.id: r for r in rules}
        self.order = dict(order)
        self.run = run

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = [r for b in batches for r in b.to_pylist()]
        if not rows:
            return
        rows.sort(key=lambda r: (r["__rule"], r["__sk"], r["__g"], r["__part"], r["__offset"], r["__o"]))
        out: list[tuple[Any, ...]] = []
        whose = lambda r: (r["__rule"], r["__sk"], tuple(r["__g"]))  # noqa: E731
        for (rid, sk, group), members in groupby(rows, key=whose):
            done = self.run(self.rules[rid], group, sk, list(members))
            out += [(*o, self.order[rid]) for o in done.rows]
        if out:
            yield pa.RecordBatch.from_arrays(
                [pa.array([o[i] for o in out], STEP.field(i).type) for i in range(len(STEP))], schema=STEP
            )


def common_problem(rule: CompiledRule, kind: str, fields: frozenset[str]) -> str | None:
    """What stops a rule of a timer kind from running natively, for every such kind: not of
    ``kind``, a rule-model field outside ``fields`` set, a ``where`` Spark SQL cannot
    express, a ``group_by`` on a non-string field (the evaluator groups by ``str(value)``)."""
    r = rule.rule
    if r.kind != kind:
        return f"only {kind} rules run natively here"
    found = unreproduced(rule, fields)
    if found is not None:
        return found
    if r.where is not None and native_where(rule) is None:
        return "where is not expressible in Spark SQL"
    types = rule.schema.all_fields()
    if any(types.get(g) != "string" for g in r.group_by):
        return "group_by on a non-string field"
    return None


def stepped(decoded: DataFrame, kept: DataFrame, step: GroupStep) -> DataFrame:
    """``kept`` rows with their events' fields (``__fields``: the kept rows are few, so they
    are joined back rather than carried through the sorts) through ``step``, whole groups
    per shuffle partition."""
    shuffle = int(decoded.sparkSession.conf.get("spark.sql.shuffle.partitions") or "2")
    fields = decoded.where(F.col("__dlq").isNull()).select("__part", "__offset", "__fields")
    rows = kept.join(fields, ["__part", "__offset"], "left").repartition(shuffle, "__rule", "__sk", "__g")
    return rows.mapInArrow(step, STEP_DDL)


def at_event(
    place: Column | int, phase: int, due: Column | int = 0, key: Column | str = "", seq: Column | int = 0
) -> list[Column]:
    """The :data:`AT_EVENT` columns of output rows, typed as :data:`STEP` has them: each a
    column or a literal."""
    values = (place, phase, due, key, seq)
    types = ("int", "int", "bigint", "string", "int")
    return [
        (v if isinstance(v, Column) else F.lit(v)).cast(t).alias(name)
        for v, t, name in zip(values, types, AT_EVENT, strict=True)
    ]


def late_count(late: DataFrame, rule_id: str, place: int) -> DataFrame:
    """One output row counting the rows of ``late``, the events rule ``rule_id`` could not use
    for their time (the evaluator's ``stats.late``, a backtest's ``late_events``), with
    :data:`AT_EVENT` (``place``: the rule's in the evaluator's per-event order); no row when
    there are none. ``part`` and ``offset`` are NULL: the count is the whole input's."""
    n = late.agg(F.count(F.lit(1)).alias("__n")).where(F.col("__n") > 0)
    return n.select(
        F.lit("late").alias("kind"),
        F.lit(None).cast("string").alias("topic"),
        F.lit(None).cast("string").alias("key"),
        F.col("__n").cast("string").alias("value"),
        F.lit(None).cast("int").alias("part"),
        F.lit(None).cast("bigint").alias("offset"),
        F.lit(0).alias("idx"),
        F.lit(rule_id).alias("rule"),
        F.lit(None).cast("string").alias("status"),
        F.lit(None).cast("string").alias("alert_id"),
        *at_event(place, ON_EVENT),
    )


def placed(rows: DataFrame) -> DataFrame:
    """Rows of :data:`STEP`, all placed, as output rows (``jobs.state.OUTPUT_SCHEMA``) with
    their place at their event (:data:`AT_EVENT`)."""
    return rows.select(*OUTPUT_COLUMNS, *AT_EVENT)


def placed_by_idx(rows: DataFrame, order: Mapping[str, int], first: Mapping[str, int]) -> DataFrame:
    """Output rows whose ``idx`` orders them at their event, with :data:`AT_EVENT`: a keyed-path
    rule's rows (``idx``: the rule's place, below ``IDX_BASE``, as in ``order``), a native
    threshold's (``idx``: ``order``'s place) and a stream evaluator's (``idx``: ``IDX_BASE`` on,
    its own order over the rules of its stream, one event at a time, so by their places in
    ``order``). Where the time bound held an event (``idx`` from ``IDX_HELD`` on), the
    evaluator may take several events at one record and no other plan runs on that stream
    partition: its rows keep its own order, as one block at the place of the stream's first
    rule (``first``: per rule). Rows of no rule (dead letters, routed copies) come first at
    their event, in ``idx`` order."""

    def place(of: Mapping[str, int]) -> Column:
        if not of:
            return F.lit(None).cast("int")
        return F.create_map(*(F.lit(v) for rid, i in sorted(of.items()) for v in (rid, i)))[F.col("rule")]

    rule_place = F.when(F.col("idx") >= IDX_HELD, place(first)).otherwise(place(order))
    rule_place = F.when(F.col("idx") < IDX_BASE, F.col("idx")).otherwise(rule_place)
    return rows.select(*OUTPUT_COLUMNS, *at_event(rule_place, ON_EVENT, seq=F.col("idx")))
