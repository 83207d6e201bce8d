"""The one place where Faust agents, topics and tables are registered.

Per source (sensors, logs, finance) two agents:

* ``evaluate-<source>`` reads the source topic, decodes each record with the
  source schema (invalid ones go to ``dlq.events`` with the reason, and the
  agent goes on), runs the source's *direct* stream (rules grouped by the
  topic key, and branches) and forwards the event, re-keyed by group values,
  to ``streamalert-rules-<source>-regroup`` for each other grouping;
* ``regroup-<source>`` reads that topic and runs those rules, so one group's
  events always meet on one partition.

Each topic's per-key rule state lives in its own Faust table, co-partitioned
with it; a restarted or rebalanced worker resumes the state (windows,
pending ``for:``, absences) of the partitions it owns and re-arms their
timers. Registry tables (``tables.devices``, ``tables.watchlists``) are read
whole by every worker before any event is evaluated. Rule files are watched:
a valid edit takes effect within ~2 s; an invalid one is logged with every
problem and the last good rules keep running.

Batches: the agents are *batch agents* (:meth:`RulesApp.batch_agent`): the
consumer hands each fetched partition batch (at most ``APP_WORKER_BATCH``
records) straight to the agent's handler, which evaluates the records in
offset order and hands the batch's outputs to the producer (:class:`Outbox`).
Changed state keys are written once per offset commit (:class:`TableStore`),
as record batches on the table's changelog partitions. Faust's per-record
stream machinery, a changelog record per rule and event (and one
``send_soon`` per changelog record), and an awaited ``Topic.send`` per alert
were most of a worker's time.

Delivery guarantee (``APP_PROCESSING_GUARANTEE``):

* ``at_least_once`` (the default). A batch counts as processed when its
  handler returned, that is after every output of the batch (alerts, regrouped
  events, DLQ records) was handed to the producer. Before committing offsets
  the consumer hands the changed states to the producer, flushes it and fails if
  any output or state record could not be delivered; only then does Faust
  commit. A crash re-processes the uncommitted batches from the state as of the
  last commit; alert ids are deterministic, so the replay re-emits the same
  ids, which downstream dedups.
* ``exactly_once``. Each input partition's outputs go to that partition's
  transactional producer (:mod:`agents.transactions`); each commit, with no
  handler running, writes the changed states into the same transactions and
  commits them with the input offsets. A crash aborts everything since the
  last commit; readers of ``alerts`` read committed records only.
  docs/exactly-once.md has the design, the zombie story and the cost.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from json.encoder import encode_basestring_ascii as json_string  # orjson: ~3 us a new str, this ~0.2
from typing import Any, cast

import faust
import orjson
from aiokafka.structs import TopicPartition
from faust.types import TP, TableT
from prometheus_client import Counter, Gauge, Histogram

from agents.transport import QuietWorker, RulesApp
from app import metrics, native
from app.config import Settings
from app.errors import IngestDecodeError, RuleConfigError
from app.events import Event, dlq_record, schema_for
from app.eventtime import REFUSED
from app.kafka import CachedPartitioner, make_consumer, partition_counts
from app.rules.evaluator import LATE_TOPIC, DictStore, Engine, Output, State, Stream, stream_name
from app.rules.loader import RuleSet, load_rules
from app.rules.state import partition_of
from app.rules.statekey import StateKey
from app.tables import TABLES, Tables
from app.topics import ALERTS, DLQ, SOURCE_TOPICS, TopicSpec, ensure_topics

logger = logging.getLogger(__name__)

# Group membership timings: a failed worker's partitions move after SESSION_TIMEOUT_S;
# a rebalance waits up to REBALANCE_TIMEOUT_S for every member to rejoin (Faust's
# default is 60 s; a member's rejoin here takes well under a second).
REBALANCE_TIMEOUT_S = 10.0
SESSION_TIMEOUT_S = 10.0
HEARTBEAT_S = 1.0
RELOAD_INTERVAL_S = 1.0
#: wall time after which an event held for its time on an otherwise quiet partition starts a
#: new period there (docs/event-time.md: the end of a gap, when no later event will confirm it)
QUIET_RELEASE_MS = 3000

EVENTS = Counter("worker_events_total", "Events consumed by the rule worker", ["source"])
DLQ_EVENTS = Counter("worker_dlq_total", "Invalid events sent to the dead-letter topic", ["source"])
ALERTS_OUT = Counter("worker_alerts_total", "Alert transitions produced", ["rule", "status"])
LATE = Counter("worker_late_events_total", "Events a stateful rule could not use (late)", ["source"])
ROUTED = Counter("worker_routed_total", "Events routed by branch rules", ["topic"])
RELOADS = Counter("worker_rule_reloads_total", "Rule reloads", ["outcome"])
RULES = Gauge("worker_rules", "Rules loaded")
CONSUME_LAG = Histogram(
    "worker_consume_lag_seconds", "From a record's timestamp to the start of its batch's evaluation",
    ["source"], buckets=(1e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)  # fmt: skip
STATE_TOO_LARGE = Counter(
    "worker_state_too_large_total",
    "State writes kept out of the changelog: larger than a Kafka record may be",
    ["rule"],
)
#: room left in a changelog record for Kafka's own fields (key length, headers, offsets)
RECORD_OVERHEAD_BYTES = 1024
BATCH_SECONDS = Histogram(
    "worker_batch_seconds", "Time to decode and evaluate one batch of events with every rule", ["source"],
    buckets=(1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.5),
)  # fmt: skip


def regroup_topic(source: str) -> str:
    return f"streamalert-rules-{source}-regroup"


def encode_state(value: State) -> bytes:
    """A rule state as the JSON its changelog record holds (read back by the table's JSON codec)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # an integer beyond 64 bits: the standard library writes it
        return json.dumps(value).encode()


class TableStore:
    """A write-behind state store over a Faust table.

    The states live in the table's own memory dict. The evaluator reads and writes them
    through :attr:`store`, a compiled ``DictStore`` over that dict (its calls from the
    compiled evaluator are native), which records each key written or deleted. Writes
    land in the dict at once. :meth:`changes`, which the consumer runs before every
    offset commit (``RulesApp.before_commit``, each second), turns each changed key
    into one changelog record, on the partition the
    evaluator stamped on the state (``partition``: the partition of the events that own it,
    as Faust would pick), and :class:`Outbox` sends them as record batches. A
    window rule updates its state on every event, so this turns one changelog
    record per rule and event into one per rule and group and commit, and the
    changelog always covers what the committed offsets say was processed.
    """

    def __init__(self, table: TableT[str, State], max_record_bytes: int) -> None:
        self.topic = table.changelog_topic.get_topic_name()
        live = getattr(table.data, "data", None)
        if not isinstance(live, dict):  # the worker's tables are memory:// stores
            msg = f"table {table.name}: expected an in-memory store, got {type(table.data).__name__}"
            raise TypeError(msg)
        self.live: dict[str, State] = live
        #: the store the evaluator writes to: the compiled DictStore over the table's dict,
        #: recording the keys changed since the last commit with their changelog partition
        self.store = DictStore(live, {})
        #: the largest state record the producer accepts (its max_request_size, less the
        #: key and the record's overhead)
        self.max_record_bytes = max_record_bytes
        #: keys whose state is too large for the changelog now (logged once until they fit)
        self.oversized: set[str] = set()

    def items(self) -> list[tuple[str, State]]:
        return list(self.live.items())

    def changes(self) -> Iterator[tuple[str, int, bytes, bytes | None]]:
        """The changelog records of the keys changed since the last call, as
        ``(topic, partition, key, value)``; a deleted key's value is None (a tombstone).

        Each state is encoded as it is taken, so the consumer can copy it into a record
        batch at once instead of holding every blob of a commit: orjson's output costs
        ~3 µs more to allocate while many are alive. The changed keys are taken as the
        iteration starts; read it in one go (:meth:`Outbox.send_placed` does).

        A state too large for one Kafka record (one client IP's burst filling a
        sliding window, a long ``pct_change`` lookback of fast ticks) stays in
        memory, and its changelog record becomes a tombstone: the producer would
        refuse the record and stop the worker, and an older version left in the
        changelog would be restored beside replayed events after a restart. After a
        restart such a group starts again from the events since the last commit.
        ``worker_state_too_large_total`` counts these writes.
        """
        pending, self.store.changed = self.store.changed or {}, {}
        topic, live = self.topic, self.live
        for key, partition in pending.items():
            value = live.get(key)
            raw_key = json_string(key).encode()  # the table's key codec (json) reads it back
            if value is None:
                self.oversized.discard(key)
                yield topic, partition, raw_key, None
                continue
            blob = encode_state(value)
            if len(blob) + len(raw_key) > self.max_record_bytes:
                STATE_TOO_LARGE.labels(StateKey.rule_of(key)).inc()
                if key not in self.oversized:
                    self.oversized.add(key)
                    logger.error(
                        "state %r is %d bytes, over the %d a changelog record may have: kept in "
                        "memory only until it shrinks (a restart starts it again from the events "
                        "since the last commit)", key, len(blob), self.max_record_bytes,
                    )  # fmt: skip
                yield topic, partition, raw_key, None
                continue
            if key in self.oversized:
                self.oversized.discard(key)
                logger.warning("state %r fits a changelog record again (%d bytes)", key, len(blob))
            yield topic, partition, raw_key, blob


@dataclass
class Runtime:
    """The swappable part: the current rules and their engine."""

    settings: Settings
    ruleset: RuleSet
    tables: Tables
    stores: dict[str, TableStore]
    engine: Engine = field(init=False)
    restored: set[tuple[str, int]] = field(default_factory=set)
    tables_ready: asyncio.Event = field(default_factory=asyncio.Event)
    rejected: dict[str, str] | None = None  # file hashes of the last rejected edit, logged once

    def __post_init__(self) -> None:
        self.engine = self.build(self.ruleset)

    def build(self, ruleset: RuleSet) -> Engine:
        def store_of(stream: str) -> DictStore:
            source, _, grouping = stream.partition(".by.")
            return self.stores[f"{source}.regroup" if grouping else source].store

        return Engine(
            ruleset, engine="faust", tables=self.tables, partitions=self.settings.partitions, stores=store_of,
            max_skew_ms=self.settings.max_event_skew_ms,
        )  # fmt: skip

    def swap(self, ruleset: RuleSet) -> None:
        self.ruleset, self.engine = ruleset, self.build(ruleset)
        self.restored.clear()
        RULES.set(len(ruleset.rules))

    def stream(self, source: str, name: str) -> Stream | None:
        return next((s for s in self.engine.streams.get(source, ()) if s.name == name), None)

    def ensure_restored(self, stream: Stream, store: TableStore, partition: int) -> None:
        """Re-arm the timers of a partition's persisted state, once per partition and rule set."""
        if (stream.name, partition) in self.restored:
            return
        self.restored.add((stream.name, partition))
        stream.evaluator.restore((k, v) for k, v in store.items() if partition_of(v) == partition)


def _broker_urls(bootstrap: str) -> list[str]:
    return [f"kafka://{h.strip()}" for h in bootstrap.split(",") if h.strip()]


#: Most record batches of one partition the :class:`Outbox` queues in the producer before
#: it waits for them to be sent (up to 1 MiB each: ``producer_max_batch_size``).
MAX_QUEUED_BATCHES = 8


class Outbox:
    """Hands a worker's outputs to Faust's producer, a handler's batch at a time.

    ``send_all`` returns once every record is queued: one record batch per topic
    partition (more when one fills up), in the order given, on the partition the
    producer's partitioner picks for the key. Per record, aiokafka's ``send`` costs
    tens of microseconds of Python (partition lookup, a future, the accumulator); a
    worker emits about one record per event. A record the producer could not
    deliver crashes the worker and fails the next commit (:meth:`check` runs
    before it), so no offset is committed past a lost alert; the restarted worker
    replays from the last commit.

    aiokafka's ``send_batch`` waits until the partition's queue is empty, which under
    load is a broker round trip: a batch is usually still waiting while the one
    before it is in flight. So a batch for a partition with batches queued goes in
    behind them at once, as aiokafka's accumulator would queue it after the wait,
    up to :data:`MAX_QUEUED_BATCHES`; past that, ``send_batch`` waits, which bounds
    what a stalled broker leaves in memory. The sender takes a partition's batches
    in queue order, so the records keep theirs.
    """

    def __init__(self, app: faust.App, partitioner: CachedPartitioner) -> None:
        self.app = app
        #: the producer's own partitioner: a key goes where Faust's producer would send it
        self.partitioner = partitioner
        self.failed: BaseException | None = None
        self._crashing: asyncio.Future[Any] | None = None

    async def send_all(self, records: Sequence[tuple[str, bytes, bytes]], source_partition: int = 0) -> None:
        """Queue ``(topic, key, value)`` records on the partitions the partitioner picks.

        ``source_partition``: the input partition whose batch produced them; under exactly-once
        they go into that partition's transaction."""
        if not records:
            return
        producer = self._producer(source_partition)
        partitioner = self.partitioner
        partitions: dict[str, list[int]] = {}
        building: dict[tuple[str, int], list[Any]] = {}  # per partition, its record batches in order
        for topic, key, value in records:
            found = partitions.get(topic)
            if found is None:
                found = partitions[topic] = sorted(await producer.partitions_for(topic))
            self._append(
                producer, building.setdefault((topic, partitioner(key, found, found)), []), key, value
            )
        await self._send_built(producer, building)

    async def send_placed(self, records: Iterable[tuple[str, int, bytes, bytes | None]]) -> None:
        """Queue ``(topic, partition, key, value)`` records (the state changelog) on their
        given partitions, in order; a None value is a tombstone.

        Each record is copied into its partition's record batch as it comes, and every
        one is in a batch before the first batch is sent: ``records`` is read in one go,
        with no other task running in between (a generator of states sees none change).
        Under exactly-once each record goes into the transaction of its own partition number:
        a state's changelog partition is that of the input partition whose events own it.
        """
        building: dict[tuple[str, int], list[Any]] = {}  # per partition, its record batches in order
        producers: dict[int, Any] = {}
        for topic, partition, key, value in records:
            batches = building.get((topic, partition))
            if batches is None:
                batches = building[(topic, partition)] = []
                if partition not in producers:
                    producers[partition] = self._producer(partition)
            self._append(producers[partition], batches, key, value)
        for (topic, partition), batches in building.items():
            for batch in batches:
                await self._send_batch(producers[partition], batch, topic, partition)

    def _producer(self, source_partition: int) -> Any:
        """The aiokafka producer for the outputs of ``source_partition``: Faust's (at least once),
        or that partition's transactional producer (exactly-once)."""
        transactions = getattr(self.app, "transactions", None)
        if transactions is not None:
            return transactions.producer(source_partition)
        return cast("Any", self.app.producer)._ensure_producer()  # noqa: SLF001 - its aiokafka producer

    async def _send_built(self, producer: Any, building: dict[tuple[str, int], list[Any]]) -> None:
        """Queue each partition's record batches (:meth:`_append`), in order."""
        for (topic, partition), batches in building.items():
            for batch in batches:
                await self._send_batch(producer, batch, topic, partition)

    @staticmethod
    def _append(producer: Any, batches: list[Any], key: bytes, value: bytes | None) -> None:
        """Append a record to the last of one partition's ``batches``, opening a batch when
        there is none or the last is full."""
        if not batches or batches[-1].append(timestamp=None, key=key, value=value) is None:
            batch = producer.create_batch()
            batch.append(timestamp=None, key=key, value=value)  # a new batch takes any record
            batches.append(batch)

    async def _send_batch(self, producer: Any, batch: Any, topic: str, partition: int) -> None:
        """Queue one record batch for ``topic``/``partition``: behind the partition's queued
        batches without waiting while there are fewer than :data:`MAX_QUEUED_BATCHES`."""
        tp = TopicPartition(topic, partition)
        queue = producer._message_accumulator  # noqa: SLF001 - aiokafka's, see the class docstring
        queued = queue._batches.get(tp)  # noqa: SLF001
        if queued and len(queued) < MAX_QUEUED_BATCHES and not queue._closed and queue._exception is None:  # noqa: SLF001
            fut = queue._append_batch(batch, tp).future  # noqa: SLF001 - what add_batch does after its wait
        else:  # nothing queued (or too much, or a closed or failed producer, which send_batch reports)
            fut = await producer.send_batch(batch, topic, partition=partition)
        fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is None or self.failed is not None:
            return
        self.failed = fut.exception()
        logger.error("an output record was not delivered, stopping the worker: %r", self.failed)
        self._crashing = asyncio.ensure_future(self.app.crash(self.failed))  # type: ignore[arg-type]

    def check(self) -> None:
        if self.failed is not None:
            msg = "an output record was not delivered"
            raise RuntimeError(msg) from self.failed

    def records(self, out: Output, source: str) -> list[tuple[str, bytes, bytes]]:
        """A batch's outputs as records, counted: alerts, branch copies, late copies, and
        dead letters for the events refused for their time (``events_time_refused_total``).

        Counted once per label set and batch: a labelled ``inc`` costs a few microseconds,
        and a flapping rule raises an alert every few events."""
        records: list[tuple[str, bytes, bytes]] = []
        alerts: dict[tuple[str, str], int] = {}
        for alert in out.alerts:
            label = (alert.rule_id, alert.status)
            alerts[label] = alerts.get(label, 0) + 1
            records.append((ALERTS, alert.fingerprint.encode(), alert.to_json()))
        routed: dict[str, int] = {}
        for topic, key, value in out.routed:
            routed[topic] = routed.get(topic, 0) + 1
            records.append((topic, key, value))
        for rule_id, value in out.late:
            records.append((LATE_TOPIC, rule_id.encode(), value))
        for ev, reason in out.refused:  # too far ahead of its partition's clock (docs/event-time.md)
            dead = dlq_record(source, reason, orjson.dumps(ev.fields), adapter="rule-worker", field="ts")
            records.append((DLQ, source.encode(), dead))
        if out.refused:
            REFUSED.labels(source, "ahead", "worker").inc(len(out.refused))
        for (rule_id, status), n in alerts.items():
            ALERTS_OUT.labels(rule_id, status).inc(n)
        for topic, n in routed.items():
            ROUTED.labels(topic).inc(n)
        if out.late:
            LATE.labels(source).inc(len(out.late))
        return records


def commit_hooks(
    outbox: Outbox,
    stores: Iterable[TableStore],
    flush: Callable[[], Awaitable[None]],
    *,
    exactly_once: bool = False,
) -> tuple[Callable[[], object], ...]:
    """What runs before every offset commit (``RulesApp.before_commit``), in order: fail if
    an output was lost; write the changed states; flush the producer (``flush``) and fail
    if any output or state record handed to it was not delivered. Faust then commits.

    ``exactly_once``: no flush. The states go into the partitions' transactions, and the
    commit that follows flushes each transactional producer and fails when a record of
    its transaction was not delivered."""
    stores = tuple(stores)

    async def write_state() -> None:
        """The changed states, as changelog records, before the offsets that cover them."""
        await outbox.send_placed(record for store in stores for record in store.changes())

    async def delivered() -> None:
        await flush()
        outbox.check()

    if exactly_once:
        return (outbox.check, write_state)
    return (outbox.check, write_state, delivered)


def _register_source(app: RulesApp, rt: Runtime, outbox: Outbox, source: str, topic_name: str) -> None:
    schema = schema_for(source)
    regroup = regroup_topic(source)
    direct_store, regroup_store = rt.stores[source], rt.stores[f"{source}.regroup"]
    events_c, dlq_c, timer = EVENTS.labels(source), DLQ_EVENTS.labels(source), BATCH_SECONDS.labels(source)
    lag_c = CONSUME_LAG.labels(source)
    direct_name = stream_name(source, None)

    async def evaluate(tp: TP, records: list[Any]) -> None:
        """A batch of the source topic: decode, run the direct stream, forward to the regroup topic."""
        await rt.tables_ready.wait()
        events_c.inc(len(records))
        out = Output()
        started = time.perf_counter()
        lag_c.observe(max(0.0, time.time() - records[0].timestamp / 1000))
        partition = tp.partition
        streams = [s for s in rt.engine.streams.get(source, ()) if s.evaluator.rules]
        direct = next((s for s in streams if s.name == direct_name), None)
        others = [s for s in streams if s is not direct]
        if direct is not None:
            rt.ensure_restored(direct, direct_store, partition)
        decode = schema.decode
        events: list[Event] = []
        sends: list[tuple[str, bytes, bytes]] = []  # DLQ and regroup records, in order
        for record in records:
            raw = record.value
            try:
                ev = decode(raw)
            except IngestDecodeError as exc:
                dlq_c.inc()
                dead = dlq_record(source, exc.reason, raw, adapter="rule-worker", field=exc.field)
                sends.append((DLQ, source.encode(), dead))
                continue
            events.append(ev)
            for s in others:
                sends.append((regroup, s.key_of(ev), orjson.dumps({"s": s.name, "e": ev.fields})))
        if direct is not None:
            out = direct.evaluator.process_batch(events, partition, time.time_ns() // 1_000_000)
        timer.observe(time.perf_counter() - started)
        await outbox.send_all(sends + outbox.records(out, source), partition)

    async def evaluate_regrouped(tp: TP, records: list[Any]) -> None:
        """A batch of the regroup topic: each event runs the stream it was re-keyed for."""
        await rt.tables_ready.wait()
        out = Output()
        started = time.perf_counter()
        partition = tp.partition
        runs: dict[str, list[Event]] = {}  # per stream, its events in order (streams share no state)
        for record in records:
            msg = orjson.loads(record.value)
            runs.setdefault(msg["s"], []).append(schema.validate(msg["e"]))
        for name, events in runs.items():
            s = rt.stream(source, name)
            if s is None:
                continue  # its rules were removed by a reload
            rt.ensure_restored(s, regroup_store, partition)
            out.extend(s.evaluator.process_batch(events, partition, time.time_ns() // 1_000_000))
        timer.observe(time.perf_counter() - started)
        await outbox.send_all(outbox.records(out, source), partition)

    app.batch_agent(topic_name)(evaluate)
    app.batch_agent(regroup)(evaluate_regrouped)


async def release_quiet(rt: Runtime, outbox: Outbox, assigned: set[tuple[str, int]], now_ms: int) -> None:
    """Evaluate the events held for their time on quiet partitions this worker owns
    (``assigned``: topic and partition), see :meth:`StreamEvaluator.release`."""
    for source, streams in rt.engine.streams.items():
        for s in streams:
            topic = SOURCE_TOPICS[source] if s.fields is None else regroup_topic(source)
            for partition in s.evaluator.held_partitions():
                if (topic, partition) in assigned:
                    out = s.evaluator.release(partition, now_ms, QUIET_RELEASE_MS)
                    await outbox.send_all(outbox.records(out, source))


async def _follow_tables(settings: Settings, rt: Runtime) -> None:
    """Read every registry table topic from the start, then keep following it."""
    from app.kafka import high_watermarks

    topics = [t.topic for t in TABLES.values()]
    by_topic = {t.topic: t.name for t in TABLES.values()}
    logger.info("loading registry tables from %s", ", ".join(topics))
    marks = await high_watermarks(settings.bootstrap_servers, topics)
    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        consumer.assign(list(marks))
        await consumer.seek_to_beginning(*marks)
        pending = {tp for tp, end in marks.items() if end > 0}
        if not pending:
            logger.info("registry tables are empty; evaluating")
            rt.tables_ready.set()
        while True:
            batch = await consumer.getmany(timeout_ms=500)
            for tp, records in batch.items():
                for r in records:
                    try:
                        rt.tables.apply(by_topic[tp.topic], (r.key or b"").decode(), r.value)
                    except (IngestDecodeError, ValueError) as exc:
                        logger.warning("ignored bad row in %s at offset %d: %s", tp.topic, r.offset, exc)
            for tp in list(pending):  # the position: it passes transaction markers, never returned
                if await consumer.position(tp) >= marks[tp]:
                    pending.discard(tp)
            if not pending and not rt.tables_ready.is_set():
                logger.info("registry tables loaded: %s", {n: len(v) for n, v in rt.tables.rows.items()})
                rt.tables_ready.set()
    finally:
        await consumer.stop()


async def check_partitions(settings: Settings) -> None:
    """Refuse to start when a source or regroup topic's partition count is not ``APP_PARTITIONS``.

    The worker places regrouped events and registry absences (``expect_from``) by
    ``APP_PARTITIONS``, as the backtest does; with another count on the topics, some
    registry devices would be expected by no worker and never reported silent.
    """
    topics = [*SOURCE_TOPICS.values(), *(regroup_topic(s) for s in SOURCE_TOPICS)]
    counts = await partition_counts(settings.bootstrap_servers, topics)
    wrong = {t: n for t, n in counts.items() if n != settings.partitions}
    if wrong:
        listed = ", ".join(f"{t} has {n}" for t, n in sorted(wrong.items()))
        msg = (
            f"APP_PARTITIONS={settings.partitions} but {listed} partitions: the rule worker places "
            "regrouped events and registry absences by APP_PARTITIONS, so they must agree. Set "
            "APP_PARTITIONS to the topics' count (or recreate the topics)."
        )
        raise SystemExit(msg)


def _extra_topics(ruleset: RuleSet, settings: Settings) -> tuple[TopicSpec, ...]:
    names = {regroup_topic(s) for s in SOURCE_TOPICS} | {LATE_TOPIC}
    names |= {topic for r in ruleset.rules for topic in (a.topic for a in r.rule.branch)}
    return tuple(TopicSpec(n, key="", partitions=settings.partitions) for n in sorted(names))


def initial_rules(settings: Settings) -> tuple[RuleSet, dict[str, str] | None]:
    """The rules to start with, and the file hashes of a rejected set (None: all valid).

    A worker never dies on a rule file: when the directory does not load as a whole, the
    problems are logged and the worker starts with the files that load on their own (and
    together; else with none), as a hot reload keeps the last good rules. Fixing a file
    brings the whole set in at the next reload tick."""
    from app.rules.loader import file_digest, rule_files

    try:
        return load_rules([settings.rules_dir]), None
    except Exception as exc:  # any failure to load is a rejection, never the worker's end
        if isinstance(exc, RuleConfigError):
            logger.error("rule files rejected at start; starting with the valid files only:\n%s", exc)
        else:
            logger.exception("rule files could not be loaded at start; starting with the valid files only")
    files = rule_files([settings.rules_dir])
    good = []
    for f in files:
        try:
            load_rules([f])
        except Exception:  # noqa: S112 - reported above with the whole set's problems
            continue
        good.append(f)
    try:
        ruleset = load_rules(good) if good else RuleSet()
    except Exception:  # the valid files clash with one another (duplicate ids): start with none
        logger.exception("the valid rule files do not load together; starting with no rules")
        ruleset = RuleSet()
    try:
        rejected = {str(f): file_digest(f) for f in files}
    except OSError:
        rejected = None
    RELOADS.labels("rejected").inc()
    return ruleset, rejected


def build_app(settings: Settings | None = None, ruleset: RuleSet | None = None) -> faust.App:
    """A Faust app evaluating ``ruleset`` (default: the rules in ``settings.rules_dir``)."""
    settings = settings or Settings.from_env()
    if not settings.bootstrap_servers:
        msg = "KAFKA_BOOTSTRAP_SERVERS is not set; start the system with `make run` or point it at a cluster"
        raise SystemExit(msg)
    watch = ruleset is None
    rejected: dict[str, str] | None = None
    if ruleset is None:
        ruleset, rejected = initial_rules(settings)
    logger.info("loaded %d rules from %s", len(ruleset.rules), settings.rules_dir)
    (settings.data_dir / "faust").mkdir(parents=True, exist_ok=True)
    asyncio.run(ensure_topics(settings.bootstrap_servers, settings.partitions, settings.replication_factor,
                              specs=_extra_topics(ruleset, settings)))  # fmt: skip
    asyncio.run(check_partitions(settings))
    partitioner = CachedPartitioner()  # the default partition, with key hashes remembered
    app = RulesApp(
        "streamalert-rules",
        Worker=QuietWorker,
        broker=_broker_urls(settings.bootstrap_servers),
        store="memory://",
        datadir=str(settings.data_dir / "faust"),
        web_enabled=False,
        web_host="127.0.0.1",  # should the web server ever be enabled: never on every interface
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_partitioner=partitioner,
        producer_linger_ms=1,
        producer_max_batch_size=1024 * 1024,  # a commit writes the changed state in one go
        broker_commit_interval=1.0,
        broker_rebalance_timeout=REBALANCE_TIMEOUT_S,
        broker_session_timeout=SESSION_TIMEOUT_S,
        broker_heartbeat_interval=HEARTBEAT_S,
    )
    stores: dict[str, TableStore] = {}
    for source in SOURCE_TOPICS:
        for name in (source, f"{source}.regroup"):
            table = app.Table(
                f"rule-state-{name.replace('.', '-')}",
                default=None,
                partitions=settings.partitions,
                key_type=str,
                help="per-(rule, group) evaluator state",
            )
            limit = min(
                settings.state_record_max_bytes, app.conf.producer_max_request_size - RECORD_OVERHEAD_BYTES
            )
            stores[name] = TableStore(table, limit)
    outbox = Outbox(app, partitioner)
    app.bootstrap_servers = settings.bootstrap_servers
    if settings.exactly_once:
        app.enable_transactions()
    app.before_commit = commit_hooks(
        outbox, stores.values(), app.producer.flush, exactly_once=settings.exactly_once
    )
    app.idempotence = settings.enable_idempotence
    app.batch_size = settings.worker_batch
    rt = Runtime(settings, ruleset, Tables(), stores)
    rt.rejected = rejected  # a bad set at start is not parsed again until a file changes
    RULES.set(len(ruleset.rules))
    for source, topic_name in SOURCE_TOPICS.items():
        _register_source(app, rt, outbox, source, topic_name)

    @app.task
    async def _start() -> None:
        metrics.serve(settings.metrics_port)
        # here, not in build_app: Faust sets up logging as the worker starts
        logger.info("%d rules; evaluator hot path: %s", len(rt.ruleset.rules), native.status())

    @app.timer(1.0)
    async def _release_quiet() -> None:
        assigned = {(tp.topic, tp.partition) for tp in app.consumer.assignment()}
        await release_quiet(rt, outbox, assigned, time.time_ns() // 1_000_000)

    # early: the batch handlers wait for the tables, and may run before recovery completes
    app.early_tasks = (partial(_follow_tables, settings, rt),)

    if watch:

        @app.timer(RELOAD_INTERVAL_S)
        async def _reload() -> None:
            await _maybe_reload(settings, rt)

    return app


async def _maybe_reload(settings: Settings, rt: Runtime) -> None:
    """Swap in edited rules when they are valid; keep the last good ones otherwise.

    A rejected set of files is remembered by its hashes and not parsed again until one of
    them changes (logged once, until the rules running change or come back). Loading runs
    in a thread, so the event loop keeps evaluating with the current rules meanwhile;
    nothing it raises stops the worker (the rule limits bound its time, see
    docs/rule-limits.md). Should the new rules' topics fail to be created, the next tick
    tries again."""
    from app.rules.loader import file_digest, rule_files

    try:
        current = {str(f): file_digest(f) for f in rule_files([settings.rules_dir])}
    except OSError:
        return  # a file vanished between listing and reading: next tick
    if current == dict(rt.ruleset.files):
        rt.rejected = None  # back to the rules running: a bad edit made again is logged again
        return
    if current == rt.rejected:
        return
    try:
        ruleset = await asyncio.to_thread(load_rules, [settings.rules_dir])
    except Exception as exc:  # any failure to load is a rejection, never the worker's end
        RELOADS.labels("rejected").inc()
        rt.rejected = current
        if isinstance(exc, RuleConfigError):
            logger.error("rule files rejected, keeping the last good rules:\n%s", exc)
        else:
            logger.exception("rule files could not be loaded, keeping the last good rules")
        return
    try:
        await ensure_topics(settings.bootstrap_servers, settings.partitions, settings.replication_factor,
                            specs=_extra_topics(ruleset, settings))  # fmt: skip
    except Exception as exc:  # the broker's trouble, not the files': the next tick tries again
        logger.warning("reload postponed, the new rules' topics could not be created: %r", exc)
        return
    rt.swap(ruleset)
    rt.rejected = None
    RELOADS.labels("applied").inc()
    logger.info(
        "reloaded %d rules (%s)", len(ruleset.rules), ", ".join(f"{r.id}@{r.version}" for r in ruleset.rules)
    )
