"""Tumbling and hopping window rules natively in a Spark backtest: the per-event work in the
JVM, the evaluator's lifecycle only on the closed windows.

In a backtest the whole input is known, so what the evaluator decides per event
(:class:`app.rules.logic.windows.TumblingLogic`) is a window function and a ``groupBy``:

* **the clock.** Per stream partition (the evaluator's: the topic-key stream on Kafka's
  partition of the key, a regrouped stream on that of the group values; the decoder's
  stream keys, ``__streams``), an event is evaluated at the newest event time of the
  partition's events up to it, in (partition, offset) order: a running ``max``.
* **lateness.** An event whose ``where`` is TRUE folds into each of its windows ``w``
  with ``w + size + allowed_lateness`` above that clock; one that folds into none is late
  (``late_policy: side`` copies it aside).
* **the aggregates.** ``groupBy(stream partition, group, window)``, each folded exactly as
  the evaluator folds it: floats left to right in arrival order (an ordered
  ``aggregate()``, the same IEEE additions), integers exactly (``decimal(38,0)``), ``min``
  and ``max`` keeping the first of equal values, ``count(distinct)`` and ``percentile`` capped
  at ``MAX_VALUES`` values as the evaluator caps them.
* **closing.** A window is evaluated once the partition's clock reaches its end plus the
  lateness, at the first event that moves the clock there; windows the final clock never
  reaches stay open, as in the evaluator.

The closed windows of one group, in start order, then go to :class:`ClosedWindows`, the
evaluator's ``TumblingLogic`` itself (``having``, ``for``/``consecutive``, the empty windows
of a firing or pending group, the alert ids), in one Python call per shuffle partition.
Each transition is placed at the event whose clock closed its window (an as-of join on the
partition's clock), so the output keeps event order.

What is decided per stream partition, before the plan runs (:func:`native_partitions`):

* with the event-time bound on (``APP_MAX_EVENT_SKEW``), a partition where some event is more
  than the skew ahead of the clock before it leaves the rule to the evaluator there (the
  stream path, ``StreamRunner``): the bound would hold that event and evaluate it later,
  in another order (docs/event-time.md). Where no event is, the bound admits every event
  as it comes, at the running maximum, which is what is computed here;
* the events that move a partition's clock by ``MAX_EMPTY_STEPS`` windows or more: the
  evaluator caps the empty windows it evaluates in such an event's timer run before an
  open window, and :meth:`ClosedWindows.run` does the same at the same events.

What stays on the stream path for every partition (:func:`native_problem` says why):
sliding and session windows, ``late_policy: amend``, ``prev()`` (whether the previous
window's values survive depends on when the group's state was deleted, i.e. on arrival
times), ``having`` with baselines, ``enrich``, a ``where`` Spark SQL cannot express,
aggregates of expressions rather than fields, groups on non-string fields.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import groupby
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, DoubleType, StringType, StructField, StructType

from app.alerts import Alert
from app.rules.aggregates import MAX_VALUES, percentile
from app.rules.evaluator import LATE_TOPIC
from app.rules.lifecycle import in_episode
from app.rules.loader import CompiledRule
from app.rules.logic.base import State, state_key
from app.rules.logic.windows import MAX_EMPTY_STEPS, TumblingLogic
from app.topics import ALERTS
from jobs.compile import SparkPlan, native_where
from jobs.held import hold
from jobs.transitions import BEFORE, ON_EVENT, at_event, late_count
from jobs.udfs import guarded

logger = logging.getLogger(__name__)

#: the aggregates computed here, by the field types they read (count reads any)
_NUMERIC = frozenset({"double", "long"})
_FUNCS: dict[str, frozenset[str]] = {
    "count": frozenset({"string", "double", "long", "boolean", "timestamp"}),
    "count_distinct": frozenset({"string", "long"}),
    "sum": _NUMERIC,
    "avg": _NUMERIC,
    "min": frozenset({"string", "double", "long"}),
    "max": frozenset({"string", "double", "long"}),
    "percentile": _NUMERIC,
}
#: a long field read as a decimal: every integer JSON holds (up to 2**64) stays exact
_LONG = DecimalType(20, 0)
_SUM = DecimalType(38, 0)
#: the Python step's output, before its rows are placed at their events
_STEP_SCHEMA = pa.schema(
    [
        ("sk", pa.string()),
        ("due", pa.int64()),
        ("seq", pa.int32()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("rule", pa.string()),
        ("status", pa.string()),
        ("alert_id", pa.string()),
        ("skey", pa.string()),
    ]
)
_STEP_DDL = (
    "sk string, due bigint, seq int, key string, value string, rule string, status string, alert_id string, "
    "skey string"
)


def native_problem(rule: CompiledRule) -> str | None:
    """Why ``rule`` cannot run natively in a Spark backtest, or None when it can."""
    r = rule.rule
    if r.window is None or r.window.type not in ("tumbling", "hopping"):
        return "only tumbling and hopping windows run natively"
    if r.late_policy == "amend":
        return "late_policy: amend re-evaluates closed windows per late event"
    if r.enrich:
        return "enrich joins registry rows per event"
    parts = rule.parts
    if parts is None or parts.having is None:
        return "no having"
    if parts.having.synthetic:
        return "prev() depends on when the group's state was deleted"
    if parts.having_baselines:
        return "having with baselines"
    if r.where is not None and native_where(rule) is None:
        return "where is not expressible in Spark SQL"
    types = rule.schema.all_fields()
    if any(types.get(g) != "string" for g in r.group_by):
        return "group_by on a non-string field"
    for a in parts.aggs:
        if a.func == "count_star":
            continue
        if a.arg is None or a.arg.field is None:
            return f"{a.name}: an aggregate of an expression, not of a field"
        if types.get(a.arg.field) not in _FUNCS.get(a.func, frozenset()):
            return f"{a.name}: {a.func} of a {types.get(a.arg.field)} field"
    return None


def native_rules(plan: SparkPlan) -> list[CompiledRule]:
    """The stream-path rules of ``plan`` that can run natively (see :func:`native_problem`)."""
    return [r for r in plan.stream_rules if native_problem(r) is None]


@dataclass(frozen=True)
class NativeStream:
    """Where a native rule's stream partitions are: its source and the position of its
    stream among the source's streams (the decoder's ``__streams``)."""

    name: str
    source: str
    position: int
    #: the clock's chunk of offsets (see :func:`clocked`), 0: one task per stream partition
    chunk: int = 0


def stream_of(plan: SparkPlan, rule: CompiledRule) -> NativeStream:
    mine = [s for s in plan.streams if s.source == rule.rule.source]
    for i, s in enumerate(mine):
        if rule.id in s.rule_ids:
            return NativeStream(s.name, s.source, i, plan.clock_chunk)
    msg = f"rule {rule.id} is in no stream of the plan"
    raise ValueError(msg)


#: the offsets of one chunk of a stream partition's events, whose clocks are computed together
CLOCK_CHUNK = 1 << 16


def clock_chunk(cores: int, partitions: int) -> int:
    """The clock's chunk for a backtest over ``partitions`` stream partitions on ``cores``: per
    chunk when there are more cores than partitions, else one task per partition (measured in
    one JVM on the backtest bench, 2 partitions on 2 cores: per chunk 28 to 30 s, per
    partition 24 s; the chunks' maxima are one more job and a join)."""
    return CLOCK_CHUNK if cores > partitions else 0


def clocked(
    decoded: DataFrame, stream: NativeStream, chunk: int | None = None, skip: Collection[str] = ()
) -> DataFrame:
    """The valid events of ``stream``'s source with their stream key (``__sk``), the
    partition's clock before (``__prev``, NULL for its first event) and at each (``__clock``);
    none of the stream keys in ``skip`` (those left to the evaluator's stream path).

    The clock before an event is the newest time of the partition's events before it, in
    (partition, offset) order: a running ``max``, one task per stream partition when
    ``chunk`` (default: the stream's) is 0. Otherwise it is computed in parallel: per chunk of
    ``chunk`` offsets, the running ``max`` within the chunk and, from a small table of the
    chunks' maxima, the newest time of every chunk before it."""
    chunk = stream.chunk if chunk is None else chunk
    events = decoded.where(F.col("__dlq").isNull() & (F.col("__source") == stream.source)).select(
        F.col("__streams")[stream.position].alias("__sk"), "__part", "__offset", "__ts_ms", "__fields"
    )
    if skip:
        events = events.where(~F.col("__sk").isin(sorted(skip)))
    if chunk <= 0:
        order = Window.partitionBy("__sk").orderBy("__part", "__offset")
        prev = F.max("__ts_ms").over(order.rowsBetween(Window.unboundedPreceding, -1))
        clock = F.greatest(F.col("__ts_ms"), F.coalesce(F.col("__prev"), F.col("__ts_ms")))
        return hold(events.withColumn("__prev", prev).withColumn("__clock", clock))
    events = events.withColumn("__chunk", F.expr(f"`__offset` div {int(chunk)}"))
    chunks = ["__sk", "__part", "__chunk"]
    within = Window.partitionBy(*chunks).orderBy("__offset").rowsBetween(Window.unboundedPreceding, -1)
    earlier = (
        Window.partitionBy("__sk").orderBy("__part", "__chunk").rowsBetween(Window.unboundedPreceding, -1)
    )
    maxima = events.groupBy(*chunks).agg(F.max("__ts_ms").alias("__m"))
    before = maxima.select(*chunks, F.max("__m").over(earlier).alias("__before"))
    prev = F.greatest(F.max("__ts_ms").over(within), F.col("__before"))  # NULL only when both are
    return hold(
        events.join(F.broadcast(before), chunks)
        .withColumn("__prev", prev)
        .withColumn("__clock", F.greatest(F.col("__ts_ms"), F.coalesce(F.col("__prev"), F.col("__ts_ms"))))
        .drop("__chunk", "__before")
    )


@dataclass(frozen=True)
class NativePartitions:
    """What :func:`native_partitions` found, per native rule id: ``stream_path``, the stream
    keys left to the evaluator (an event the time bound would hold); ``jumps``, per stream
    key, each ``(clock before, clock after)`` of an event that moves the clock by
    ``MAX_EMPTY_STEPS`` of the rule's window steps or more (see :meth:`ClosedWindows.run`)."""

    stream_path: dict[str, frozenset[str]]
    jumps: dict[str, dict[str, tuple[tuple[int, int], ...]]]


def native_partitions(
    decoded: DataFrame, plan: SparkPlan, rules: Sequence[CompiledRule], max_skew_ms: int,
    held_only: Sequence[CompiledRule] = (),
) -> NativePartitions:  # fmt: skip
    """Per stream partition of each native rule: whether the time bound could hold one of
    its events (then the rule runs on the stream path there), and its big clock jumps.
    One small job per stream. ``held_only``: other native rules (``jobs.thresholds``) of
    the stream path that need the first answer only; with the bound off, none."""
    stats: dict[NativeStream, list[Any]] = {}
    big: dict[NativeStream, int] = {}
    for rule in rules:
        stream = stream_of(plan, rule)
        big[stream] = min(big.get(stream, 2**62), MAX_EMPTY_STEPS * _step(rule))
    held_only = held_only if max_skew_ms >= 0 else ()
    for rule in held_only:
        big.setdefault(stream_of(plan, rule), 2**62)
    for stream, least in big.items():
        ev = clocked(decoded, stream)
        jump = F.col("__ts_ms") - F.col("__prev")
        held = F.lit(False) if max_skew_ms < 0 else jump > max_skew_ms
        far = F.when(jump >= least, F.struct(F.col("__prev").alias("a"), F.col("__ts_ms").alias("b")))
        stats[stream] = (
            ev.groupBy("__sk")
            .agg(F.max(held.cast("int")).alias("held"), F.collect_list(far).alias("jumps"))
            .collect()
        )
    stream_path: dict[str, frozenset[str]] = {}
    jumps: dict[str, dict[str, tuple[tuple[int, int], ...]]] = {}
    for rule in rules:
        found = stats[stream_of(plan, rule)]
        least = MAX_EMPTY_STEPS * _step(rule)
        stream_path[rule.id] = frozenset(r["__sk"] for r in found if r["held"])
        jumps[rule.id] = {
            r["__sk"]: tuple(sorted((j["a"], j["b"]) for j in r["jumps"] if j["b"] - j["a"] >= least))
            for r in found
            if not r["held"]
        }
    for rule in held_only:
        stream_path[rule.id] = frozenset(r["__sk"] for r in stats[stream_of(plan, rule)] if r["held"])
    return NativePartitions(stream_path, jumps)


def _step(rule: CompiledRule) -> int:
    return rule.rule.window.step if rule.rule.window is not None else 1


def _agg_struct(rule: CompiledRule) -> StructType:
    """The fields ``rule``'s aggregates and groups read, typed for exact folds."""
    types = rule.schema.all_fields()
    names = set(rule.rule.group_by) | {a.arg.field for a in rule.parts.aggs if a.arg and a.arg.field}  # type: ignore[union-attr]
    spark = {"double": DoubleType(), "long": _LONG}
    return StructType([StructField(n, spark.get(types[n], StringType())) for n in sorted(names)])


def _ordered(field: str) -> Column:
    """The window's values of ``field`` in arrival order (NULLs kept)."""
    arrived = F.array_sort(F.collect_list(F.struct("__part", "__offset", F.col(f"__a.`{field}`").alias("v"))))
    return F.transform(arrived, lambda x: x["v"])


def _extreme(smaller: bool) -> Callable[[Column, Column], Column]:
    """The fold step of ``min`` (``smaller``) or ``max``: the first of equal values is kept."""

    def step(acc: Column, x: Column) -> Column:
        better = x < acc if smaller else x > acc
        return F.when(x.isNotNull() & (acc.isNull() | better), x).otherwise(acc)

    return step


def _aggregates(rule: CompiledRule) -> list[Column]:
    """One column per aggregate, in ``aggregate:`` order: its fold state (see :class:`ClosedWindows`)."""
    types = rule.schema.all_fields()
    cols: list[Column] = []
    assert rule.parts is not None  # noqa: S101
    for i, a in enumerate(rule.parts.aggs):
        name = f"a{i}"
        if a.func == "count_star":
            cols.append(F.count(F.lit(1)).alias(name))
            continue
        field = a.arg.field if a.arg is not None and a.arg.field is not None else ""
        value = F.col(f"__a.`{field}`")
        kind = types[field]
        if a.func == "count":
            cols.append(F.count(value).alias(name))
        elif a.func == "count_distinct":
            cols.append(F.least(F.count_distinct(value), F.lit(MAX_VALUES)).alias(name))
        elif a.func in ("sum", "avg"):
            if kind == "long":
                total = F.sum(value.cast(_SUM))
            else:  # left to right in arrival order, as the evaluator adds floats
                total = F.aggregate(
                    _ordered(field),
                    F.lit(0.0).cast("double"),
                    lambda acc, x: F.when(x.isNull(), acc).otherwise(acc + x),
                )
            cols.append(F.struct(total.alias("total"), F.count(value).alias("n")).alias(name))
        elif a.func in ("min", "max"):
            spark_type = (
                "double" if kind == "double" else "string" if kind == "string" else _LONG.simpleString()
            )
            fold = _extreme(a.func == "min")
            cols.append(F.aggregate(_ordered(field), F.lit(None).cast(spark_type), fold).alias(name))
        elif a.func == "percentile":  # the first MAX_VALUES values, sorted in Python as the evaluator does
            present = F.filter(_ordered(field), lambda x: x.isNotNull())
            cols.append(F.slice(present, 1, MAX_VALUES).alias(name))
        else:  # pragma: no cover - native_problem admits only the functions above
            msg = f"aggregate {a.func} is not native"
            raise ValueError(msg)
    return cols


def closed_windows(
    decoded: DataFrame, plan: SparkPlan, rule: CompiledRule, skip: frozenset[str]
) -> DataFrame:
    """One row per window of ``rule`` that the final clock closed, on stream keys not in
    ``skip``: ``__sk``, ``__g`` (group values), ``__w`` (start), ``__final`` (the partition's
    final clock), ``a0``... (the aggregates' fold states)."""
    r = rule.rule
    assert r.window is not None  # noqa: S101
    stream = stream_of(plan, rule)
    ev = clocked(decoded, stream, skip=skip)
    final = ev.groupBy("__sk").agg(F.max("__clock").alias("__final"))
    ev = taken(ev, rule)
    ev = ev.withColumn("__a", F.from_json(F.col("__fields"), _agg_struct(rule)))
    size, step, lateness = int(r.window.size or 0), r.window.step, r.allowed_lateness
    last = F.col("__ts_ms") - F.pmod(F.col("__ts_ms"), F.lit(step))
    if size == step:
        starts = ev.withColumn("__w", last)
    else:
        back = F.explode(F.sequence(F.lit(0), F.lit(size // step - 1)))
        starts = ev.withColumn("__k", back).withColumn("__w", last - F.col("__k") * step)
    on_time = starts.where(F.col("__w") + size + lateness > F.col("__clock"))
    group = F.array(*(F.coalesce(F.col(f"__a.`{g}`"), F.lit("")) for g in r.group_by)).cast("array<string>")
    windows = on_time.withColumn("__g", group).groupBy("__sk", "__g", "__w").agg(*_aggregates(rule))
    return windows.join(final, "__sk").where(F.col("__w") + size + lateness <= F.col("__final"))


def taken(ev: DataFrame, rule: CompiledRule) -> DataFrame:
    """The rows of ``ev`` that ``rule``'s ``where`` takes (all of them without one), its geo
    functions called only where they can give a value (:func:`jobs.udfs.guarded`)."""
    where = native_where(rule)
    if where is None:
        return ev
    parsed = F.from_json(F.col("__fields"), _condition_struct(rule, where.columns))
    ev, (sql,) = guarded(ev.withColumn(f"__{rule.rule.source}", parsed), [where.sql], where.calls)
    return ev.where(F.expr(sql))


def _condition_struct(rule: CompiledRule, columns: frozenset[str]) -> StructType:
    from jobs.decode import source_struct

    return source_struct(rule.rule.source, only=columns)


def late_events(decoded: DataFrame, plan: SparkPlan, rule: CompiledRule, skip: frozenset[str]) -> DataFrame:
    """The events ``rule`` takes (``where`` TRUE) on its stream keys not in ``skip`` that fold
    into no window (:func:`jobs.windows.clocked`'s columns): late, whatever the late policy,
    as the evaluator's ``on_event`` decides (the newest window they fall in is closed for good
    at their partition's clock)."""
    r = rule.rule
    assert r.window is not None  # noqa: S101
    ev = clocked(decoded, stream_of(plan, rule), skip=skip)
    ev = taken(ev, rule)
    last = F.col("__ts_ms") - F.pmod(F.col("__ts_ms"), F.lit(r.window.step))
    return ev.where(last + int(r.window.size or 0) + r.allowed_lateness <= F.col("__clock"))


def late_rows(late: DataFrame, rule: CompiledRule, place: int) -> DataFrame:
    """``late_policy: side``: the events of ``late`` (:func:`late_events`) as the evaluator's
    late copies (output rows, topic ``events.late``, in its ``on_event``; ``place``: the rule's
    in the evaluator's per-event order)."""
    head = orjson.dumps({"rule_id": rule.id})[:-1].decode() + ',"event":'
    return late.select(
        F.lit("side").alias("kind"),
        F.lit(LATE_TOPIC).alias("topic"),
        F.lit(rule.id).alias("key"),
        F.concat(F.lit(head), F.col("__fields"), F.lit("}")).alias("value"),
        F.col("__part").alias("part"),
        F.col("__offset").alias("offset"),
        F.lit(0).alias("idx"),
        F.lit(rule.id).alias("rule"),
        F.lit(None).cast("string").alias("status"),
        F.lit(None).cast("string").alias("alert_id"),
        *at_event(place, ON_EVENT),
    )


class ClosedWindows:
    """The evaluator's tumbling/hopping lifecycle (its :class:`TumblingLogic`, which may be
    compiled: composed, not subclassed) over one group's closed windows, given in start
    order with their aggregates' results computed elsewhere (:meth:`run`)."""

    def __init__(self, rule: CompiledRule) -> None:
        self.logic = TumblingLogic(rule)

    def run(
        self, group: tuple[str, ...], windows: Sequence[tuple[int, dict[str, Any]]], final_ms: int,
        jumps: Sequence[tuple[int, int]] = (),
    ) -> list[Alert]:  # fmt: skip
        """Every transition of ``group`` (:meth:`evaluate`'s)."""
        return self.evaluate(group, windows, final_ms, jumps)[0]

    def evaluate(
        self, group: tuple[str, ...], windows: Sequence[tuple[int, dict[str, Any]]], final_ms: int,
        jumps: Sequence[tuple[int, int]] = (),
    ) -> tuple[list[Alert], list[int]]:  # fmt: skip
        """Every transition of ``group``, and when each evaluation that gave none was due (a
        timer run of the evaluator starts at its earliest evaluation, with a transition or
        not: :func:`placed_at_events` orders the runs at one event by it). The transitions:
        its closed windows (``windows``, in start order,
        all closed by the final clock ``final_ms``) evaluated in that order as the
        evaluator's timers evaluate them, with the empty windows of a firing or pending
        group between and after them, up to the final clock.

        The evaluator evaluates the empty windows as its clock passes them, every one of
        them (its timer is re-armed until they are done) except where one event moves the
        clock past an open window's close: its timer run then evaluates at most
        ``MAX_EMPTY_STEPS`` empty windows before that window. ``jumps`` (sorted ``(clock
        before, clock after)`` pairs) are the events that move the clock that far; at any
        other event no such run reaches the cap."""
        quiet: list[int] = []
        st: State = {"group": list(group), "windows": {}, "firing_since": None, "streak": 0,
                     "streak_since": None, "last_active": None}  # fmt: skip
        alerts: list[Alert] = []
        logic = self.logic
        closes = [b for _, b in jumps]
        for start, aggs in windows:
            due = logic._eval_at(start)  # noqa: SLF001 - the evaluator's own lifecycle, composed
            i = bisect.bisect_left(closes, due)  # the event whose clock first reaches the close
            if i < len(jumps) and jumps[i][0] < due:
                before, after = jumps[i]
                alerts += self._catch_up(st, group, start, before, quiet)  # done at the events up to it
                if in_episode(st):  # its own timer run, capped
                    alerts += self._empties(st, group, start, after, quiet)
            else:
                alerts += self._catch_up(st, group, start, final_ms, quiet)
            found = logic.evaluate_results(st, group, start, aggs)
            if not found:
                quiet.append(due)
            alerts += found
        return alerts + self._catch_up(st, group, None, final_ms, quiet), quiet

    def _catch_up(
        self, st: State, group: tuple[str, ...], before: int | None, final_ms: int, quiet: list[int]
    ) -> list[Alert]:
        """Every empty window after the last active one, before ``before`` and closed by
        ``final_ms``, while the group fires or pends (uncapped: see :meth:`run`)."""
        alerts: list[Alert] = []
        while in_episode(st):
            last = st["last_active"]
            alerts += self._empties(st, group, before, final_ms, quiet)
            if st["last_active"] == last:
                break
        return alerts

    def _empties(
        self, st: State, group: tuple[str, ...], before: int | None, clock_ms: int, quiet: list[int]
    ) -> list[Alert]:
        """The evaluator's run over the empty windows (``_empty_until``); the due of each one
        that kept the group in its episode without a transition goes to ``quiet`` (each such
        window becomes the last active one)."""
        logic = self.logic
        last = st["last_active"]
        alerts = logic._empty_until(st, group, before, clock_ms)  # noqa: SLF001
        if last is not None and st["last_active"] is not None:
            said = {int(a.values["window_start"]) for a in alerts}
            quiet += [
                logic._eval_at(s)  # noqa: SLF001
                for s in range(last + logic.step, st["last_active"] + 1, logic.step)
                if s not in said
            ]
        return alerts

    def due_of(self, alert: Alert) -> int:
        """When the evaluator's clock closed the window ``alert`` came from."""
        return int(alert.values["window_start"]) + self.logic.size + self.logic.lateness


def _results(rule: CompiledRule, row: Mapping[str, Any]) -> dict[str, Any]:
    """The aggregates' results from a closed-window row, as ``AggSpec.result`` gives them."""
    out: dict[str, Any] = {}
    assert rule.parts is not None  # noqa: S101
    for i, a in enumerate(rule.parts.aggs):
        v = row[f"a{i}"]
        if a.func in ("sum", "avg"):
            total, n = v["total"], v["n"]
            if isinstance(total, Decimal):
                total = int(total)
            out[a.name] = None if n == 0 else total / n if a.func == "avg" else total
        elif a.func == "percentile":
            values = [int(x) if isinstance(x, Decimal) else x for x in v]
            out[a.name] = percentile(sorted(values), float(a.param or 0.0)) if values else None
        else:
            out[a.name] = int(v) if isinstance(v, Decimal) else v
    return out


class LifecycleStep:
    """Picklable ``mapInArrow`` function: a shuffle partition's closed windows of one rule
    (whole groups) through :class:`ClosedWindows`; rows of :data:`_STEP_SCHEMA`: each
    transition, and each evaluation that gave none (``value`` NULL: only its ``due`` counts)."""

    def __init__(self, rule: CompiledRule, jumps: Mapping[str, tuple[tuple[int, int], ...]]) -> None:
        self.rule, self.jumps = rule, dict(jumps)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = [r for b in batches for r in b.to_pylist()]
        if not rows:
            return
        logic = ClosedWindows(self.rule)
        rows.sort(key=lambda r: (r["__sk"], r["__g"], r["__w"]))
        out: list[tuple[Any, ...]] = []
        for (sk, group), members in groupby(rows, key=lambda r: (r["__sk"], tuple(r["__g"]))):
            mine = list(members)
            windows = [(int(r["__w"]), _results(self.rule, r)) for r in mine]
            final, jumps = int(mine[0]["__final"]), self.jumps.get(sk, ())
            skey = state_key(self.rule, group)
            alerts, quiet = logic.evaluate(group, windows, final, jumps)
            for seq, a in enumerate(alerts):
                body = a.to_json().decode()
                out.append(
                    (sk, logic.due_of(a), seq, a.fingerprint, body, a.rule_id, a.status, a.alert_id, skey)
                )
            out += [(sk, due, None, None, None, None, None, None, skey) for due in quiet]
        if out:
            yield pa.RecordBatch.from_arrays(
                [pa.array([o[i] for o in out], _STEP_SCHEMA.field(i).type) for i in range(len(_STEP_SCHEMA))],
                schema=_STEP_SCHEMA,
            )


def at_clock(ev: DataFrame, rows: DataFrame, due: str) -> DataFrame:
    """``rows`` (each on a stream key, ``__sk``) with ``__at``: the first event of its stream
    partition in ``ev`` (:func:`clocked`), in (partition, offset) order, whose clock is at or
    past the row's ``due`` column, as ``struct(__part, __offset, __clock)``; NULL if none is.

    An as-of join on the partition's clock: the events that move it (``steps``, strictly
    increasing in both clock and order) and the rows, in one sort per stream key."""
    steps = ev.where(F.col("__prev").isNull() | (F.col("__ts_ms") > F.col("__prev"))).select(
        "__sk", F.col("__clock").alias("__v"), F.lit(1).alias("__t"),
        F.struct("__part", "__offset", "__clock").alias("__step"),
    )  # fmt: skip
    asked = rows.select("*", F.col(due).alias("__v"), F.lit(0).alias("__t"))
    # the next step at or after each due, found backwards over a growing frame (a frame
    # to UNBOUNDED FOLLOWING is evaluated anew for each row: quadratic in a partition's events)
    backwards = Window.partitionBy("__sk").orderBy(F.col("__v").desc(), F.col("__t").desc())
    nearest = backwards.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    found = F.last("__step", ignorenulls=True).over(nearest)
    both = asked.unionByName(steps, allowMissingColumns=True)
    return both.withColumn("__at", found).where(F.col("__t") == 0).drop("__v", "__t", "__step")


def placed_at_events(
    alerts: DataFrame, decoded: DataFrame, plan: SparkPlan, rule: CompiledRule, order: Mapping[str, int]
) -> DataFrame:
    """Each transition at the event whose clock closed its window: the first event of its
    stream partition, in (partition, offset) order, with a clock at or past ``due``; with its
    place there (``jobs.transitions.AT_EVENT``; ``order``: each rule's place in the evaluator's
    per-event order).

    At one event the evaluator's timer runs go by due, then state key: one group's run
    evaluates every window the clock closed, from the earliest (transition or not), so its
    due is the least of its evaluations placed at that event."""
    ev = clocked(decoded, stream_of(plan, rule))
    placed = at_clock(ev, alerts.withColumnRenamed("sk", "__sk"), "due")
    run = Window.partitionBy("__sk", "skey", "__at")
    placed = placed.withColumn("__run", F.min("due").over(run)).where(F.col("value").isNotNull())
    return placed.select(
        F.lit("alert").alias("kind"),
        F.lit(ALERTS).alias("topic"),
        F.col("key"),
        F.col("value"),
        F.col("__at.__part").alias("part"),
        F.col("__at.__offset").alias("offset"),
        F.lit(0).alias("idx"),
        F.col("rule"),
        F.col("status"),
        F.col("alert_id"),
        *at_event(order[rule.id], BEFORE, F.col("__run"), F.col("skey"), F.col("seq")),
    )


def native_output(
    decoded: DataFrame, plan: SparkPlan, rules: Sequence[CompiledRule], found: NativePartitions,
    order: Mapping[str, int],
) -> DataFrame | None:  # fmt: skip
    """The output rows (``jobs.state.OUTPUT_SCHEMA``) of every rule of ``rules``, each on
    its stream keys that :func:`native_partitions` did not leave to the stream path, with
    their place among their event's rows (``jobs.transitions.AT_EVENT``; ``order``: each
    rule's place in the evaluator's per-event order)."""
    partitions = int(decoded.sparkSession.conf.get("spark.sql.shuffle.partitions") or "2")
    out: DataFrame | None = None
    for rule in rules:
        mine = found.stream_path.get(rule.id, frozenset())
        windows = closed_windows(decoded, plan, rule, mine)
        step = LifecycleStep(rule, found.jumps.get(rule.id, {}))
        stepped = windows.repartition(partitions, "__sk", "__g").mapInArrow(step, _STEP_DDL)
        rows = placed_at_events(stepped, decoded, plan, rule, order)
        late = late_events(decoded, plan, rule, mine)
        rows = rows.unionByName(late_count(late, rule.id, order[rule.id]))
        if rule.rule.late_policy == "side":
            rows = rows.unionByName(late_rows(late, rule, order[rule.id]))
        out = rows if out is None else out.unionByName(rows)
    return out
