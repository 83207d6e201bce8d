"""The one place where Faust agents, topics and tables are registered.

Per source (sensors, logs, finance) two agents:

* ``evaluate-<source>`` reads the source topic, decodes each record with the
  source schema (invalid ones go to ``dlq.events`` with the reason, and the
  agent goes on), runs the source's *direct* stream (rules grouped by the
  topic key, and branches) and forwards the event, re-keyed by group values,
  to ``streamalert-rules-<source>-regroup`` for each other grouping;
* ``regroup-<source>`` reads that topic and runs those rules, so one group's
  events always meet on one partition.

The source topic is a *round agent* (:meth:`RulesApp.round_agent`): while the source has a
regrouped stream, the partitions this worker owns are merged by record time
(:mod:`agents.merge`), and each round forwards its events in that order, so a regrouped
stream meets them as they happened after a backlog too, not one partition's backlog first.

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
  ids, which downstream dedups. The events it forwards to a regroup topic a
  second time, beside their first copies, are dropped there
  (:func:`first_forwards`), so the regrouped rules count each event once too.
* ``exactly_once``. Each input partition's outputs go to that partition's
  transactional producer (:mod:`agents.transactions`); each commit, with no
  handler running, writes the changed states into the same transactions and
  commits them with the input offsets. A crash aborts everything since the
  last commit; readers of ``alerts`` read committed records only.
  docs/exactly-once.md has the design, the zombie story and the cost.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Any

import faust
import orjson
from faust.types import TP
from prometheus_client import Counter

from agents.assignor import OwnURLAssignor
from agents.merge import PAUSED, Pacer, RegroupMerge, regroup_waits
from agents.metrics import (
    BATCH_SECONDS,
    CONSUME_LAG,
    DLQ_EVENTS,
    EVENTS,
    MERGE_FORCED,
    MERGE_UNCONFIRMED,
    MERGE_WAITING,
    REFORWARDED,
    REREAD,
    RULES,
)
from agents.outbox import STATE_TOPIC_MAX_MESSAGE_BYTES, Outbox, commit_hooks, state_batch_bytes
from agents.registry import follow_tables
from agents.runtime import RELOAD_INTERVAL_S, Runtime, initial_rules, maybe_reload
from agents.state_server import attach as attach_state_server
from agents.state_store import RECORD_OVERHEAD_BYTES, TableStore
from agents.topics import check_partitions, extra_topics, regroup_topic
from agents.transport import QuietWorker, RulesApp
from app.errors import ConfigError, IngestDecodeError
from app.events import Event, dlq_record, schema_for
from app.kafka.admin import ensure_topics, max_message_bytes
from app.kafka.auth import KafkaAuth
from app.kafka.clients import CachedPartitioner
from app.rules.evaluator import DictStore, Output, stream_name
from app.rules.loader import RuleSet
from app.rules.statekey import forwarded_key
from app.runtime import metrics, native
from app.runtime.settings import Settings
from app.tables import Tables
from app.topics import DLQ, SOURCE_OF_TOPIC, SOURCE_TOPICS, TopicSpec

logger = logging.getLogger(__name__)

# Group membership timings: a failed worker's partitions move after its session timeout
# (APP_WORKER_SESSION_TIMEOUT, 10 s by default); a rebalance waits up to REBALANCE_TIMEOUT_S
# for every member to rejoin (Faust's default is 60 s; a member's rejoin here takes well under
# a second).
REBALANCE_TIMEOUT_S = 10.0
HEARTBEAT_S = 1.0
#: Faust's own default of ``broker_request_timeout``, which it wants above the session timeout
REQUEST_TIMEOUT_S = 90.0
#: wall time after which an event held for its time on an otherwise quiet partition starts a
#: new period there (docs/event-time.md: the end of a gap, when no later event will confirm it)
QUIET_RELEASE_MS = 3000


def _broker_urls(bootstrap: str) -> list[str]:
    return [f"kafka://{h.strip()}" for h in bootstrap.split(",") if h.strip()]


def faust_credentials(auth: KafkaAuth) -> faust.auth.Credentials | None:
    """Faust's ``broker_credentials`` for ``auth`` (``KAFKA_SECURITY_PROTOCOL`` and friends):
    its consumer, producers and admin client then connect as the role's principal."""
    if auth.uses_sasl:
        return faust.SASLCredentials(
            username=auth.username, password=auth.password, mechanism=auth.mechanism,
            ssl_context=auth.ssl_context(),
        )  # fmt: skip
    if auth.uses_ssl:
        return faust.SSLCredentials(auth.ssl_context())
    return None


#: per regroup topic and partition, the forwards waiting there (:class:`RegroupMerge`)
Held = dict[str, dict[int, RegroupMerge]]


def _register_source(
    app: RulesApp, rt: Runtime, outbox: Outbox, source: str, topic_name: str, held: Held, told: Told,
    pacer: Pacer,
) -> Callable[[], Awaitable[None]]:  # fmt: skip
    """Register ``source``'s two agents; return what lets the regroup side's waiting forwards
    go once their time has come (:class:`RegroupMerge`) and tells the progress of the source
    partitions paused meanwhile (:class:`Pacer`), for a timer to call."""
    schema = schema_for(source)
    regroup = regroup_topic(source)
    direct_store, regroup_store = rt.stores[source], rt.stores[f"{source}.regroup"]
    events_c, dlq_c, timer = EVENTS.labels(source), DLQ_EVENTS.labels(source), BATCH_SECONDS.labels(source)
    lag_c, replayed_c = CONSUME_LAG.labels(source), REFORWARDED.labels(source)
    reread_c = REREAD.labels(source)
    waiting_g, forced_c = MERGE_WAITING.labels(regroup), MERGE_FORCED.labels(regroup)
    unconfirmed_c = MERGE_UNCONFIRMED.labels(topic_name)
    direct_name = stream_name(source, None)
    #: per source partition, the last forward's record and event times (:data:`Forward`)
    marks: dict[int, tuple[int, int]] = {}
    #: per regroup partition, the forwards waiting for the source partitions' progress
    waiting = held.setdefault(regroup, {})

    async def evaluate(parts: list[tuple[TP, list[Any]]]) -> None:
        """A round of the source topic (:mod:`agents.merge`): per partition, decode and run the
        direct stream; then forward the events to the regroup topic merged by record time,
        then event time (each partition's in offset order), and the progress of every source
        partition this worker owns behind them (:func:`progress_markers`)."""
        await rt.tables_ready.wait()
        started = time.perf_counter()
        streams = [s for s in rt.engine.streams.get(source, ()) if s.evaluator.rules]
        direct = next((s for s in streams if s.name == direct_name), None)
        others = [s for s in streams if s is not direct]
        decode = schema.decode
        forwards: list[tuple[int, list[Forward]]] = []  # per partition, in offset order
        for tp, records in parts:
            partition = tp.partition
            if direct is not None:
                rt.ensure_restored(direct, direct_store, partition)
                records = first_records(direct_store.store, direct_name, partition, records, reread_c)
                if not records:
                    continue
            events_c.inc(len(records))
            lag_c.observe(max(0.0, time.time() - records[0].timestamp / 1000))
            events: list[Event] = []
            sends: list[tuple[str, bytes, bytes]] = []  # the dead letters, in order
            mine: list[Forward] = []
            # both times made non-decreasing along the partition, across rounds too
            arrived, event_time = marks.get(partition, (-(2**63), -(2**63)))
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
                if others:
                    arrived, event_time = max(arrived, record.timestamp or 0), max(event_time, ev.ts_ms)
                    order = (arrived, event_time, partition, record.offset)
                    body = {"e": ev.fields, "f": (partition, record.offset), "o": order}
                    for s in others:
                        mine.append((order, (regroup, s.key_of(ev), orjson.dumps({"s": s.name, **body}))))
            marks[partition] = (arrived, event_time)
            # the alerts of rules no longer running end first (once per partition and rule set)
            out = Output(alerts=rt.retire(source, partition))
            if direct is not None:
                out.extend(direct.evaluator.process_batch(events, partition, time.time_ns() // 1_000_000))
            await outbox.send_all(sends + outbox.records(out, source), partition)
            forwards.append((partition, mine))
        markers: dict[int, list[Placed]] = {}
        if others:
            markers = progress(time.monotonic())
        await forward(outbox, forwards, markers)
        if others:
            for partition, mine in forwards:
                pacer.sent(partition, marks[partition][0], len(mine))
            pace(time.monotonic())
        timer.observe(time.perf_counter() - started)

    def progress(now: float, *, settle: bool = False) -> dict[int, list[Placed]]:
        """The progress markers of the source partitions this worker owns (:func:`progress_markers`)."""
        one = not outbox.exactly_once  # one producer: its forwards keep the merged order
        return progress_markers(
            regroup, rt.settings.partitions, app.progress(topic_name), marks, told, now,
            one_producer=one, paused=app.paced(topic_name), positions=app.positions(topic_name),
            settle=settle,
        )  # fmt: skip

    async def confirm(now: float) -> None:
        """Read the end of the source partitions told caught up too long ago, with forwards
        waiting past them (:meth:`RegroupMerge.unconfirmed`; this worker's own too, unless it is
        their sole ordered owner), once for every regroup partition here; for those never told
        of (:meth:`RegroupMerge.unheard`), where the group starts them from too. A read that
        fails trusts their markers, as if their ends had not moved."""
        if not any(merge.waiting for merge in waiting.values()):
            return
        # its sole ordered owner forwards in the merged order: nothing of it to check
        sole = (
            {tp.partition for tp in app.consumer.assignment() if tp.topic == topic_name} if told.sole else ()
        )
        due: dict[int, int] = {}
        unheard: set[int] = set()
        for merge in waiting.values():
            due.update(merge.unconfirmed(now, sole))
            unheard.update(merge.unheard(now, sole))
        if not due and not unheard:
            return
        ends = await app.ends(topic_name, due.keys() | unheard, CONFIRM_TIMEOUT_S)
        read = await app.starts(topic_name, unheard, CONFIRM_TIMEOUT_S) if unheard and ends else {}
        if ends is None or read is None:
            warn_unread(topic_name, due.keys() | unheard)
        if ends is None:  # as if their ends had not moved
            ends = {**due, **dict.fromkeys(unheard, 0)}
        starts = {**{s: ends[s] for s in unheard if s in ends}, **(read or {})}  # unread: trusted
        lagging: set[int] = set()
        for merge in waiting.values():
            lagging |= merge.confirm(ends, now, starts)
        if lagging:
            unconfirmed_c.inc(len(lagging))
        if told_lagging := lagging - unheard:
            logger.info("%s: partitions %s were told caught up, and have records their worker has not "
                        "told of (stopped?): regrouped events after their time wait for them",
                        topic_name, sorted(told_lagging))  # fmt: skip
        if unheard_lagging := lagging & unheard:
            logger.info("%s: partitions %s were never told of, and have records their worker has not "
                        "evaluated (stopped?): regrouped events wait for them",
                        topic_name, sorted(unheard_lagging))  # fmt: skip

    def pace(now: float) -> None:
        """Backpressure (:class:`Pacer`): pause the fetch of the source partitions whose forwards
        wait for a lagging one, by the least time a lagging one has shown: the others' as this
        worker's regroup partitions have read it, its own as they are (no regroup partition
        read yet: every forward waits); resume them once few wait."""
        chosen: set[int] = set()
        if not pacer.idle():
            own = {
                partition: (behind and not told.sole, shown_time(marks, partition, floor))
                for partition, (behind, floor) in app.progress(topic_name).items()
            }
            bounds = [b for merge in waiting.values() if (b := merge.bound(now, own)) is not None]
            chosen = pacer.pace(min(bounds, default=None) if waiting else -(2**63))
        app.pace(topic_name, chosen)  # nothing to do when none is or was paused

    async def evaluate_regrouped(tp: TP, records: list[Any]) -> None:
        """A batch of the regroup topic: its forwards wait for the source partitions' progress
        (:class:`RegroupMerge`); those whose time has come run the stream each was re-keyed
        for, once (:func:`first_forwards`)."""
        await rt.tables_ready.wait()
        partition, now = tp.partition, time.monotonic()
        merge = waiting.get(partition)
        if merge is None:
            merge = waiting[partition] = RegroupMerge(
                rt.settings.partitions, now, max_held=rt.settings.regroup_max_waiting,
                **regroup_waits(rt.settings.worker_session_ms / 1000),
            )  # fmt: skip
        copies = merge.copies
        passing = merge.add(
            [(record.offset, orjson.loads(record.value), record.timestamp) for record in records], now,
            time.time_ns() // 1_000_000,
        )  # fmt: skip
        if merge.copies > copies:
            replayed_c.inc(merge.copies - copies)
        await confirm(now)
        await run_regrouped(partition, passing + take(merge, now))

    def take(merge: RegroupMerge, now: float) -> list[dict[str, Any]]:
        forced = merge.forced
        out = merge.take(app.batch_size, now)
        if merge.forced > forced:
            forced_c.inc(merge.forced - forced)
        waiting_g.set(sum(m.waiting for m in waiting.values()))
        pace(now)  # the markers read may have moved the lagging partitions' time
        return out

    async def run_regrouped(partition: int, messages: list[dict[str, Any]]) -> None:
        if not messages:
            return
        out = Output(alerts=rt.retire(f"{source}.regroup", partition))
        started = time.perf_counter()
        runs: dict[str, list[Event]] = {}  # per stream, its events in order (streams share no state)
        for msg in first_forwards(regroup_store.store, partition, messages, replayed_c):
            runs.setdefault(msg["s"], []).append(schema.validate(msg["e"]))
        for name, events in runs.items():
            s = rt.stream(source, name)
            if s is None:
                continue  # its rules were removed by a reload
            rt.ensure_restored(s, regroup_store, partition)
            out.extend(s.evaluator.process_batch(events, partition, time.time_ns() // 1_000_000))
        timer.observe(time.perf_counter() - started)
        await outbox.send_all(outbox.records(out, source), partition)

    async def release() -> None:
        """Evaluate the waiting forwards whose time has come with no batch to bring them: a
        lagging source partition's progress went stale, the grace ended, or one waited too long.
        Then pace the source partitions, and tell the progress of those paused (no round of
        theirs does; the regroup side would take them for stale), and of those that moved since
        they were last told, caught up (a round within :data:`PROGRESS_REFRESH_S` of the last
        marker sends none, and the regroup side checks a "caught up" against its end)."""
        now = time.monotonic()
        await confirm(now)
        for partition, merge in list(waiting.items()):
            if merge.waiting:
                await run_regrouped(partition, take(merge, now))
        pace(now)
        paced = bool(app.paced(topic_name))
        if paced or regroups(rt, topic_name):
            markers = progress(now, settle=not paced)
            if markers:
                await forward(outbox, [], markers)

    app.round_agent(topic_name)(evaluate)
    app.batch_agent(regroup)(evaluate_regrouped)
    return release


#: an event forwarded to a regroup topic: its merge order (record time and event time, each
#: non-decreasing along its partition, then partition and offset) and its record
Forward = tuple[tuple[int, int, int, int], tuple[str, bytes, bytes]]
#: a record for a given partition: topic, partition, key, value
Placed = tuple[str, int, bytes, bytes]
#: a source partition that is not behind tells the regroup side so again this often at most
PROGRESS_REFRESH_S = 1.0
#: the longest the regroup side waits for the broker to tell a source partition's end
#: (:meth:`RegroupMerge.confirm`); past it, the markers are trusted as they are
CONFIRM_TIMEOUT_S = 2.0
#: the last time each topic's ends could not be read (:func:`warn_unread`)
_unread_warned: dict[str, float] = {}


def warn_unread(topic: str, partitions: Collection[int]) -> None:
    """The ends of ``topic``'s partitions told caught up could not be read: warn, at most once a
    minute, that their markers are trusted as they are."""
    now = time.monotonic()
    if now - _unread_warned.get(topic, -60.0) >= 60.0:
        _unread_warned[topic] = now
        logger.warning(
            "%s: the ends of partitions %s could not be read within %.0f s: their last 'caught up' "
            "is trusted as it is", topic, sorted(partitions), CONFIRM_TIMEOUT_S,
        )  # fmt: skip


@dataclass
class Told:
    """What a source's progress markers said last: per source partition, whether it was behind,
    when (monotonic) and the offset it had reached (None: unknown); and whether this worker is
    the ordered sole owner of the source."""

    last: dict[int, tuple[bool, float, int | None]] = field(default_factory=dict)
    #: this worker owns every partition of the source, at least once (one producer), and all
    #: were caught up once since: what it forwards from then on comes in the merged order
    sole: bool = False


def progress_markers(
    regroup: str, partitions: int, progress: Mapping[int, tuple[bool, int | None]],
    marks: Mapping[int, tuple[int, int]], told: Told, now: float, *, one_producer: bool,
    paused: Collection[int] = (), positions: Mapping[int, int] | None = None, settle: bool = False,
) -> dict[int, list[Placed]]:  # fmt: skip
    """Per source partition this worker owns, its progress marker for every regroup partition:
    ``{"m": [partition, time, behind]}``. ``progress``: whether it may still bring records, and
    the least record time it may (:meth:`agents.transport.BatchConsumer.progress`); ``time`` is
    that, or its forwards' record time so far (``marks``) when that is later. A partition that
    is behind tells it at every round; one that is not, when that changed, or after
    :data:`PROGRESS_REFRESH_S` (a regroup partition that changed owners has forgotten it).
    The regroup side merges by them (:class:`agents.merge.RegroupMerge`).

    A worker that owns every partition of the source with ``one_producer`` (at least once)
    sends its forwards in the merged order already: once all were caught up together (what
    other workers forwarded before is then merged on the regroup side), its partitions are
    told as not behind, and the regroup side waits for none of them. Live, a partition is often
    behind by a fetch, and its markers at every round cost the alerts of every rule about 1 ms
    at p50 in the latency bench; a single worker now sends none of those.

    A partition in ``paused`` (its fetch paused, :class:`agents.merge.Pacer`) is told as
    :data:`agents.merge.PAUSED`, so the regroup side does not take it for stale.

    Each marker says the offset its partition had reached (``"n"``, from ``positions``), which
    the regroup side checks a stale "caught up" against (:meth:`RegroupMerge.confirm`).
    ``settle`` (the worker's timer, no round): only the partitions not behind whose offset moved
    since they were last told, once the refresh is due. So the last marker of a partition that
    has gone idle says where it stopped, and an idle worker sends nothing. A partition no round
    has told of is not told by the timer either: a worker that never forwarded sends nothing
    (its producer would hold the marker, and its stop wait for it, with the cluster gone)."""
    positions = positions or {}
    if not one_producer or len(progress) < partitions:
        told.sole = False
    elif not told.sole and not any(late for late, _ in progress.values()):
        told.sole = True
    out: dict[int, list[Placed]] = {}
    for source, (behind, floor) in progress.items():
        late = behind and not told.sole
        last = told.last.get(source)
        reached = positions.get(source)
        due = last is None or now - last[1] >= PROGRESS_REFRESH_S
        if settle:  # told before, caught up, moved on since
            if late or last is None or not due or last[2] in (None, reached) or reached is None:
                continue
        elif not late and not due and last is not None and not last[0]:
            continue
        told.last[source] = (late, now, reached)
        shown = shown_time(marks, source, floor)
        marker: dict[str, Any] = {"m": [source, shown, PAUSED if late and source in paused else late]}
        if reached is not None:
            marker["n"] = reached
        value = orjson.dumps(marker)
        key = str(source).encode()
        out[source] = [(regroup, r, key, value) for r in range(partitions)]
    return out


def shown_time(marks: Mapping[int, tuple[int, int]], partition: int, floor: int | None) -> int:
    """The time a source partition's progress marker shows: the least record time it may still
    bring (``floor``), or its forwards' record time so far (``marks``) when that is later."""
    return max(marks.get(partition, (-(2**63), 0))[0], -(2**63) if floor is None else floor)


async def forward(
    outbox: Outbox,
    forwards: list[tuple[int, list[Forward]]],
    markers: Mapping[int, list[Placed]] | None = None,
) -> None:
    """Hand a round's forwarded events to the producer, then the source partitions' progress
    ``markers`` behind them: at least once, merged by their order, so a regrouped stream
    meets them as they happened, whichever source partition each came from (one producer
    keeps the order it is given). Exactly-once, each partition's go into its own transaction,
    whose producers keep no order between them, with its own markers behind them: there the
    regroup side merges them by their order (``"o"``) and the markers (:class:`RegroupMerge`)."""
    markers = markers or {}
    if outbox.exactly_once:
        for partition, mine in forwards:
            await outbox.send_all([record for _, record in mine], partition, markers.get(partition, ()))
        for partition in markers.keys() - {partition for partition, _ in forwards}:
            await outbox.send_all([], partition, markers[partition])
        return
    merged = heapq.merge(*(mine for _, mine in forwards), key=itemgetter(0))
    await outbox.send_all([record for _, record in merged], placed=[m for ms in markers.values() for m in ms])


def first_records(
    store: DictStore, stream: str, partition: int, records: list[Any], reread: Counter
) -> list[Any]:
    """The source batch's ``records`` that ``partition``'s own stream (``stream``: the rules
    grouped by the topic key) has not evaluated yet; marks the batch's last as evaluated.

    At least once, a crash after a commit's states are written and before its offsets are
    committed makes the restarted worker read that commit's batches again, on states that
    count them. The stream keeps the last offset it evaluated in the state store
    (:func:`app.rules.statekey.forwarded_key`, written after the states it covers:
    :meth:`agents.state_store.TableStore.changes`): a record at or before it is dropped and
    counted in ``reread``. Its outputs went out before those states (``agents.outbox.commit_hooks``)."""
    key = forwarded_key(stream, partition, partition)
    done = evaluated(store, key)
    if records[0].offset <= done:
        fresh = [r for r in records if r.offset > done]
        reread.inc(len(records) - len(fresh))
        records = fresh
    if records:
        mark_evaluated(store, key, partition, records[-1].offset)
    return records


def evaluated(store: DictStore, key: str) -> int:
    """The last source offset evaluated that the record under ``key`` holds
    (:func:`app.rules.statekey.forwarded_key`), -1 for none."""
    record = store.get(key)
    return -1 if record is None else int(record["offset"])


def mark_evaluated(store: DictStore, key: str, partition: int, offset: int) -> None:
    """Record ``offset`` as the last source offset evaluated under ``key``, in ``partition``'s
    state (its changelog partition)."""
    store.put(key, {"partition": partition, "offset": offset})


def first_forwards(
    store: DictStore, partition: int, messages: list[dict[str, Any]], replayed: Counter
) -> Iterator[dict[str, Any]]:
    """The regroup batch's ``messages`` that ``partition`` has not evaluated yet.

    At least once, a crash makes the source partitions read again from their committed
    offsets, and the worker forwards those events a second time; the first copies were
    delivered too, and were not committed here either. Each forward carries its source
    partition and offset (``"f"``), and ``partition`` keeps, per regrouped stream and source
    partition, the last offset it evaluated (:func:`app.rules.statekey.forwarded_key`, in the
    state store, so the changelog holds it with the states that counted it): a forward at or
    before it is a copy, dropped and counted in ``replayed``. A source partition's forwards
    reach a regroup partition in offset order (one idempotent producer; exactly-once, one
    transaction each; :class:`RegroupMerge` keeps each source partition's order). A forward
    without ``"f"`` (an older worker's) is taken as it is."""
    last: dict[tuple[str, int], int] = {}
    dropped = 0
    for msg in messages:
        sent = msg.get("f")
        if sent is None:
            yield msg
            continue
        where = (msg["s"], sent[0])
        done = last.get(where)
        if done is None:
            done = evaluated(store, forwarded_key(where[0], partition, where[1]))
        if sent[1] <= done:
            dropped += 1
            last[where] = done
            continue
        last[where] = sent[1]
        yield msg
    for (stream, source), offset in last.items():
        mark_evaluated(store, forwarded_key(stream, partition, source), partition, offset)
    if dropped:
        replayed.inc(dropped)


def partitions_moved(
    rt: Runtime, told: Iterable[Told], pacers: Iterable[Pacer], partitions: set[int]
) -> None:
    """Partitions left this worker or came to it: memory drops what it holds of them, no
    source is taken as ordered by this worker alone any more (:func:`progress_markers`):
    another worker may have forwarded some of its events meanwhile, and their forwards are
    counted afresh (:class:`Pacer`)."""
    rt.forget(partitions)
    for each in told:
        each.sole = False
    for pacer in pacers:
        pacer.forget(partitions)


def held_from(held: Held, tp: TP) -> int | None:
    """The offset of ``tp``'s first forward still waiting on the regroup side (None: none)."""
    merge = held.get(tp.topic, {}).get(tp.partition)
    return merge.first_offset() if merge is not None else None


def drop_held(held: Held) -> None:
    """Forget every forward waiting on the regroup side (read again from the committed offsets)."""
    for waiting in held.values():
        waiting.clear()


def regroups(rt: Runtime, topic: str) -> bool:
    """Whether source ``topic`` has a regrouped stream with rules: then its partitions are
    merged by record time (:mod:`agents.merge`); otherwise each runs on its own, no need to wait."""
    source = SOURCE_OF_TOPIC.get(topic)
    streams = rt.engine.streams.get(source, ()) if source is not None else ()
    return any(s.fields is not None and s.evaluator.rules for s in streams)


async def release_quiet(
    rt: Runtime, outbox: Outbox, assigned: set[tuple[str, int]], now_ms: int, *, retire: bool = True
) -> None:
    """On the partitions this worker owns (``assigned``: topic and partition) that no batch
    came to: end the alerts of rules no longer running (:meth:`Runtime.retire`; not with
    ``retire`` False: the tables are being restored), and evaluate the events held for their
    time (:meth:`StreamEvaluator.release`)."""
    for source, topic in SOURCE_TOPICS.items() if retire else ():
        for store, on in ((source, topic), (f"{source}.regroup", regroup_topic(source))):
            for t, partition in sorted(assigned):
                if t == on:
                    retired = Output(alerts=rt.retire(store, partition))
                    await outbox.send_all(outbox.records(retired, source), partition)
    for source, streams in rt.engine.streams.items():
        for s in streams:
            topic = SOURCE_TOPICS[source] if s.fields is None else regroup_topic(source)
            for partition in s.evaluator.held_partitions():
                if (topic, partition) in assigned:
                    out = s.evaluator.release(partition, now_ms, QUIET_RELEASE_MS)
                    await outbox.send_all(outbox.records(out, source), partition)


def leader_topic(app: faust.App) -> str:
    """The topic whose one partition Faust's assignor gives the group's leader."""
    return f"{app.conf.id}-__assignor-__leader"


def build_app(settings: Settings | None = None, ruleset: RuleSet | None = None) -> faust.App:
    """A Faust app evaluating ``ruleset`` (default: the rules in ``settings.rules_dir``)."""
    settings = settings or Settings.from_env()
    if not settings.bootstrap_servers:
        msg = "KAFKA_BOOTSTRAP_SERVERS is not set; start the system with `make run` or point it at a cluster"
        raise ConfigError(msg)
    watch = ruleset is None
    rejected: dict[str, str] | None = None
    if ruleset is None:
        ruleset, rejected = initial_rules(settings)
    logger.info("loaded %d rules from %s", len(ruleset.rules), settings.rules_dir)
    (settings.data_dir / "faust").mkdir(parents=True, exist_ok=True)
    partitioner = CachedPartitioner()  # the default partition, with key hashes remembered
    app = RulesApp(
        "streamalert-rules",
        Worker=QuietWorker,
        broker=_broker_urls(settings.bootstrap_servers),
        broker_credentials=faust_credentials(settings.kafka_auth),
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
        broker_session_timeout=settings.worker_session_ms / 1000,
        broker_request_timeout=max(REQUEST_TIMEOUT_S, settings.worker_session_ms / 1000 + 30),
        broker_heartbeat_interval=HEARTBEAT_S,
        consumer_group_instance_id=settings.worker_instance_id or None,  # static membership, when set
        PartitionAssignor=OwnURLAssignor,
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
    # Faust's own topics too (the changelogs, its group leader's), before Faust declares them as
    # the worker starts: at a first start its consumer joined the group before some existed,
    # logged "not found in cluster metadata" and left them unassigned
    # a changelog takes a commit's states of one partition in one record batch (Outbox.place)
    faust_topics = (
        *(TopicSpec(store.topic, key="rule id and group", compacted=True, partitions=settings.partitions,
                    max_message_bytes=STATE_TOPIC_MAX_MESSAGE_BYTES)
          for store in stores.values()),
        TopicSpec(leader_topic(app), key="none: the group leader's partition", partitions=1),
    )  # fmt: skip
    asyncio.run(ensure_topics(settings, settings.partitions, settings.replication_factor,
                              specs=extra_topics(ruleset, settings) + faust_topics))  # fmt: skip
    asyncio.run(check_partitions(settings))
    outbox = Outbox(app, partitioner)
    changelogs = [store.topic for store in stores.values()]
    outbox.batch_bytes = state_batch_bytes(asyncio.run(max_message_bytes(settings, changelogs)))
    app.bootstrap_servers = settings.bootstrap_servers
    app.kafka_auth = settings.kafka_auth
    if settings.exactly_once:
        app.enable_transactions()
    app.commit_snapshot, app.commit_delivery = commit_hooks(
        outbox, stores.values(), app.producer.flush, exactly_once=settings.exactly_once
    )
    app.idempotence = settings.enable_idempotence
    app.batch_size = settings.worker_batch
    rt = Runtime(settings, ruleset, Tables(), stores)
    rt.rejected = rejected  # a bad set at start is not parsed again until a file changes
    RULES.set(len(ruleset.rules))
    held: Held = {}
    #: per source, what its progress markers said last (:func:`progress_markers`)
    told = {src: Told() for src in SOURCE_TOPICS}
    #: per source, when to pause the fetch of its partitions (:class:`Pacer`)
    pacers = {src: Pacer(settings.regroup_max_waiting) for src in SOURCE_TOPICS}
    releases = [
        _register_source(app, rt, outbox, src, topic, held, told[src], pacers[src])
        for src, topic in SOURCE_TOPICS.items()
    ]
    app.on_partitions_moved = partial(partitions_moved, rt, told.values(), pacers.values())
    app.hold_for_time = partial(regroups, rt)
    app.held_from = partial(held_from, held)
    app.drop_held = partial(drop_held, held)
    attach_state_server(app, rt)  # interactive queries, when APP_STATE_PORT is set

    @app.task
    async def _start() -> None:
        metrics.serve(settings.metrics_port)
        # here, not in build_app: Faust sets up logging as the worker starts
        logger.info("%d rules; evaluator hot path: %s", len(rt.ruleset.rules), native.status())

    @app.timer(1.0)
    async def _count_rules() -> None:
        rt.count_rules()

    @app.timer(0.5)
    async def _release_regrouped() -> None:
        async with app.exclusive():  # as a batch: its states, alerts and offsets together
            if app.flow_stopped():  # it drops what waits, to be read again
                return
            for release in releases:
                await release()

    @app.timer(1.0)
    async def _release_quiet() -> None:
        async with app.exclusive():  # the states it changes and the alerts they raise, together
            if app.flow_stopped():  # as the batches, wait for it
                return
            assigned = {(tp.topic, tp.partition) for tp in app.consumer.assignment()}
            # Faust's recovery lets the flow run while it reads the changelogs: a sweep then
            # would see part of a partition's states (the batches wait: their partitions are paused)
            settled = not app.in_recovery and not app.rebalancing
            await release_quiet(rt, outbox, assigned, time.time_ns() // 1_000_000, retire=settled)

    # early: the batch handlers wait for the tables, and may run before recovery completes
    app.early_tasks = (partial(follow_tables, settings, rt),)

    if watch:

        @app.timer(RELOAD_INTERVAL_S)
        async def _reload() -> None:
            await maybe_reload(settings, rt)

    return app
