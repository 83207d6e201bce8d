"""Backtests on Spark: the streaming plan as a batch job over a JSON-lines file or a topic range.

The output is the Faust-engine backtest's (``app.backtest``): one JSON line
per alert transition (``backtest_line``), in event order and, per event, the evaluator's
order (``jobs.transitions.AT_EVENT``, whichever plan gave the transition); problems read
``NAME:LINE: reason``; the report counts valid events in the time range, invalid lines and
transitions. The same decode, conditions and
lifecycle code run as in the streaming job; only the stateful operator is
``applyInPandas`` with empty initial state instead of ``applyInPandasWithState``,
and tumbling and hopping rules run natively where that is exact (``jobs.windows``:
clock, lateness and aggregates in Spark SQL, the lifecycle on closed windows only), and
so do threshold rules (``jobs.thresholds``: conditions, lateness and the rows that cannot
change an alert in Spark SQL, ``ThresholdLogic`` on the rest).

A topic range reads every partition from earliest to the high watermark at
start, in record-timestamp order like the Faust-engine topic backtest.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import orjson
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from app.alerts import Alert
from app.backtest import BacktestReport, TimeRange, record_place
from app.events import SCHEMAS, dlq_holds
from app.rules.loader import RuleSet
from app.runtime.settings import env_choice
from app.tables import Tables
from app.topics import SOURCE_OF_TOPIC
from jobs import absence, event_alerts, thresholds
from jobs.compile import SparkPlan, plan_rules, tasks
from jobs.decode import ARRIVAL, Decoder
from jobs.fastdecode import decode, decode_mode
from jobs.held import holding
from jobs.kafka_source import read_kafka
from jobs.state import apply_lifecycle
from jobs.streams import StreamRunner, router, stream_key
from jobs.transitions import AT_EVENT, placed_by_idx
from jobs.windows import clock_chunk, native_output, native_partitions, native_rules

logger = logging.getLogger(__name__)

#: what picks a backtest command's plans (:func:`plans_mode`)
PLANS_ENV = "APP_SPARK_BACKTEST_PLANS"
PLANS = {
    "evaluator": "every rule through the evaluator per stream partition",
    "native": "the kinds Spark SQL reproduces exactly in the JVM",
}

#: a line that ``bytes.strip`` empties (ASCII whitespace), which the Faust-engine backtest skips;
#: ``\z``, not ``$``, which in Java also matches before a last U+2028 or U+0085 (not blank)
BLANK_LINE = r"\A[ \t\n\r\x0B\f]*\z"


def file_records(spark: SparkSession, path: Path) -> DataFrame:
    """The lines of ``path`` as raw records: partition 0, offset = line index (from 0).

    Numbered in the JVM, no row through Python: a split of the file is one input
    partition, in file order, and ``monotonically_increasing_id`` is (partition << 33)
    + the row's place in it, so a line's index is the line count of the partitions
    before its own (one small job) plus that place.

    The lines are those the Faust-engine backtest reads (``app.backtest.read_events``, the
    file in binary): split at ``\n`` only (Spark's default also splits at a lone ``\r``,
    which made two events of one invalid line and moved every later line number), each
    line's very bytes (read as text, a line that is not UTF-8 had its bad bytes replaced
    and was accepted), and a line of ASCII whitespace alone is skipped, not counted as
    invalid (it keeps its number)."""
    lines = (
        spark.read.option("lineSep", "\n")
        .text(str(path))
        .select("value", F.spark_partition_id().alias("__p"), F.monotonically_increasing_id().alias("__id"))
    )
    counts = {r["__p"]: r["count"] for r in lines.groupBy("__p").count().collect()}
    before, start = 0, F.lit(0).cast("long")
    for p in sorted(counts):
        start = F.when(F.col("__p") == p, F.lit(before).cast("long")).otherwise(start)
        before += counts[p]
    offset = start + F.col("__id") - F.shiftleft(F.col("__p").cast("long"), 33)
    raw = lines.where(~F.col("value").rlike(BLANK_LINE)).select(
        F.lit(None).cast("string").alias("topic"),
        F.lit(0).cast("int").alias("partition"),
        offset.alias("offset"),
        F.col("value").cast("binary").alias("value"),  # the line's bytes, as they are
    )
    return _spread(spark, raw)


class KeptInput:
    """A watched backtest's input file (``backtest --engine spark --watch``), kept between its
    runs in the session: its records, and its decoded rows in Spark's cache.

    A run after an edit of the rules reads the file again only if it changed (its size,
    modification time or inode), and decodes it again only if the edit changed what the
    decoder does: its routing (the rules' streams: source, stream, grouping fields), the
    emulated partition count, ``--source``, the time range or the decode mode. Tuning a
    condition, a window or a severity changes none of those, so such a run starts from the
    cached rows: no read, no decode (docs/spark.md, "A backtest that watches its rules").
    :meth:`release` frees the cache (the command's end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.decodes = 0  # how many times the rows were decoded (tests, the log)
        self._stamp: tuple[int, int, int] | None = None
        self._records: DataFrame | None = None
        self._decoded: tuple[tuple[Any, ...], DataFrame] | None = None

    def records(self, spark: SparkSession) -> DataFrame:
        """The file's records (:func:`file_records`): those of the last run while it is unchanged."""
        st = self.path.stat()
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        if self._records is None or stamp != self._stamp:
            self.release()
            self._records, self._stamp = file_records(spark, self.path), stamp
        return self._records

    def decoded(self, key: tuple[Any, ...], build: Callable[[], DataFrame]) -> DataFrame:
        """``build()`` cached, or the last run's cached rows if they were built for ``key``."""
        if self._decoded is not None and self._decoded[0] == key:
            logger.info("backtest: the input decoded for the last run is read again from the cache")
            return self._decoded[1]
        if self._decoded is not None:
            self._decoded[1].unpersist()
        self._decoded = (key, build().cache())
        self.decodes += 1
        return self._decoded[1]

    def release(self) -> None:
        if self._decoded is not None:
            self._decoded[1].unpersist()
        self._records = self._stamp = self._decoded = None


def unreadable_file(exc: BaseException) -> str | None:
    """Why Spark could not read the input file (a damaged ``.gz``: its first job fails with
    ``FAILED_READ_FILE``), as the deepest cause's one line; None for any other error."""
    text = str(exc)
    if "FAILED_READ_FILE" not in text:
        return None
    causes = [line for line in text.splitlines() if line.startswith("Caused by: ")]
    return causes[-1].removeprefix("Caused by: ") if causes else text.splitlines()[0]


def _spread(spark: SparkSession, raw: DataFrame) -> DataFrame:
    """Spread the records over every core for the decoder (a file of less than one split is
    one partition); order does not matter past this point: every stateful step sorts its
    rows by (partition, offset)."""
    cores = spark.sparkContext.defaultParallelism
    return raw.repartition(cores) if raw.rdd.getNumPartitions() < cores else raw


def topic_records(
    spark: SparkSession, bootstrap: str, topics: list[str], security: Mapping[str, str] | None = None
) -> DataFrame:
    """Every record of ``topics`` from the earliest offset to the latest at start, Kafka-shaped
    (``timestamp``, ``topic``, ``partition``, ``offset``, ``value``) for :func:`ordered_records`,
    which orders them as the Faust-engine topic backtest does."""
    opts = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": ",".join(topics),
        "startingOffsets": "earliest",
        "endingOffsets": "latest",
        **(security or {}),  # the role's TLS/SASL as kafka.* options (KafkaAuth.spark_options)
    }
    return read_kafka(spark, opts, streaming=False)


def _position() -> Column:
    """A Kafka-shaped record's place in the topic backtest's order (from 0)."""
    return F.row_number().over(Window.orderBy("timestamp", "topic", "partition", "offset")) - 1


def ordered_records(spark: SparkSession, records: DataFrame) -> DataFrame:
    """Kafka-shaped records (``timestamp``, ``topic``, ``partition``, ``offset``, ``value``:
    a topic range, or the archive's rows) as raw records in the topic backtest's order:
    record timestamp, then topic, partition, offset; partition 0, offset = position."""
    raw = records.select(
        "topic",
        F.lit(0).cast("int").alias("partition"),
        _position().cast("long").alias("offset"),
        "value",
        F.unix_millis("timestamp").alias(ARRIVAL),  # where a time range places a dead letter
    )
    return _spread(spark, raw)


#: per position in a range, where its record came from (``app.backtest.record_place``) and its value
Places = Callable[[list[int]], Mapping[int, tuple[str, bytes]]]


def record_places(records: DataFrame, positions: list[int]) -> dict[int, tuple[str, bytes]]:
    """Where the records at ``positions`` of :func:`ordered_records`'s order came from, as the
    Faust engine names an invalid record (``app.backtest.record_place``: topic, partition,
    offset), with each one's value. One more job over the records, run only when a range has
    dead letters to name. It reads the records again: a topic that grew meanwhile with a record
    stamped before others moves their positions, so :func:`report_rows` names a record by its
    place only when its value is the dead letter's."""
    if not positions:
        return {}
    placed = records.select("topic", "partition", "offset", "value", _position().alias("__position"))
    found = placed.where(F.col("__position").isin(sorted(set(positions)))).collect()
    return {
        r["__position"]: (record_place(r["topic"], r["partition"], r["offset"]), bytes(r["value"] or b""))
        for r in found
    }


def idle_stream_keys(plan: SparkPlan, fallback: Mapping[str, frozenset[str]], partitions: int) -> set[str]:
    """The stream keys whose every rule runs natively there (``fallback``: rule id -> the
    keys where it does not): their stream-path tasks would evaluate nothing."""
    idle: set[str] = set()
    for spec in plan.streams:
        if not spec.rule_ids or not all(rid in fallback for rid in spec.rule_ids):
            continue
        needed = set().union(*(fallback[rid] for rid in spec.rule_ids))
        idle |= {k for p in range(partitions) if (k := stream_key(spec.name, p)) not in needed}
    return idle


def lifecycle_tasks(decoded: DataFrame, plan: SparkPlan, idle: set[str], partitions: int) -> DataFrame:
    """The task rows (``jobs.compile.tasks``) left to the evaluator: none on an ``idle`` stream
    key. When every stream key is idle and no rule takes the keyed path, the only ones left
    are the invalid records' (their dead-letter rows): the valid events are not turned into
    tasks only to be dropped."""
    every = {stream_key(s.name, p) for s in plan.streams for p in range(partitions)}
    if not plan.rules and every <= idle:
        return tasks(decoded.where(F.col("__dlq").isNotNull()), plan)
    work = tasks(decoded, plan)
    return work.where(~F.col("__key").isin(sorted(idle))) if idle else work


def plans_mode(env: Mapping[str, str] | None = None) -> str:
    """The plans of a ``backtest --engine spark`` command, from ``APP_SPARK_BACKTEST_PLANS``:
    ``evaluator`` (the default) runs every rule as the streaming query does, through the
    evaluator's own code per stream partition (or on the keyed path); ``native`` runs tumbling and
    hopping windows, thresholds, absence, new terms and changes as Spark SQL where that is exact
    (``jobs.windows``, ``jobs.thresholds``, ``jobs.absence``, ``jobs.event_alerts``). Both give
    the same output. On two cores the native plans took 1.5 to 1.8 times as long (each is its
    own shuffles and sorts over every event, against one pass through the compiled evaluator);
    they spread over every core, where the evaluator runs each stream partition on one, so they
    can pay only with several times more cores than stream partitions (docs/spark.md)."""
    return env_choice(PLANS_ENV, PLANS, env)


def run_backtest(
    spark: SparkSession,
    ruleset: RuleSet,
    raw: DataFrame,
    name: str,
    out: TextIO,
    report: BacktestReport,
    *,
    source: str | None = None,
    time_from: str | None = None,
    time_to: str | None = None,
    lines: bool = True,
    partitions: int = 1,
    tables: Tables | None = None,
    max_skew_ms: int = -1,
    native_windows: bool = True,
    native_thresholds: bool = True,
    native_absence: bool = True,
    native_event_alerts: bool = True,
    native_decode: bool | None = None,
    places: Places | None = None,
    kept: KeptInput | None = None,
) -> list[Alert]:
    """Evaluate every rule of ``ruleset`` over ``raw``, whatever its ``engine:`` says (the
    Faust-engine backtest runs the ``faust``/``both`` ones); write transitions to ``out``.
    Raises :class:`app.errors.RuleConfigError` naming each rule Spark cannot run and why.

    ``name`` prefixes problems: ``name:LINE`` when ``lines`` (a file read with
    :func:`file_records`); else a record of a range (:func:`ordered_records`) is where
    ``places`` says (:func:`record_places`), or ``name record N`` without it.
    ``partitions`` and ``tables`` are the Faust-engine backtest's: the partition
    count whose per-partition clocks are emulated, and the registry rows; ``max_skew_ms``
    its time bound (APP_MAX_EVENT_SKEW, -1: off; on, every rule takes the stream path).
    ``native_windows``: tumbling and hopping rules that ``jobs.windows`` can run natively
    do so, on the stream partitions where that is exact (False: the stream path for all);
    ``native_thresholds`` the same for threshold rules (``jobs.thresholds``; False: the keyed
    or the stream path, as planned); ``native_absence`` the same for absence rules
    (``jobs.absence``; False: the stream path), ``native_event_alerts`` for new-term and change
    rules (``jobs.event_alerts``). ``native_decode``: the records the worker's decoder
    keeps unchanged are decoded in the JVM (``jobs.fastdecode``); None: as
    ``APP_SPARK_DECODE`` says (default ``python``: every record through the compiled
    Python decoder, which a one-shot command's cold JVM does not beat, docs/spark.md).
    ``kept``: ``raw`` is that file's records (:meth:`KeptInput.records`), and the decoded rows
    are kept in its cache for the next run, or taken from it (``backtest --watch``).
    """
    within = TimeRange.of(time_from, time_to)
    plan = plan_rules(ruleset, keyed_path=max_skew_ms < 0, every_rule=True)
    chunk = clock_chunk(spark.sparkContext.defaultParallelism, partitions)
    plan = dataclasses.replace(plan, clock_chunk=chunk)
    native = native_rules(plan) if native_windows else []
    native_thr = thresholds.native_rules(plan) if native_thresholds else []
    native_abs = absence.native_rules(plan) if native_absence else []
    native_nt = event_alerts.native_rules(plan) if native_event_alerts else []
    order = {r.id: i for i, r in enumerate(ruleset.rules)}
    planned = sorted([r.rule for r in plan.rules] + list(plan.stream_rules), key=lambda r: order[r.id])
    # each rule's place at one event: the keyed path's rules, then every other in the evaluator's order
    thr_idx = {rid: len(plan.rules) + i for rid, i in thresholds.evaluation_order(planned).items()}
    # per rule, the place of its stream's first rule (a stream partition's block where the bound held)
    first = {rid: min(thr_idx[r] for r in s.rule_ids) for s in plan.streams for rid in s.rule_ids}
    plan_all, plan = plan, thresholds.without(plan, frozenset(r.id for r in native_thr))
    routes = router(plan.streams, partitions, record_partitions=False)
    decoder = Decoder(topics=SOURCE_OF_TOPIC, source=source, router=routes, timed_dead_letters=True)
    if native_decode is None:
        native_decode = decode_mode() == "jvm"
    valid = F.col("__dlq").isNull()

    def decoded_rows() -> DataFrame:
        rows = decode(raw, decoder, native=native_decode)
        # every record where app.backtest.TimeRange places it: a dead letter's __ts_ms is its
        # readable ts or its record's stamp, and one with neither (a file's line) is in every range
        in_range = F.col("__ts_ms").isNull()
        if within.lo is not None or within.hi is not None:
            since = F.lit(True) if within.lo is None else F.col("__ts_ms") >= within.lo
            until = F.lit(True) if within.hi is None else F.col("__ts_ms") < within.hi
            rows = rows.where(in_range | (since & until))
        # then a dead letter's time and the stamps go: the plans read __ts_ms as an event's time
        # (clocks, maxima), and a backtest's order is its offsets' (jobs.state.arrival_order)
        return rows.withColumns(
            {"__ts_ms": F.when(valid, F.col("__ts_ms")), "__arrival": F.lit(None).cast("long")}
        )

    if kept is None:
        decoded = decoded_rows().cache()
        own = [decoded]  # released at the end
    else:  # what the decoder's output depends on, besides the file
        routing = tuple((s.source, s.name, s.fields) for s in plan.streams)
        key = (routing, partitions, source, native_decode, within.lo, within.hi)
        decoded, own = kept.decoded(key, decoded_rows), []  # kept for the next run
    with holding(*own):  # what several plans read is computed once (jobs.held)
        counts = decoded.groupBy(valid.alias("ok")).count().collect()
        report.events = sum(r["count"] for r in counts if r["ok"])
        # per native rule, the stream partitions where the evaluator must run it (jobs.windows)
        streamed = {r.id for r in plan.stream_rules}
        thr_stream = [r for r in native_thr if r.id in streamed]
        held_only = thr_stream + native_abs + native_nt
        found = native_partitions(decoded, plan, native, max_skew_ms, held_only=held_only)
        fallback = dict(found.stream_path)
        for rule in held_only:
            fallback.setdefault(rule.id, frozenset())
        if native:
            logger.info(
                "native windows: %s",
                ", ".join(f"{r.id} ({len(fallback[r.id])} partition(s) on the stream path)" for r in native),
            )
        if native_thr:
            said = [
                f"{r.id} ({len(fallback.get(r.id, ()))} partition(s) on the stream path)" for r in native_thr
            ]
            logger.info("native thresholds: %s", ", ".join(said))
        if native_abs:
            said = [f"{r.id} ({len(fallback[r.id])} partition(s) on the stream path)" for r in native_abs]
            logger.info("native absence: %s", ", ".join(said))
        if native_nt:
            said = [f"{r.id} ({len(fallback[r.id])} partition(s) on the stream path)" for r in native_nt]
            logger.info("native event alerts: %s", ", ".join(said))
        streams = StreamRunner(
            plan.stream_rules, plan.streams, partitions, tables=tables or Tables(), max_skew_ms=max_skew_ms,
            end_of_input=True, native=fallback,
        )  # fmt: skip
        result = placed_by_idx(
            apply_lifecycle(
                lifecycle_tasks(decoded, plan, idle_stream_keys(plan, fallback, partitions), partitions),
                plan, streaming=False, streams=streams,
            ),
            thr_idx, first,
        )  # fmt: skip
        extra = native_output(decoded, plan, native, found, thr_idx)
        if extra is not None:
            result = result.unionByName(extra)
        more = thresholds.native_output(decoded, plan_all, native_thr, fallback, thr_idx, tables)
        if more is not None:
            result = result.unionByName(placed_by_idx(more, thr_idx, first))
        silent = absence.native_output(decoded, plan, native_abs, fallback, tables, partitions, thr_idx)
        if silent is not None:
            result = result.unionByName(silent)
        novel = event_alerts.native_output(decoded, plan, native_nt, fallback, thr_idx)
        if novel is not None:
            result = result.unionByName(novel)
        # one order for the rows of every plan: the evaluator's at each event (jobs.transitions)
        rows = in_output_order(result.collect())
    return report_rows(rows, out, report, name, lines=lines, places=places)


#: the columns that order a backtest's output rows: the evaluator's order at each event
OUTPUT_ORDER = ("part", "offset", *AT_EVENT)


def in_output_order(rows: list[Any]) -> list[Any]:
    """``rows`` (Spark rows with :data:`OUTPUT_ORDER`'s columns) sorted by those columns as
    Spark's ascending ``orderBy`` sorts them: NULL first, strings by their code points (UTF-8's
    byte order, which Spark compares).

    Sorted here, not by ``orderBy``: a global sort samples its input in a job of its own to
    split it into ranges, and that job ran the whole plan up to there, every rule's evaluator
    included, once more before the sort itself ran it (1.4 to 1.6 s of a 20 s backtest of the
    bench's 453,900 events). The output is a few rows per alert, which the driver collects
    anyway."""

    def key(row: Any) -> tuple[tuple[int, Any], ...]:
        return tuple((0, 0) if (v := row[c]) is None else (1, v) for c in OUTPUT_ORDER)

    return sorted(rows, key=key)


def report_rows(
    rows: Iterable[Any],
    out: TextIO,
    report: BacktestReport,
    name: str,
    *,
    lines: bool = True,
    places: Places | None = None,
) -> list[Alert]:
    """The output rows (``jobs.state.OUTPUT_SCHEMA``: Spark rows, or mappings, by column name),
    in order, into ``report``: each alert written to ``out`` (if its status is shown); routed
    copies, late copies, refused events, dead letters and rule errors counted, the dead
    letters and refusals as problems (``name``, ``lines``: as :func:`run_backtest`'s).

    A dead letter of a file is ``name:LINE``. One of a record range (``lines`` False) is where
    ``places`` says its position came from (:func:`record_places`: topic, partition, offset),
    and the range's dead letters come before its refusals, as the Faust engine lists them
    (it reads the whole range before it evaluates)."""
    rows = list(rows)
    at: Mapping[int, tuple[str, bytes]] = {}
    if not lines and places is not None:
        at = places([r["offset"] for r in rows if r["kind"] == "dlq"])
    alerts: list[Alert] = []
    refusals: list[str] = []
    for r in rows:
        if r["kind"] == "alert":
            alert = Alert.from_json(r["value"])
            alerts.append(alert)
            report.emit(out, alert)
        elif r["kind"] == "routed":
            report.routed += 1
        elif r["kind"] == "side":
            report.late += 1
        elif r["kind"] == "late":  # the events a rule could not use, counted per rule or task
            report.late_events += int(r["value"])
        elif r["kind"] == "error":  # a rule's evaluations that raised on the stream or keyed path
            report.count_rule_errors({r["rule"]: int(r["value"])})
        elif r["kind"] == "refused":
            record = orjson.loads(r["value"])
            fields = orjson.loads(record["raw"])
            report.refused += 1
            key = next((fields[s.key] for s in SCHEMAS.values() if s.key in fields), "")
            problem = f"refused {key} at {fields.get('ts')}: {record['reason']}"
            (report.problems if lines else refusals).append(problem)
        elif r["kind"] == "dlq":
            report.skipped += 1
            n, letter = r["offset"], orjson.loads(r["value"])
            place, value = at.get(n, ("", b""))
            if lines:
                where = f"{name}:{n + 1}"
            else:  # where it came from, if that is surely this record; else its place in the range
                where = place if place and dlq_holds(letter, value) else f"{name} record {n + 1}"
            report.problems.append(f"{where}: {letter['reason']}")
    report.problems.extend(refusals)
    return alerts
