"""The streaming job: Kafka -> decode -> native conditions -> per-group lifecycle -> Kafka.

One streaming query (``rules``) evaluates every rule with ``engine: spark`` or
``both``, reading the topics of their sources with the Kafka source chosen by
``APP_SPARK_KAFKA_FORMAT``. Its checkpoint (offsets, state, commits) lives in
``$APP_DATA_DIR/spark/checkpoints/<query>``, the sink's batch marker inside
it, so a restart, also after kill -9, resumes after the last committed
micro-batch with no lost alert and no new alert id. A new checkpoint starts
from ``startingOffsets`` (default ``earliest``, like the Faust worker's new
consumer group).

Lifecycle: :func:`run` blocks until ``stop`` is set or, with ``once``, until
everything available at start has been processed (``Trigger.AvailableNow``);
it then stops the query, the sink's producer and the session.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge
from py4j.protocol import Py4JError
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from app.errors import ConfigError
from app.kafka.admin import ensure_topics
from app.rules.evaluator import LATE_TOPIC
from app.rules.loader import RuleSet, check_rule_files, load_what_loads, log_rejection
from app.rules.retire import RulesRan, facts_of, rule_record
from app.rules.state import stamp
from app.runtime.settings import ENV_DOCS, Settings
from app.runtime.statefile import write_json
from app.topics import SOURCE_OF_TOPIC, SOURCE_TOPICS, TopicSpec
from jobs import connector
from jobs.compile import KEYED, STREAM, SparkPlan, plan_rules, tasks
from jobs.decode import ARRIVAL, Decoder
from jobs.fastdecode import decode, decode_mode
from jobs.kafka_source import CONNECTOR, kafka_format, read_kafka
from jobs.session import DEFAULT_MASTER, launched_jvm, quiet_spark, session_unless_stopped, wait_for_jvm
from jobs.sink import BatchMarker, KafkaSink
from jobs.state import (
    LEGACY_STATE_BUCKETS,
    LEGACY_STATE_CODEC,
    STATE_BUCKETS,
    STATE_CODEC,
    STATE_SCHEMAS,
    apply_lifecycle,
)
from jobs.streams import StreamRunner, router
from jobs.unread import GROUPS_FILE, Groups, retire_unread, unread_after

logger = logging.getLogger(__name__)

#: how long a stop waits for the running micro-batch to end (:func:`stop_between_batches`): within
#: the supervisor's 6 s grace, with the query's stop, the session's and the JVM's after it
STOP_WAIT_S = 2.0

QUERY = "rules"
EVENTS = Counter("spark_events_total", "Records read by the Spark engine's query (valid or not)")
BATCH_SECONDS = Gauge("spark_last_batch_seconds", "Trigger time of the last micro-batch")
RELOADS = Counter("spark_rule_reloads_total", "Rule file changes the Spark query followed", ["outcome"])
RESTARTS = Counter(
    "spark_query_restarts_total",
    "Streaming queries started again in their session after a Python worker missed its start",
    ["query"],
)
#: Spark gives a Python worker it starts outside its daemon (the ``kafka_py`` source's
#: streaming reader) 10 s to connect back to the JVM, a constant of its ``PythonWorkerFactory``
#: with no setting; on a loaded host the worker can miss it, and the query fails with this
WORKER_MISSED_ITS_START = "Python worker failed to connect back"
#: how many times in a row (no micro-batch completed between them) :class:`WorkerRestarts`
#: starts a query again after that; past them the role fails, and the supervisor restarts it
WORKER_RESTARTS = 3


@dataclass(frozen=True)
class EngineOptions:
    master: str | None = DEFAULT_MASTER
    rules: tuple[Path, ...] = ()
    once: bool = False
    trigger: str = "1 second"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = 200_000
    query: str = QUERY


def checkpoint_dir(settings: Settings, query: str = QUERY) -> Path:
    """The one checkpoint directory of ``query``."""
    return settings.data_dir / "spark" / "checkpoints" / query


def marker_path(settings: Settings, query: str = QUERY) -> Path:
    """The sink's batch marker lives in the checkpoint: deleting one resets both."""
    return checkpoint_dir(settings, query) / "_sink_marker.json"


def layout_path(settings: Settings, query: str = QUERY) -> Path:
    """The checkpoint's own record of how its state is laid out (:func:`state_layout`)."""
    return checkpoint_dir(settings, query) / "_layout.json"


def placement_path(settings: Settings, query: str = QUERY) -> Path:
    """The checkpoint's record of the path each rule's state lives on (:func:`read_placement`)."""
    return checkpoint_dir(settings, query) / "_placement.json"


def read_placement(settings: Settings, query: str = QUERY) -> dict[str, str]:
    """Where the query's rules ran until now (``jobs.compile.SparkPlan.placement``), which the
    next plan keeps for each rule in the same version (``jobs.compile.plan_rules``); empty for
    a checkpoint without the record (a new one, or one written before 2026-11-28: its rules
    take the paths their set gives them)."""
    path = placement_path(settings, query)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        rules = json.loads(raw)["rules"]
        if not isinstance(rules, dict) or any(p not in (KEYED, STREAM) for p in rules.values()):
            msg = f"expected {{rule@version: {KEYED!r} or {STREAM!r}}}"
            raise TypeError(msg)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        msg = (
            f"{path}: not a rule placement ({exc}); delete the file: the rules then take the paths "
            "their set gives them (a threshold rule that changes path starts from fresh state)"
        )
        raise ConfigError(msg) from exc
    return {str(k): str(v) for k, v in rules.items()}


@dataclass(frozen=True)
class StateLayout:
    """How a query's checkpoint keeps its state: the keyed path's buckets, the codec of each
    state group's value (``jobs.state.STATE_SCHEMAS``) and the parts each stream partition is
    split in (``jobs.streams.StreamRouter``)."""

    buckets: int
    codec: str
    split: int = 1

    def parts(self, plan: SparkPlan) -> int:
        """The parts ``plan``'s stream partitions run in: :attr:`split`, or 1 with no stream."""
        return self.split if plan.streams else 1


SPLIT_ENV = "APP_SPARK_STREAM_SPLIT"
#: the most parts a stream partition is split in (each part reads every event's time)
MAX_SPLIT = 16


def stream_split(env: Mapping[str, str] | None = None) -> int:
    """The parts a new checkpoint's stream partitions are split in, from ``APP_SPARK_STREAM_SPLIT``:
    a whole number from 1 (the default: not split) to :data:`MAX_SPLIT` (docs/spark.md, "A stream
    partition split over the cores")."""
    raw = (os.environ if env is None else env).get(SPLIT_ENV, "").strip() or ENV_DOCS[SPLIT_ENV][0]
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_SPLIT:
        msg = f"{SPLIT_ENV}={raw!r}: expected a whole number from 1 to {MAX_SPLIT}"
        raise ConfigError(msg)
    return value


def query_layout(settings: Settings, query: str = QUERY) -> StateLayout:
    """:func:`state_layout`, a new checkpoint's split from :func:`stream_split`."""
    return state_layout(settings, query, stream_split())


def state_layout(settings: Settings, query: str = QUERY, split: int | None = None) -> StateLayout:
    """How the query's checkpoint keeps its state, which a query must follow.

    Spark finds a bucket's state by its group key only: a query that hashed keys into another
    number of buckets than its checkpoint's would not find the state of most keys, and their
    alerts would start over; and it checks a state group's value against the schema it was
    written with; and a stream partition split in parts keeps its state in each part's group.
    So the checkpoint records all three (``_layout.json``) and a query always uses them:
    :data:`jobs.state.STATE_BUCKETS`, :data:`jobs.state.STATE_CODEC` and ``split`` for a new
    checkpoint; 64 buckets and JSON text for one written before checkpoints recorded a layout
    (one with offsets and no record); JSON text for a record with no codec (written before
    the codec was recorded), and no split for one with no split (written before 2026-12-01).
    ``split``: the configured one (:func:`stream_split`), for a new checkpoint (None: 1)."""
    path = layout_path(settings, query)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        offsets = checkpoint_dir(settings, query) / "offsets"
        if offsets.is_dir() and any(offsets.iterdir()):
            layout = StateLayout(LEGACY_STATE_BUCKETS, LEGACY_STATE_CODEC)
        else:
            layout = StateLayout(STATE_BUCKETS, STATE_CODEC, split or 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"state_buckets": layout.buckets, "state_codec": layout.codec, "stream_split": layout.split}
        write_json(path, record)
        return layout
    try:
        record = json.loads(raw)
        buckets, codec = record["state_buckets"], record.get("state_codec", LEGACY_STATE_CODEC)
        parts = record.get("stream_split", 1)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        msg = f"{path}: not a checkpoint layout ({exc!r}); delete the checkpoint {path.parent} to start anew"
        raise ConfigError(msg) from exc
    for name, value in (("state_buckets", buckets), ("stream_split", parts)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            msg = f"{path}: {name} must be a positive integer, not {value!r}"
            raise ConfigError(msg)
    if codec not in STATE_SCHEMAS:
        msg = f"{path}: state_codec must be one of {', '.join(sorted(STATE_SCHEMAS))}, not {codec!r}"
        raise ConfigError(msg)
    if split is not None and parts != split:
        logger.info(
            "the checkpoint %s splits each stream partition in %d part(s), which its query keeps "
            "(%s would give %d for a new one)", path.parent, parts, SPLIT_ENV, split,
        )  # fmt: skip
    return StateLayout(buckets, codec, parts)


#: at most this many rule versions in the checkpoint's record of the rules it ran
MAX_RULES_RAN = 1000


def rules_ran_path(settings: Settings, query: str = QUERY) -> Path:
    """The checkpoint's record of the rules its query ran (:func:`rules_ran`)."""
    return checkpoint_dir(settings, query) / "_rules.json"


def rules_ran(settings: Settings, query: str, plan: SparkPlan) -> RulesRan:
    """What the alerts of every rule version this checkpoint's query ran take from the rule, by
    rule id and state stamp, the plan's own added (and written back, the newest
    :data:`MAX_RULES_RAN` kept): with them a restored state of a rule that no longer runs ends
    its open alert (:mod:`app.rules.retire`), after a reload or a restart alike. A record that
    does not read is started anew, with a warning (its rules' alerts are then left to the
    operator, docs/rules.md)."""
    path = rules_ran_path(settings, query)
    ran: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        for record in json.loads(path.read_bytes())["rules"]:
            facts = facts_of(record)  # read, to refuse a record that would not make facts
            ran[(facts.rule_id, stamp(facts.version))] = record
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        logger.warning("%s does not read (%r): started anew", path, exc)
        ran = {}
    rules = [r.rule for r in plan.rules] + list(plan.stream_rules)
    if rules:
        for rule in rules:
            ran.pop((rule.id, stamp(rule.version)), None)  # the newest last
            ran[(rule.id, stamp(rule.version))] = rule_record(rule.facts, 0)
        ran = dict(list(ran.items())[-MAX_RULES_RAN:])
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"rules": list(ran.values())})
    return RulesRan(ran.values())


def records(
    spark: SparkSession, plan: SparkPlan, settings: Settings, opts: EngineOptions, split: int = 1
) -> DataFrame:
    """The streaming DataFrame of the plan's source records (``topic``, ``partition``,
    ``offset``, ``value``, and ``arrival``: Kafka's timestamp in milliseconds, the order in
    which a stream merges its events from several partitions, ``jobs.state``), read from
    Kafka with ``opts``' offsets and batch size.

    The query subscribes to every source topic, whatever the rules read, and drops the
    records of the others in the JVM (before any decode): a checkpoint whose query read a
    topic fails a query that no longer subscribes to it (Spark takes its partitions for
    deleted ones: "Some data may have been lost"), so a rule set that stopped reading a
    source (an edit, a reload) could not resume its checkpoint. With stream partitions split
    in ``split`` parts, Spark's connector reads each topic partition in as many tasks
    (``minPartitions``), so the decode is not limited to the topic's partitions either."""
    options = {
        "kafka.bootstrap.servers": settings.bootstrap_servers,
        "subscribe": ",".join(sorted(SOURCE_TOPICS.values())),
        "startingOffsets": opts.starting_offsets,
        **settings.kafka_auth.spark_options(),
    }
    if opts.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(opts.max_offsets_per_trigger)
    if split > 1 and kafka_format() == CONNECTOR:
        options["minPartitions"] = str(settings.partitions * split)
    kafka = read_kafka(spark, options, streaming=True).where(F.col("topic").isin(plan.topics))
    return kafka.select("topic", "partition", "offset", "value", F.unix_millis("timestamp").alias(ARRIVAL))


def decoded(raw: DataFrame, plan: SparkPlan, settings: Settings, split: int = 1) -> DataFrame:
    """``raw`` records decoded as the worker decodes them (``jobs.decode.DECODED_SCHEMA``),
    each with the stream keys of the partitions (or their parts, ``split``) that evaluate it;
    in the JVM where it can be and ``APP_SPARK_DECODE=jvm`` (``jobs.fastdecode``)."""
    routes = router(plan.streams, settings.partitions, record_partitions=True, split=split)
    decoder = Decoder(topics=SOURCE_OF_TOPIC, router=routes)
    return decode(raw, decoder, native=decode_mode() == "jvm")


def build_stream(
    spark: SparkSession, plan: SparkPlan, settings: Settings, opts: EngineOptions,
    ran: RulesRan, layout: StateLayout, stale: Mapping[str, bytes] | None = None,
) -> DataFrame:  # fmt: skip
    """The streaming DataFrame of output rows (``jobs.state.OUTPUT_SCHEMA``); ``ran``: the
    rules the checkpoint's query ran (:func:`rules_ran`), ``layout``: its checkpoint's
    (:func:`query_layout`), ``stale``: the groups a start swept (:mod:`jobs.unread`)."""
    split = layout.parts(plan)
    events = decoded(records(spark, plan, settings, opts, split), plan, settings, split)
    streams = StreamRunner(
        plan.stream_rules, plan.streams, settings.partitions, bootstrap=settings.bootstrap_servers,
        security=settings.kafka_auth.spark_options(), max_skew_ms=settings.max_event_skew_ms, ran=ran,
        split=split,
    )  # fmt: skip
    return apply_lifecycle(
        tasks(events, plan, settings.partitions, split), plan, streaming=True, streams=streams,
        buckets=layout.buckets, codec=layout.codec, ran=ran, stale=stale,
    )  # fmt: skip


async def ensure_output_topics(plan: SparkPlan, settings: Settings) -> list[str]:
    """Create the branch topics and ``events.late`` the plan may write (as the worker does)."""
    names = {LATE_TOPIC} if plan.stream_rules else set()
    for r in plan.stream_rules:
        names |= {topic for _, topic in (r.parts.arms if r.parts else ())}
    specs = tuple(TopicSpec(n, key="") for n in sorted(names))
    return await ensure_topics(settings, settings.partitions, settings.replication_factor, specs)


def start(
    spark: SparkSession, plan: SparkPlan, settings: Settings, opts: EngineOptions
) -> tuple[StreamingQuery, KafkaSink]:
    """Start the query; the caller owns both results and must stop them. The checkpoint records
    where the plan's rules run (:func:`read_placement`); a plan of no rule (the query that
    :func:`skip_unruled` runs) leaves the record of the rules before it."""
    path = placement_path(settings, opts.query)
    path.parent.mkdir(parents=True, exist_ok=True)
    if plan.rule_count:
        write_json(path, {"rules": plan.placement()})
    sink = KafkaSink(settings, BatchMarker(marker_path(settings, opts.query)))
    try:
        ran = rules_ran(settings, opts.query, plan)
        layout = query_layout(settings, opts.query)
        # the groups this plan will not read end their open alerts now (not the query of no rule
        # that reads past: the rules' query after it does)
        stale = end_unread(spark, plan, settings, opts, ran, sink, layout) if plan.rule_count else {}
        writer = (
            build_stream(spark, plan, settings, opts, ran, layout, stale)
            .writeStream.queryName(opts.query)
            .foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint_dir(settings, opts.query)))
            .outputMode("append")
        )
        once, every = opts.once, opts.trigger
        writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=every)
        query = writer.start()
    except Exception:
        sink.close()
        raise
    if not plan.rule_count:
        logger.info(
            "spark query %r started with no rule, to read past what came while there was none",
            opts.query,
        )
        return query, sink
    split = layout.parts(plan)
    logger.info(
        "spark query %r started: %d rule(s) on %s, checkpoint %s%s",
        opts.query,
        plan.rule_count,
        ", ".join(plan.topics),
        checkpoint_dir(settings, opts.query),
        f", each stream partition in {split} parts" if split > 1 else "",
    )
    return query, sink


def end_unread(
    spark: SparkSession, plan: SparkPlan, settings: Settings, opts: EngineOptions, ran: RulesRan,
    sink: KafkaSink, layout: StateLayout | None = None,
) -> dict[str, bytes]:  # fmt: skip
    """End the open alerts of the state groups ``plan`` will not read, through ``sink``
    (:func:`jobs.unread.retire_unread`); the swept groups' digests. ``layout``: the
    checkpoint's, if the caller read it already (:func:`query_layout`)."""
    checkpoint = checkpoint_dir(settings, opts.query)
    layout = layout or query_layout(settings, opts.query)
    return retire_unread(
        spark, plan, checkpoint, settings.partitions, layout.codec, ran, sink.publish, layout.split
    )


def spark_rules(ruleset: RuleSet) -> list[tuple[str, str]]:
    """What the Spark engine runs of ``ruleset``: its rules for ``spark`` or ``both``, by id and
    version, in order."""
    return [(r.id, r.version) for r in ruleset.rules if r.runs_on("spark")]


class RuleFollower:
    """The rule files of a streaming query, checked as the worker checks them (every second
    of :func:`_watch`): a valid change that changes what Spark runs is a new plan; an invalid
    one is logged, once, and the last good rules keep running (``docs/spark.md``)."""

    def __init__(self, paths: list[Path], keyed_path: bool, placed: dict[str, str] | None = None) -> None:
        self.paths = paths
        self.keyed_path = keyed_path
        #: where the running query's rules run (the checkpoint's record): the next plan keeps it
        self.placed: dict[str, str] = placed or {}
        # as the worker starts: with the files that load, if not all do; fixing one brings the
        # whole set in at the next check (the role crashed, and the supervisor gave it up)
        self.running, rejected, error = load_what_loads(paths)
        #: the files' hashes of the last rejected change (not parsed again until one changes)
        self.rejected: dict[str, str] | None = rejected
        if error is not None:
            RELOADS.labels("rejected").inc()
            log_rejection(logger, " at start; the spark query starts with the valid ones", error)
        #: the plan of a change to follow, until :meth:`take`
        self.pending: SparkPlan | None = None

    def plan(self) -> SparkPlan:
        return plan_rules(self.running, keyed_path=self.keyed_path, placed=self.placed)

    def changed(self) -> bool:
        """Whether the files changed what Spark runs (the new plan is :attr:`pending`, which a
        postponed reload leaves there: then True until it is taken)."""
        if self.pending is not None:
            return True
        check = check_rule_files(self.paths, self.running, self.rejected)
        self.rejected = check.rejected
        if check.error is not None:
            RELOADS.labels("rejected").inc()
            log_rejection(logger, ", the spark query keeps the last good rules", check.error)
            return False
        ruleset = check.ruleset
        if ruleset is None:
            return False
        before, self.running, self.rejected = spark_rules(self.running), ruleset, None
        if spark_rules(ruleset) == before:
            return False  # a Faust-only rule or a comment: nothing for Spark
        self.pending = self.plan()
        return True

    def take(self) -> SparkPlan | None:
        plan, self.pending = self.pending, None
        return plan

    def wait_for_rules(self, stop: threading.Event) -> SparkPlan | None:
        """Block until the files give Spark a rule (its plan) or ``stop`` (None)."""
        while not stop.wait(1):
            if self.changed():
                plan = self.take()
                if plan is not None and plan.rule_count:
                    return plan
        return None


def run(settings: Settings, opts: EngineOptions, stop: threading.Event) -> int:
    """Run the engine until ``stop`` (or, with ``once``, until caught up). Returns an exit code.

    A streaming run follows the rule files (:class:`RuleFollower`): a valid change to what
    Spark runs stops the query between micro-batches and starts it again on the same
    checkpoint with the new rules; with no rule left for Spark it waits for one."""
    if not settings.bootstrap_servers:
        logger.error(
            "KAFKA_BOOTSTRAP_SERVERS is not set; start the system with `make run` or point it at Kafka"
        )
        return 2
    paths = list(opts.rules) or [settings.rules_dir]
    follower = RuleFollower(
        paths, keyed_path=settings.max_event_skew_ms < 0, placed=read_placement(settings, opts.query)
    )
    plan = follower.plan()
    idle = not plan.rule_count
    spark: SparkSession | None = None
    jvm = None
    if idle and not opts.once and holds_groups(settings, opts.query, plan):
        # its last query left state groups that no query reads now: their alerts end before
        # the wait, in the session the rules that come later will run in
        _preflight(opts)
        spark, jvm = _session(opts, stop)
        if spark is None:
            return 0
        try:
            sink = KafkaSink(settings, BatchMarker(marker_path(settings, opts.query)))
            try:
                end_unread(spark, plan, settings, opts, rules_ran(settings, opts.query, plan), sink)
            finally:
                sink.close()
        except BaseException:
            shut_down(None, spark, jvm, stop)
            raise
    if idle:
        logger.warning("no rule has engine: spark or both; the Spark engine has nothing to do")
        found = None if opts.once else follower.wait_for_rules(stop)
        if found is None:
            if spark is not None:
                shut_down(None, spark, jvm, stop)
            return 0
        plan = found
    if spark is None:
        _preflight(opts)
    try:
        asyncio.run(ensure_output_topics(plan, settings))
    except BaseException:
        if spark is not None:
            shut_down(None, spark, jvm, stop)
        raise
    if spark is None:
        spark, jvm = _session(opts, stop)
        if spark is None:
            return 0
    failure = skip_unruled(spark, settings, opts, stop) if idle else None
    if failure is not None or stop.is_set():
        shut_down(None, spark, jvm, stop)
        return outcome(failure, stop, opts.query)
    try:
        failure = serve(spark, plan, settings, opts, follower, stop)
    finally:
        shut_down(None, spark, jvm, stop)
    return outcome(failure, stop, opts.query)


def serve(
    spark: SparkSession, plan: SparkPlan, settings: Settings, opts: EngineOptions,
    follower: RuleFollower | None, stop: threading.Event,
) -> BaseException | None:  # fmt: skip
    """Run the rules' query of ``plan`` in ``spark`` until ``stop`` (or, with ``once``, until
    caught up), following the rule files' changes with a ``follower`` (:func:`_reload`), and
    starting the query again on its checkpoint after a Python worker missed its start
    (:class:`WorkerRestarts`). Returns how it failed, or None; the query and its sink are
    stopped, the session is not."""
    query, sink = start(spark, plan, settings, opts)
    following = None if opts.once else follower
    if follower is not None:
        follower.placed = plan.placement()
    restarts = WorkerRestarts(opts.query)
    try:
        while True:
            failure = watch(query, stop, following)
            if restarts.allow(failure, query, stop):
                sink.close()
                query, sink = start(spark, plan, settings, opts)
                continue
            if failure is not None or stop.is_set() or following is None or following.pending is None:
                return failure
            query, sink, failure, plan = _reload(spark, settings, opts, following, query, sink, stop, plan)
            if failure is not None:
                return failure
    finally:
        _quietly(lambda: stop_between_batches(query))
        _quietly(sink.close)


def _preflight(opts: EngineOptions) -> None:
    """What the role refuses before it makes topics or starts a JVM."""
    if opts.master:  # under spark-submit (master None) its --jars bring the connector
        connector.require(kafka_format())
    decode_mode()  # a wrong APP_SPARK_DECODE


def _session(
    opts: EngineOptions, stop: threading.Event
) -> tuple[SparkSession | None, subprocess.Popen[bytes] | None]:
    """The role's session and the JVM it launched (None, None: a stop came while it started)."""
    spark = session_unless_stopped(stop, opts.master)
    return (spark, launched_jvm()) if spark is not None else (None, None)


def holds_groups(settings: Settings, query: str, plan: SparkPlan) -> bool:
    """Whether the checkpoint's state may hold groups that ``plan`` (the role's plan of no rule)
    leaves unread: its record of the groups its last query read names some (or there is no
    record), and it has a state store."""
    checkpoint = checkpoint_dir(settings, query)
    before = Groups.read(checkpoint / GROUPS_FILE)
    return (checkpoint / "state").is_dir() and unread_after(before, plan)


#: how many of a query's micro-batch progress reports it keeps (``recentProgress``)
PROGRESS_KEPT = "spark.sql.streaming.numRecentProgressUpdates"
#: the skip's own: a report per micro-batch of up to ``maxOffsetsPerTrigger`` records
SKIP_PROGRESS_KEPT = 1_000_000


def skip_unruled(
    spark: SparkSession, settings: Settings, opts: EngineOptions, stop: threading.Event
) -> BaseException | None:
    """Read past the records that came while Spark had no rule, as a worker with no rules reads
    past them: rules that come back evaluate what arrives from then on, not a backlog of events
    no rule ran on (with old event times: their alerts would be raised, and mostly resolved, late).

    The query of no rule runs once on the checkpoint (``Trigger.AvailableNow``): it reads every
    source topic up to its end and drops each record in the JVM, before any decode, and commits
    that; the rules' query then resumes there. A checkpoint that has read nothing yet has nothing
    to read past: a new query starts at ``startingOffsets``, as a worker's new consumer group
    does. Returns how the query of no rule failed, or None (also when a stop cut it short)."""
    offsets = checkpoint_dir(settings, opts.query) / "offsets"
    if not offsets.is_dir() or not any(offsets.iterdir()):
        return None
    # the count logged below sums every micro-batch's progress: keep them all (a query keeps
    # its last 99 by default, 20 million records at 200,000 a batch). The query's thread reads
    # the setting from the session as it starts running, so it stays set until the query ends
    # (no other query runs in this driver meanwhile)
    kept = spark.conf.get(PROGRESS_KEPT, None)
    spark.conf.set(PROGRESS_KEPT, str(SKIP_PROGRESS_KEPT))
    skipped = 0
    restarts = WorkerRestarts(opts.query)
    try:
        while True:
            query, sink = start(spark, plan_rules(RuleSet()), settings, dataclasses.replace(opts, once=True))
            try:
                failure = watch(query, stop)
            finally:
                _quietly(functools.partial(stop_between_batches, query))
                sink.close()
            skipped += sum(p["numInputRows"] for p in query.recentProgress)
            if not restarts.allow(failure, query, stop):
                break
    finally:
        if kept is None:
            spark.conf.unset(PROGRESS_KEPT)
        else:
            spark.conf.set(PROGRESS_KEPT, kept)
    if failure is None and not stop.is_set():
        logger.info(
            "read past %d record(s) that came while the Spark engine had no rule: its rules evaluate "
            "the events that arrive from now on, as a worker with no rules skips them", skipped,
        )  # fmt: skip
    return failure


def _reload(
    spark: SparkSession, settings: Settings, opts: EngineOptions, follower: RuleFollower,
    query: StreamingQuery, sink: KafkaSink, stop: threading.Event, running: SparkPlan,
) -> tuple[StreamingQuery, KafkaSink, BaseException | None, SparkPlan]:  # fmt: skip
    """The query again with :attr:`RuleFollower.pending`'s rules, on the same checkpoint (state,
    offsets and the sink's marker go on): the old one stopped between micro-batches first. With
    no rule left, it waits for one, then reads past what came meanwhile (:func:`skip_unruled`:
    its failure is the third result). The fourth is the plan the query runs now (``running``
    when the reload is postponed)."""
    plan = follower.take()
    assert plan is not None  # noqa: S101 - run() calls this for a pending plan only
    try:
        asyncio.run(ensure_output_topics(plan, settings))  # before the stop: a failure keeps it running
    except Exception as exc:  # the broker's trouble, not the files': tried again at the next tick
        logger.warning("rules reload postponed, the new rules' topics could not be created: %r", exc)
        follower.pending = plan
        return query, sink, None, running
    stop_between_batches(query)
    try:
        if not plan.rule_count:  # no group is read while the query waits: their alerts end now
            end_unread(spark, plan, settings, opts, rules_ran(settings, opts.query, plan), sink)
    finally:
        sink.close()
    if not plan.rule_count:
        logger.warning("no rule has engine: spark or both any more; the query waits for one")
        found = follower.wait_for_rules(stop)
        if found is None:
            return query, sink, None, plan  # both stopped; serve's last calls do nothing
        plan = found
        failure = skip_unruled(spark, settings, opts, stop)
        if failure is not None or stop.is_set():
            return query, sink, failure, plan
        asyncio.run(ensure_output_topics(plan, settings))
    query, sink = start(spark, plan, settings, opts)
    follower.placed = plan.placement()
    RELOADS.labels("applied").inc()
    logger.info(
        "reloaded the spark query's rules: %s",
        ", ".join(f"{rid}@{version}" for rid, version in spark_rules(follower.running)),
    )
    return query, sink, None, plan


def watch(
    query: StreamingQuery,
    stop: threading.Event,
    follower: RuleFollower | None = None,
    meters: tuple[Counter, Gauge] = (EVENTS, BATCH_SECONDS),
) -> BaseException | None:
    """Block while the query runs (:func:`_watch`); return how it failed, or None. Its
    records and its last micro-batch's time go to ``meters`` (the rules query's by default).

    A failure may surface as the query's ``exception()`` or raised by
    ``awaitTermination`` (a :class:`StreamingQueryException`: e.g. a SIGTERM to the
    process group reaches the JVM first and interrupts the connector's offset request).
    A JVM gone with the signal is no failure; gone without one it raises.
    """
    try:
        _watch(query, stop, follower, meters)
        return query.exception()
    except StreamingQueryException as exc:
        return exc
    except (Py4JError, ConnectionError) as exc:
        if not stop.is_set():
            raise
        # a SIGTERM to the whole process group stops the JVM too; the checkpoint makes that safe
        logger.info(
            "the Spark JVM stopped with the signal (%s); the checkpoint is consistent", type(exc).__name__
        )
        return None


def outcome(failure: BaseException | None, stop: threading.Event, query: str = QUERY) -> int:
    """The exit code: a failure during the shutdown is logged and ends well (the checkpoint
    holds the last committed micro-batch); any other failure is an error (1)."""
    if failure is not None and stop.is_set():
        first = (str(failure).splitlines() or [type(failure).__name__])[0]
        logger.info("spark query %r ended with the shutdown: %s", query, first)
    elif failure is not None:
        logger.error("spark query %r failed: %s", query, failure)
        return 1
    return 0


class WorkerRestarts:
    """Whether a failed query of ``query`` is started again in its session, on its checkpoint
    (offsets, state and the sink's marker go on, so nothing is lost or produced twice): only
    after a Python worker missed Spark's 10 s to connect back (:data:`WORKER_MISSED_ITS_START`),
    a hiccup of a loaded host, and at most :data:`WORKER_RESTARTS` times in a row. A query that
    completed a micro-batch before it failed so starts the count again. Any other failure, and
    one during a stop, ends the role as before: the supervisor restarts the whole role."""

    def __init__(self, query: str) -> None:
        self.query = query
        self.limit = WORKER_RESTARTS
        #: restarts since the last one after which a micro-batch completed
        self.in_a_row = 0

    def allow(self, failure: BaseException | None, query: StreamingQuery, stop: threading.Event) -> bool:
        if failure is None or stop.is_set() or WORKER_MISSED_ITS_START not in str(failure):
            return False
        if query.lastProgress is not None:  # it ran a micro-batch since it started
            self.in_a_row = 0
        if self.in_a_row >= self.limit:
            logger.error(
                "spark query %r: a Python worker missed its start %d times in a row; giving up",
                self.query, self.in_a_row + 1,
            )  # fmt: skip
            return False
        self.in_a_row += 1
        RESTARTS.labels(self.query).inc()
        logger.warning(
            "spark query %r failed: a Python worker did not connect back to the JVM within Spark's "
            "10 s (a loaded host); starting it again on its checkpoint (%d of %d in a row)",
            self.query, self.in_a_row, self.limit,
        )  # fmt: skip
        return True


def _watch(
    query: StreamingQuery,
    stop: threading.Event,
    follower: RuleFollower | None,
    meters: tuple[Counter, Gauge],
) -> None:
    """Block while the query runs; export progress to ``meters`` (records, last batch's
    seconds) and a log line every 30 s. With a ``follower``, return too when the rule files
    change what Spark runs."""
    records, batch_seconds = meters
    last_log, last_batch = time.monotonic(), -1
    while query.isActive and not stop.is_set():
        query.awaitTermination(1)
        if follower is not None and query.isActive and follower.changed():
            return
        for p in query.recentProgress:
            if p["batchId"] > last_batch:
                last_batch = p["batchId"]
                records.inc(p["numInputRows"])
                batch_seconds.set(p["durationMs"].get("triggerExecution", 0) / 1000)
        if time.monotonic() - last_log > 30 and query.lastProgress:
            p = query.lastProgress
            logger.info(
                "batch %s: %s rows, %s rows/s", p["batchId"], p["numInputRows"], p["processedRowsPerSecond"]
            )
            last_log = time.monotonic()


def stop_between_batches(query: StreamingQuery, wait_s: float = STOP_WAIT_S) -> None:
    """Stop ``query`` between two micro-batches where it can: wait up to ``wait_s`` for the
    running one to end. Between batches the stop is silent. A busy query's next batch may
    start at once, so the wait is bounded: then the stop cuts the running batch short, which
    is done again after a restart (its offsets are not committed). Spark would tell the cut as
    errors with stack traces (a Parquet write's job and each of its tasks aborted, their
    completion listeners after the session stopped); the role says it in one line instead and
    turns Spark's own logging off for the rest of its JVM's life (:func:`quiet_spark`)."""
    deadline = time.monotonic() + wait_s
    while _in_a_batch(query) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _in_a_batch(query):
        last = query.lastProgress
        batch = f"micro-batch {last['batchId'] + 1}" if last else "its first micro-batch"
        logger.info(
            "query %r still ran %s after %.1f s: the stop cuts it short, and it is done again at the "
            "next start (Spark's logging off from here)", query.name, batch, wait_s,
        )  # fmt: skip
        quiet_spark()
    query.stop()


def _in_a_batch(query: StreamingQuery) -> bool:
    """Whether ``query`` runs and is within a micro-batch."""
    return bool(query.isActive and query.status["isTriggerActive"])


def shut_down(
    query: StreamingQuery | None, spark: SparkSession, jvm: subprocess.Popen[bytes] | None,
    stop: threading.Event, *then: Callable[[], object],
) -> None:  # fmt: skip
    """The end of a streaming role: its query (between micro-batches where it can), then each
    of ``then`` (a sink's close), the session, and on a stop the JVM (``wait_for_jvm``). Every
    step runs, even once the JVM is gone."""
    if query is not None:
        _quietly(lambda: stop_between_batches(query))
    for step in then:
        _quietly(step)
    _quietly(spark.stop)
    if stop.is_set():
        wait_for_jvm(jvm)


def _quietly(step: Callable[[], object]) -> None:
    """Run a shutdown step; after the JVM is gone every py4j call fails, which is expected."""
    try:
        step()
    except (Py4JError, ConnectionError, OSError) as exc:
        logger.debug("shutdown step %s failed: %r", getattr(step, "__name__", step), exc)
