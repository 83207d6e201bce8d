"""Faust's aiokafka transport, with record batches for the rule topics and two fixes.

**No stream records fetched between resume and seek.** After recovery,
Faust's ``Recovery`` resumes the stream partitions, *then* seeks them to the
committed offsets, and only then resumes flow control, which clears every
stream queue. Records fetched in that gap were delivered, advanced Faust's
read offset and the fetch position, and were then cleared from the queue, so
a worker restarted after events arrived sometimes consumed none of them
until new events came. :meth:`BatchConsumer.perform_seek` holds the
stream partitions paused through the seek, and :meth:`RulesApp.on_rebalance_end`
releases them once flow control is active again.

**Record batches for the rule topics.** Faust hands every record to its
streams one by one: a ``wait_first`` with two new tasks per record in
``_drain_messages``, the conductor, a channel queue, the stream iterator and
the monitor. That machinery alone capped a do-nothing agent at ~5,000 records/s
on this project's 2-CPU hosts, while aiokafka itself reads ~300,000 records/s
from the same broker. A topic registered with :meth:`RulesApp.batch_agent`
skips it: the consumer hands each fetched partition batch (aiokafka
``ConsumerRecord`` objects, in offset order, at most ``batch_size`` at a time)
to the topic's handler, on the fetcher task, and counts the batch as processed
when the handler returns. Offsets are then committed by Faust's commit loop
(``_new_offset``). The handlers and each commit take turns on a lock (the gate):
under it a commit takes the offsets and hands the changed states to the producer
(``commit_snapshot``: the rule worker's take the changed states); then, handlers
running again, it flushes the outputs, sends those states and checks every delivery
(``commit_delivery``), and commits the offsets. So delivery stays at least once, and the
changelog holds the states of exactly the batches the offsets cover; a crash between the
states and the offsets leaves states ahead, and the rule worker drops the records they
count when it reads them again (docs/worker.md). A handler's call and the offsets it covers go
together, even when a stop cancels the fetch loop mid-batch (:meth:`BatchConsumer._handle`).
Every other topic (table
changelogs in recovery, other agents) takes Faust's path unchanged. A topic registered with
:meth:`RulesApp.round_agent` instead waits in a :class:`agents.merge.TimeMerge` and goes to its
handler a round at a time: its partitions merged by record time (the rule worker's source
topics, so that its regroup topics get their events in the order they happened).

**Exactly-once** (``RulesApp.transactions``, :mod:`agents.transactions`). Not
Faust's own mode, whose transaction errors are logged and passed over. The
gate is held for the whole commit, so one commit's
state, outputs and offsets cover the same batches; a commit writes the changed
states into the partitions' transactions and commits each with its offsets;
partitions are committed before they are revoked, and the producers of newly
assigned partitions start (fencing the previous owner) before Faust reads their
changelogs. Any failure stops the worker. The consumer reads committed records
only, at least once too, and table recovery ends at the last committed
changelog record (:func:`committed_ends`), since a transaction's marker, never
returned, ends the log.

**No spinner.** Faust's worker draws a progress spinner and, for it, sets the
root logger to DEBUG whenever the log level is WARN or above, so every debug
call in the process (aiokafka logs one per record produced) built a log
record for a spinner nobody sees. :class:`QuietWorker` has no spinner.

These are subclasses wired in by :class:`RulesApp`; nothing in Faust is patched.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from functools import cached_property, partial
from typing import Any, cast

import aiokafka
import faust
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition
from faust.exceptions import ProducerSendError
from faust.tables import TableManager
from faust.tables.recovery import Recovery
from faust.transport.drivers.aiokafka import (
    AIOKafkaConsumerThread,
    Consumer,
    ConsumerNotStarted,
    Producer,
    Transport,
)
from faust.types import TP, ConsumerT, TransportT

from agents.membership import members_of, twin, twin_message
from agents.merge import TimeMerge
from agents.metrics import MERGE_FORCED, MERGE_PAUSED, MERGE_WAITING, REBALANCE_SECONDS, REBALANCES
from agents.transactions import COMMIT_SECONDS, TRANSACTION_TIMEOUT_MS, PartitionTransactions
from app.errors import ConfigError
from app.kafka.auth import KafkaAuth
from app.kafka.clients import Endpoint, Target, TrackingProducer, connection, stop_consumer
from app.runtime.settings import quiet_libraries

logger = logging.getLogger(__name__)

#: A batch agent's handler: the partition and its records, in offset order.
BatchHandler = Callable[[TP, list[Any]], Awaitable[None]]
#: A merged topic's handler (:meth:`RulesApp.round_agent`): a round of its partitions' records,
#: each partition's in offset order (:mod:`agents.merge`).
RoundHandler = Callable[[list[tuple[TP, list[Any]]]], Awaitable[None]]


#: Longest wait for the consumer's thread to stop (mode's default: 60 s). Its stop only stops
#: aiokafka's consumer: it leaves the group and closes the connections. With the cluster gone,
#: that retried until the 60 s were up, so a SIGTERM took a minute to stop the worker. Cutting
#: it short loses nothing: offsets go through the consumer's own commits, and what they did not
#: cover is read again after a restart (at least once, as after a crash).
CONSUMER_THREAD_STOP_S = 5.0
#: how often the worker checks that aiokafka's group routine still runs (:meth:`RulesApp.watch_group`)
GROUP_CHECK_S = 1.0
#: Longest a stop waits, in all, on what needs the cluster to answer: the last commit (which
#: flushes the producer first), the producer's flush and its stop, the transactions' end. With
#: the cluster gone and records in the producer, each waited for the producer's request
#: timeout (20 minutes in Faust), so a SIGTERM mid-replay did not stop the worker. Cutting
#: them short loses nothing: the offsets not committed are read again at the next start, and
#: their alerts come again with the same ids (at least once; exactly once, the open
#: transactions abort).
STOP_CLUSTER_S = 5.0


class WorkerConsumerThread(AIOKafkaConsumerThread):
    shutdown_timeout = CONSUMER_THREAD_STOP_S

    async def on_thread_stop(self) -> None:
        """Faust's, with aiokafka's consumer stopped through :func:`stop_consumer`. Stopped
        while a fetch was backing off from a broker gone, the consumer's ``stop()`` raised that
        fetch's CancelledError (aio-libs/aiokafka#647): the thread died with a traceback
        ("Exception in thread"), never said it had stopped, and the worker's stop waited the
        whole :data:`CONSUMER_THREAD_STOP_S` for it, then logged a TimeoutError."""
        # what Faust's own does before its consumer.stop(): stop the thread's method queue
        await super(AIOKafkaConsumerThread, self).on_thread_stop()
        if self._consumer is not None:
            await stop_consumer(self._consumer)

    def verify_event_path(self, now: float, tp: TP) -> None:
        """Faust's livelock check of one partition (every 2.5 commit intervals), skipped for a
        partition with no fetch position yet. Faust's reads aiokafka's ``position``, which
        asserts that there is one: a partition with no committed offset that a rebalance gave
        this worker is sought to its start (:meth:`BatchConsumer.seek_to_committed`), and
        waits for that reset while it is paused. A check that fell then crashed the worker
        with a bare ``AssertionError`` (found in a test of two workers, one source partition
        never written)."""
        with contextlib.suppress(Exception):  # no consumer or no assignment yet: Faust's own
            consumer = self._ensure_consumer()
            state = consumer._subscription.subscription.assignment.state_value(tp)  # noqa: SLF001
            if state is not None and not state.has_valid_position:
                return None
        return super().verify_event_path(now, tp)

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        """Faust's consumer, reading committed records only (Faust does so only with its own
        exactly-once mode, which this worker does not use: see :mod:`agents.transactions`).

        Under exactly-once the worker's regroup topics and changelogs are written in
        transactions, and an aborted one's records must never be evaluated or restored;
        without transactions it changes nothing.
        """
        consumer = super()._create_worker_consumer(transport)
        consumer._isolation_level = "read_committed"  # noqa: SLF001 - read by start(), which has not run
        return consumer


def _end(state: Any) -> int | None:
    """A partition's end in aiokafka's fetch ``state``: the last stable offset (read committed),
    else the high watermark, as the last fetch saw them."""
    return state.lso if state.lso is not None and state.lso >= 0 else state.highwater


def _from(batch: list[Any], offset: int | None) -> list[Any]:
    """``batch``'s records at or after ``offset`` (all of them when None): a fetch after a seek
    brings again records that were already processed or are already waiting."""
    if offset is not None and batch and batch[0].offset < offset:
        return [r for r in batch if r.offset >= offset]
    return batch


#: Longest wait, at a rebalance, for the batch under evaluation before the commit that hands
#: the partitions over (a batch of ``APP_WORKER_BATCH`` events takes milliseconds; the group
#: waits up to the rebalance timeout, 10 s, for this worker to rejoin)
REVOKE_DRAIN_S = 5.0
#: how long a stop waits for the batch its cancel interrupted to finish (:meth:`BatchConsumer._handle`)
FINISH_BATCH_S = 10.0
#: the backpressure's pauses and resumes of one topic reach the log at INFO at most this often,
#: in seconds: a catch-up may pause and resume its partitions every few rounds (the others go
#: to DEBUG, and are counted in the next INFO line)
PACE_LOG_S = 10.0


class InFlight:
    """How many of one kind of work are under way, and a wait for none to be."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.contextmanager
    def one(self) -> Iterator[None]:
        """One more under way for the ``with`` block."""
        self.count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if not self.count:
                self._idle.set()

    async def none(self) -> None:
        """Return once none is under way (at once when none is)."""
        await self._idle.wait()


class BatchConsumer(Consumer):
    _held: frozenset[TP] = frozenset()
    #: the partition numbers of the batch-agent topics assigned at the last rebalance
    _owned: frozenset[int] | set[int] = frozenset()
    #: whether the last revocation committed everything processed (memory = changelog = offsets)
    _clean_revoke: bool = False
    #: revocations and assignments seen: a fetch that began before the last one is stale
    _rebalances: int = 0
    #: this worker's member id in the group at its last assignment ("": none yet)
    _joined_as: str = ""
    #: when the revocation of a rebalance after the first join began (monotonic), until the assignment
    _revoked_at: float | None = None
    #: why memory holds part of a batch no offset covers (:meth:`_tear`); None: it does not
    _torn: str | None = None
    #: per batch-agent partition: the offset after the last batch its handler finished
    _batch_acked: dict[TP, int]
    #: the client that reads partitions' ends for the regroup side (:meth:`ends`)
    _ends_client: aiokafka.AIOKafkaConsumer | None = None
    #: the client that reads the group's committed offsets for the regroup side (:meth:`starts`)
    _offsets_admin: AIOKafkaAdminClient | None = None
    #: held by a handler call (with its offset bookkeeping), by a commit while it takes the
    #: offsets and the changed states, and by the worker's timers that change states
    #: (:meth:`RulesApp.exclusive`): so a commit's states, outputs and offsets cover the same
    #: batches, and a crash replays exactly what the committed states do not count
    _commit_gate: asyncio.Lock | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._batch_acked = {}
        #: per merged topic (:meth:`RulesApp.round_agent`), its fetched records not yet handled
        self._merges: dict[str, TimeMerge] = {}
        #: per topic, the partitions :meth:`pace` paused
        self._paced: dict[str, frozenset[TP]] = {}
        #: per topic, when :meth:`pace` last logged at INFO, and the changes since
        self._pace_logged: dict[str, tuple[float, int]] = {}

    def _transactions(self) -> PartitionTransactions | None:
        found: PartitionTransactions | None = getattr(self.app, "transactions", None)
        return found

    @property
    def gate(self) -> asyncio.Lock:
        """The lock the batch handlers and the commits take turns on (see ``_commit_gate``)."""
        if self._commit_gate is None:
            self._commit_gate = asyncio.Lock()
        return self._commit_gate

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return WorkerConsumerThread(self, loop=self.loop, beacon=self.beacon)

    @cached_property
    def _fetches(self) -> InFlight:
        """The fetches under way, each with the handlers of its batch (:meth:`perform_seek`
        waits for none)."""
        return InFlight()

    @cached_property
    def _batches(self) -> InFlight:
        """The fetched batches being handed to their handlers (:meth:`on_partitions_revoked`
        waits for none)."""
        return InFlight()

    async def _give_back(self, records: Mapping[TP, list[Any]] | None) -> None:
        """Put each still assigned partition of a fetch that a rebalance overtook back at its
        first record there, to be fetched again.

        aiokafka counted them as consumed, and the fetch's partitions were chosen before the
        rebalance: Faust skips the records of a partition not among them, and drops the others
        once the flow has stopped. A changelog partition's records that the recovery had
        resumed were so lost, and the recovery waited for them for ever (found in
        ``tests/agents/test_state_server.py``'s kill -9 case, once the revocation no longer
        waited for the fetch). Stream partitions go back to their committed offsets after the
        rebalance all the same."""
        if not records:
            return
        try:
            mine = self.assignment()
        except Exception:  # no consumer any more (the worker stops): nothing to give back to
            return
        given = partitions = 0
        for tp, batch in records.items():
            if batch and tp in mine:
                with contextlib.suppress(Exception):  # revoked meanwhile: its next owner reads it
                    await self._seek(tp, batch[0].offset)
                    given, partitions = given + len(batch), partitions + 1
        if partitions:
            logger.info("a fetch that a rebalance overtook: %d record(s) of %d partition(s) given back",
                        given, partitions)  # fmt: skip

    async def _wait_next_records(self, timeout: float) -> Any:
        """Fetch; hand batch-agent partitions to their handlers, the rest to Faust's streams.

        The fetch and the handlers run inside the in-flight window, so :meth:`perform_seek`
        waits for a fetch under way before it moves the position. Only the handlers run inside
        the batch window (:attr:`_batches`) that :meth:`on_partitions_revoked` waits for.
        A fetch under way when a rebalance begins waits, on the consumer thread, for the new
        assignment (aiokafka's ``fetched_records``), which waits for the revocation: counted,
        it held the revocation for its whole drain timeout, after which every partition was
        restored from the changelogs. Its records are given back (:meth:`_give_back`), never
        handled nor passed on. A fetch that waits for the flow to resume (Faust stops it as a
        rebalance begins, before the revocation) is not under way either.
        """
        if not self.flow_active:
            await self.wait(self.can_resume_flow)  # type: ignore[arg-type]
        rebalances = self._rebalances
        with self._fetches.one():
            records, active = await super()._wait_next_records(timeout)
            if rebalances != self._rebalances or not self.flow_active:
                await self._give_back(records)  # a rebalance began during the fetch
                return {}, active
            with self._batches.one():
                return await self._deliver(records, active), active

    async def _deliver_batches(
        self, records: Mapping[TP, list[Any]], active: set[TP] | None, handlers: Mapping[str, BatchHandler]
    ) -> dict[TP, list[Any]]:
        """Run the handlers of the batch-agent partitions in ``records``; return the other partitions.

        A batch fetched while flow control is off (a rebalance began), after the
        generation changed, or for a partition no longer active is dropped
        unprocessed, as Faust's ``getmany`` drops records then: the position is
        reset to the committed offset when the rebalance ends, so it is read again.
        Under exactly-once, so is a batch that finds no open transaction (partitions
        being revoked, the worker stopping or failed).
        """
        rest: dict[TP, list[Any]] = {}
        generation = self.app.consumer_generation_id
        size = max(1, int(getattr(self.app, "batch_size", 500)))
        monitor = self.app.monitor
        gate, transactions = self.gate, self._transactions()
        for tp, batch in records.items():
            handler = handlers.get(tp.topic)
            if handler is None:
                rest[tp] = batch
                continue
            batch = _from(batch, self._read_offset[tp])  # already processed: re-fetched after a seek
            for start in range(0, len(batch), size):
                if not self.flow_active or self.should_stop or self.app.consumer_generation_id != generation:
                    return rest
                if active is not None and tp not in active and tp not in self._buffered_partitions:
                    break
                chunk = batch[start : start + size]
                async with gate:
                    if transactions is not None and (not transactions.open or self.should_stop):
                        return rest
                    done = partial(self._batch_done, tp, chunk[-1].offset + 1)
                    await self._handle(handler(tp, chunk), done)
                if monitor is not None:
                    monitor.stream_inbound_time[tp] = time.monotonic()  # Faust's "stream idle" check
                await asyncio.sleep(0)  # let timers (the commit each second) and other tasks run
        return rest

    async def _deliver_rounds(
        self, records: Mapping[TP, list[Any]], active: set[TP] | None
    ) -> dict[TP, list[Any]]:
        """Take the merged topics' records in ``records`` into their :class:`TimeMerge`, run
        their handlers on each round that is ready; return the other partitions' records.

        Stops, as :meth:`_deliver_batches` does, when flow control is off, the generation
        changed, the worker stops or (exactly-once) no transaction is open: what waits stays
        until a seek or a revocation drops it (the committed offsets stop before it)."""
        rounds: Mapping[str, RoundHandler] = getattr(self.app, "round_handlers", {})
        rest: dict[TP, list[Any]] = {}
        now = time.monotonic()
        for tp, batch in records.items():
            if tp.topic not in rounds:
                rest[tp] = batch
                continue
            merge = self._merges.setdefault(tp.topic, TimeMerge())
            waiting_end = merge.next_offset(tp)  # past what waits, else past what was processed
            merge.add(tp, _from(batch, self._read_offset[tp] if waiting_end is None else waiting_end), now)
        generation = self.app.consumer_generation_id
        size = max(1, int(getattr(self.app, "batch_size", 500)))
        gate, transactions, monitor = self.gate, self._transactions(), self.app.monitor
        hold: Callable[[str], bool] | None = getattr(self.app, "hold_for_time", None)
        for topic, handler in rounds.items():
            waiting = self._merges.get(topic)
            while waiting is not None and waiting.waiting:
                if not self.flow_active or self.should_stop or self.app.consumer_generation_id != generation:
                    return rest
                mine = [tp for tp in self.assignment() if tp.topic == topic]
                skip = [tp for tp in mine if active is not None and tp not in active]
                wait = hold is not None and hold(topic)
                lagging = [tp for tp in mine if not self._caught_up(tp)] if wait else []
                forced = waiting.forced
                parts = waiting.take(size, lagging, time.monotonic(), skip)
                if waiting.forced > forced:
                    MERGE_FORCED.labels(topic).inc(waiting.forced - forced)
                if not parts:
                    break
                async with gate:
                    if transactions is not None and (not transactions.open or self.should_stop):
                        waiting.drop()  # read again from the committed offsets
                        return rest
                    await self._handle(handler(parts), partial(self._rounds_done, parts))
                if monitor is not None:
                    for tp, _ in parts:
                        monitor.stream_inbound_time[tp] = time.monotonic()
                await asyncio.sleep(0)
            if waiting is not None:
                MERGE_WAITING.labels(topic).set(waiting.waiting)
        return rest

    def _fetch_state(self, tp: TP) -> Any:
        """aiokafka's fetch state of ``tp`` (None: unknown there); raises without a consumer."""
        consumer = self._thread._ensure_consumer()  # noqa: SLF001
        return consumer._subscription.subscription.assignment.state_value(tp)  # noqa: SLF001

    def _caught_up(self, tp: TP) -> bool:
        """Whether ``tp``'s fetch position has reached its end (the last stable offset, read
        committed; the high watermark as the last fetch saw them): it has no earlier records
        to bring. Unknown (no fetch answered yet) counts as behind."""
        try:
            state = self._fetch_state(tp)
        except Exception:  # no consumer or no assignment yet: nothing to wait for
            return True
        if state is None or not state.has_valid_position:
            return False
        end = _end(state)
        return end is not None and state.position >= end

    def progress(self, topic: str) -> dict[int, tuple[bool, int | None]]:
        """Per partition of merged ``topic`` this worker owns: whether it may still bring
        records to its handler (its fetch position behind its end, or records of it waiting
        in the :class:`TimeMerge`), and the least record time it may still bring
        (:meth:`TimeMerge.floor`; None: unknown). The rule worker sends them to the regroup
        side with each round (:class:`agents.merge.RegroupMerge`)."""
        merge = self._merges.get(topic)
        out: dict[int, tuple[bool, int | None]] = {}
        for tp in self.assignment():
            if tp.topic == topic:
                waits = merge is not None and merge.first_offset(tp) is not None
                out[tp.partition] = (waits or not self._caught_up(tp), merge.floor(tp) if merge else None)
        return out

    def positions(self, topic: str) -> dict[int, int]:
        """Per partition of ``topic`` this worker owns, its fetch position (the offset it will
        fetch next), where it has one: the offset its progress markers say it reached."""
        out: dict[int, int] = {}
        for tp in self.assignment():
            if tp.topic != topic:
                continue
            with contextlib.suppress(Exception):  # no consumer or no assignment yet: unknown
                state = self._fetch_state(tp)
                if state is not None and state.has_valid_position:
                    out[tp.partition] = state.position
        return out

    async def ends(self, topic: str, partitions: Collection[int], timeout_s: float) -> dict[int, int] | None:
        """The end of each of ``topic``'s ``partitions`` (any, owned or not), read from the broker
        now: the last stable offset, as this worker reads committed records. None when the read
        failed or took longer than ``timeout_s``.

        Read on a client of its own (started at the first read, stopped with the consumer): on
        the consumer's connection the request queued behind its long-poll fetch, and the
        worker's timers waited 1.4 s for it."""
        tps = [TopicPartition(topic, partition) for partition in partitions]
        try:
            if self._ends_client is None:
                self._ends_client = await self._start_ends_client(timeout_s)
            got = await asyncio.wait_for(self._ends_client.end_offsets(tps), timeout_s)
        except Exception as exc:  # the broker away or slow: the caller goes on without them
            logger.debug("%s: the ends of partitions %s not read: %r", topic, sorted(partitions), exc)
            return None
        return {tp.partition: end for tp, end in got.items()}

    async def starts(
        self, topic: str, partitions: Collection[int], timeout_s: float
    ) -> dict[int, int] | None:
        """Where the worker group starts each of ``topic``'s ``partitions`` from: its committed
        offset (-1 where it has none), or the partition's start when that is later (a worker
        seeks there, :meth:`seek_to_committed`). None when a read failed or took longer than
        ``timeout_s``; a partition whose committed offset the coordinator did not tell is left
        out."""
        tps = [TopicPartition(topic, partition) for partition in partitions]
        try:
            if self._offsets_admin is None:
                self._offsets_admin = await self._start_offsets_admin(timeout_s)
            if self._ends_client is None:
                self._ends_client = await self._start_ends_client(timeout_s)
            committed = await asyncio.wait_for(
                self._offsets_admin.list_consumer_group_offsets(self.app.conf.id, partitions=tps), timeout_s
            )
            beginnings = await asyncio.wait_for(self._ends_client.beginning_offsets(tps), timeout_s)
        except Exception as exc:  # the broker away or slow: the caller goes on without them
            logger.debug("%s: where partitions %s start not read: %r", topic, sorted(partitions), exc)
            return None
        # a committed offset whose records retention has deleted since: the worker starts at the
        # partition's start (aiokafka's reset)
        return {
            tp.partition: max(committed[tp].offset, beginnings[tp])
            for tp in tps if tp in committed and tp in beginnings
        }  # fmt: skip

    async def _start_offsets_admin(self, timeout_s: float) -> AIOKafkaAdminClient:
        """An admin client on the worker's cluster that reads its group's committed offsets
        (:meth:`starts`); closed again when it cannot start within ``timeout_s``."""
        app = cast("RulesApp", self.app)
        admin = AIOKafkaAdminClient(**connection(Endpoint(app.bootstrap_servers, app.kafka_auth)))
        try:
            await asyncio.wait_for(admin.start(), timeout_s)
        except BaseException:
            await admin.close()
            raise
        return admin

    async def _start_ends_client(self, timeout_s: float) -> aiokafka.AIOKafkaConsumer:
        """A consumer in no group, on the worker's cluster, that only reads ends (:meth:`ends`);
        closed again when it cannot start within ``timeout_s``."""
        app = cast("RulesApp", self.app)
        client = aiokafka.AIOKafkaConsumer(
            **connection(Endpoint(app.bootstrap_servers, app.kafka_auth)),
            enable_auto_commit=False, isolation_level="read_committed",
        )  # fmt: skip
        try:
            await asyncio.wait_for(client.start(), timeout_s)
        except BaseException:
            await stop_consumer(client)
            raise
        return client

    def pace(self, topic: str, partitions: Collection[int]) -> set[int]:
        """Pause the fetch of ``topic``'s ``partitions`` this worker owns, and resume those this
        paused before that are no longer named: the regroup side's backpressure
        (:class:`agents.merge.Pacer`). Returns the partitions paused so. A seek or a
        rebalance, which resume every partition, forgets them (:meth:`_drop_waiting`)."""
        had = self._paced.get(topic, frozenset())
        if not partitions and not had:
            return set()
        want = frozenset(tp for tp in self.assignment() if tp.topic == topic and tp.partition in partitions)
        if want == had:
            return {tp.partition for tp in want}
        if want - had:
            self.pause_partitions(want - had)
        if gone := had - want - self._held:  # what a seek under way paused stays so until it ends
            self.resume_partitions(gone)
        self._log_pace(topic, want)
        self._paced[topic] = want
        MERGE_PAUSED.labels(topic).set(len(want))
        return {tp.partition for tp in want}

    def paced(self, topic: str) -> frozenset[int]:
        """The partitions of ``topic`` whose fetch :meth:`pace` paused, and no seek or
        rebalance has resumed since."""
        return frozenset(tp.partition for tp in self._paced.get(topic, ()))

    def _log_pace(self, topic: str, paused: Collection[TP]) -> None:
        """Log a change of :meth:`pace`: at INFO once per :data:`PACE_LOG_S` per topic, with
        the count of changes logged at DEBUG since."""
        now = time.monotonic()
        last, since = self._pace_logged.get(topic, (-math.inf, 0))
        level, more = logging.DEBUG, ""
        if now - last < PACE_LOG_S:
            self._pace_logged[topic] = (last, since + 1)
        else:
            self._pace_logged[topic] = (now, 0)
            level = logging.INFO
            if since:
                more = f" ({since} more pauses and resumes since the last such line)"
        if paused:
            numbers = sorted(tp.partition for tp in paused)
            logger.log(level, "%s: the fetch of partitions %s paused: too many of their forwards wait on "
                       "the regroup side for a lagging partition%s", topic, numbers, more)  # fmt: skip
        else:
            logger.log(level, "%s: the fetch of every partition resumed%s", topic, more)

    def _waiting(self) -> bool:
        return any(m.waiting for m in self._merges.values())

    def _drop_waiting(self) -> None:
        """Forget the records waiting here and in the app's handlers (``drop_held``, the
        regroup side's): they are fetched again after the seek or the rebalance.

        A partition whose handler held records is taken as handled only up to the first of
        them: the next commit must not pass them. (Faust's fetch loop seeks back when a fetch
        returns during a rebalance, and that seek drops what waits before the commit that
        hands the partitions over. That commit then took the whole batches as handled: the
        forwards held, never evaluated, were committed past, and lost: 200,000 log lines on
        two workers, one killed in the catch-up, lost alerts in 6 runs of 8, docs/rules.md.)"""
        held: Callable[[TP], int | None] | None = getattr(self.app, "held_from", None)
        if held is not None:
            for tp, done in list(self._batch_acked.items()):
                first = held(tp)
                if first is not None and first < done:
                    self._batch_acked[tp] = first
        for merge in self._merges.values():
            merge.drop()
        for topic in self._paced:  # no forward waits any more; the seek or the rebalance resumes them
            MERGE_PAUSED.labels(topic).set(0)
        self._paced.clear()
        drop: Callable[[], None] | None = getattr(self.app, "drop_held", None)
        if drop is not None:
            drop()

    def _held_cap(self, tp: TP, done: int) -> int:
        """The offset to commit of ``tp``, whose handled batches end at ``done``: before the
        first record its handler still holds (``held_from``: the regroup side's waiting
        forwards), so a crash or a rebalance reads that again; ``done`` is kept for a later
        commit then."""
        held: Callable[[TP], int | None] | None = getattr(self.app, "held_from", None)
        first = held(tp) if held is not None else None
        if first is None or first >= done:
            return done
        self._batch_acked[tp] = done
        return first

    async def _deliver(self, records: Any, active: set[TP] | None) -> Any:
        """Run the handlers on a fetch's batch-agent and merged partitions; return the other
        partitions' records. To the end, even when the fetch loop's task is cancelled meanwhile.

        A stop cancels that task, and a handler awaits as it sends its outputs, after it has
        changed the states. Cancelled there, the states counted part of the batch and the
        offsets none of it: the stop's commit wrote those states, and the restarted worker read
        the batch again on top of them, counted twice. So the handlers run in a task of their
        own, which a cancel waits for, at most :data:`FINISH_BATCH_S`. The stop has stopped the
        flow first, so no new batch begins meanwhile. A batch still running then is cancelled,
        and tears the states (:meth:`_handle`)."""
        handlers: Mapping[str, BatchHandler] = getattr(self.app, "batch_handlers", {})
        rounds = bool(getattr(self.app, "round_handlers", None))
        if not (records and handlers) and not (rounds and (records or self._waiting())):
            return records

        async def deliver() -> Any:
            rest = records
            if rest and handlers:
                rest = await self._deliver_batches(rest, active, handlers)
            if rounds and (rest or self._waiting()):
                rest = await self._deliver_rounds(rest or {}, active)
            return rest

        task = asyncio.ensure_future(deliver())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            try:
                if not task.done():
                    await asyncio.wait({task}, timeout=FINISH_BATCH_S)
            finally:
                if not task.done():
                    self._tear(f"a batch did not finish within {FINISH_BATCH_S:.0f} s of the stop")
                    task.cancel()
            raise

    async def _handle(self, call: Awaitable[None], done: Callable[[], None]) -> None:
        """Run one handler call (under the gate), then ``done``, which takes its records as
        handled. A call that fails or is cancelled half-way tears the states (:meth:`_tear`)."""
        try:
            await call
        except BaseException as exc:
            self._tear(f"a batch stopped half-way ({exc!r})")
            raise
        done()

    def _tear(self, why: str) -> None:
        """Memory holds part of a batch that no offset covers: keep every later commit from
        writing the states (the worker stops, or a rebalance restores every partition from the
        changelogs), so a restart reads again from the last commit on the states it wrote.
        Exactly-once: the open transactions are not committed (the broker aborts them)."""
        if self._torn is None:
            logger.error("%s: the states it changed are not written; the worker reads again from "
                         "the last commit after a restart", why)  # fmt: skip
            self._torn = why
        transactions = self._transactions()
        if transactions is not None and transactions.failed is None:
            transactions.failed = RuntimeError(why)

    def _rounds_done(self, parts: list[tuple[TP, list[Any]]]) -> None:
        for tp, chunk in parts:
            self._batch_done(tp, chunk[-1].offset + 1)

    def _batch_done(self, tp: TP, after: int) -> None:
        self._read_offset[tp] = after
        self._acked.setdefault(tp, [])  # lists tp in Faust's commit loop
        self._batch_acked[tp] = after

    def _new_offset(self, tp: TP) -> int | None:
        """The offset to commit: past the last handled batch for batch-agent partitions, but
        before a record their handler still holds (:meth:`_held_cap`)."""
        done = self._batch_acked.pop(tp, None)
        return self._held_cap(tp, done) if done is not None else super()._new_offset(tp)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        """Commit what was processed before the partitions go (aiokafka's eager protocol
        revokes every partition at each rebalance, those the worker keeps included).

        No batch starts from here on, the one under way is waited for (at most
        :data:`REVOKE_DRAIN_S`), then the changed states are written and the offsets
        committed (exactly-once: the partitions' transactions are committed), while this
        worker still owns the partitions. So the changelog, the committed offsets and the
        memory all say the same: the next owner restores exactly what was processed and
        reads on after it, and a partition this worker keeps is not read again on top of
        a state that already counts it. Faust itself commits nothing here (at least once),
        which, on a rebalance, counted the last second's events twice in a kept
        partition's windows, and let the leaving owner write states behind the new
        owner's. When this commit does not happen, :meth:`on_partitions_assigned` restores
        every partition from the changelogs instead."""
        self._rebalances += 1
        self.stop_flow()  # Faust does so too, after this: no new batch begins meanwhile
        if self._joined_as and self._revoked_at is None:  # not the first join's empty revocation
            REBALANCES.inc()
            self._revoked_at = time.monotonic()
        if await self._place_taken():
            # never return: aiokafka would join again as soon as this does, and take the place
            # back from the newer worker, which would stop in turn; the stop ends the consumer
            await asyncio.Event().wait()
        try:
            await asyncio.wait_for(self._batches.none(), REVOKE_DRAIN_S)
        except TimeoutError:
            logger.warning("a batch still ran %.0f s into the rebalance: every partition will be "
                           "restored from the changelogs", REVOKE_DRAIN_S)  # fmt: skip
        else:
            self._clean_revoke = await self._commit_before_revoke()
        for tp in revoked:
            self._batch_acked.pop(tp, None)
        self._drop_waiting()  # the next owner, or this worker after the seek, reads them again
        await super().on_partitions_revoked(revoked)

    def group_failure(self) -> BaseException | None:
        """Why aiokafka's group routine (its coordinator's task: the joins, the assignments, the
        heartbeats' watch) died, or the error it waits on for its consumer to take; None while
        it runs, and before the consumer starts. aiokafka's own ``getmany`` raises these at each
        fetch (``check_errors``); Faust's fetch reads aiokafka's fetcher directly and never did,
        so a worker whose routine had died ran on with no partition, reading nothing, and one
        whose routine met an error it cannot retry (the group refused by its ACLs) waited on it
        for ever."""
        try:
            coordinator = self._thread._ensure_consumer()._coordinator  # noqa: SLF001
        except ConsumerNotStarted:
            return None
        if coordinator is None:  # aiokafka's consumer not started yet
            return None
        try:
            coordinator.check_errors()
        except asyncio.CancelledError:  # the routine was cancelled: the worker stops
            return None
        except Exception as exc:  # whatever stopped it is the answer
            return exc
        return None

    def rejoin_group(self) -> None:
        """Have aiokafka's group routine join the group again at its next turn (its
        coordinator's ``request_rejoin``, which it also asks itself when the topics change).
        Asked from the assignor's ``on_assignment``, which that routine runs: the flag it sets
        is read once the join it completes is done (``agents.assignor``)."""
        self._thread._ensure_consumer()._coordinator.request_rejoin()  # noqa: SLF001

    def _member_id(self) -> str:
        """This worker's member id in the group now ("" before a join, and after the broker
        said it was no longer a member)."""
        try:
            return str(self._thread._ensure_consumer()._coordinator.member_id)  # noqa: SLF001
        except Exception:  # no consumer or no coordinator yet
            return ""

    async def _place_taken(self, timeout_s: float = 5.0) -> bool:
        """Whether another worker with this one's ``APP_WORKER_INSTANCE_ID`` took its place in
        the group (:mod:`agents.membership`); if so, the worker crashes, saying why. Asked only
        of a static member that lost its member id since its last assignment: a rebalance
        that others began keeps it."""
        if not self._joined_as or self._member_id() == self._joined_as:
            return False
        instance = self.app.conf.consumer_group_instance_id
        if not instance:
            return False
        group = self.app.conf.id
        try:
            if self._offsets_admin is None:
                self._offsets_admin = await self._start_offsets_admin(timeout_s)
            asked = self._offsets_admin.describe_consumer_groups([group])
            described = await asyncio.wait_for(asked, timeout_s)
        except Exception as exc:  # the broker away or slow: join again, as aiokafka would
            logger.warning("the group's members not read (%r): joining again as %s", exc, instance)
            return False
        other = twin(instance, self._joined_as, members_of(described, group))
        if other is None:  # the session ran out (a long pause): the place is free again
            return False
        msg = twin_message(instance, other)
        logger.error(msg)
        await self.app.crash(ConfigError(msg))
        return True

    async def _commit_before_revoke(self) -> bool:
        """Write the changed states and commit the offsets of the handled batches; whether
        that succeeded (the rebalance then needs no restore of the partitions kept)."""
        transactions = self._transactions()
        if transactions is not None:
            if not transactions.open:
                return False
            with contextlib.suppress(Exception):  # logged, and the worker crashed: see the commit
                await self._commit_transactions(begin=False)
                return transactions.failed is None
            return False
        await self.maybe_wait_for_commit_to_finish()  # the commit loop's, if one is under way
        try:
            # even with no offset to commit: a timer may have changed states
            done = await self._commit_at_least_once(start_new_transaction=False, always=True)
        except Exception as exc:
            logger.warning("the commit before a rebalance failed (%r): every partition will be "
                           "restored from the changelogs", exc)  # fmt: skip
            return False
        if not done:
            logger.warning("the commit before a rebalance did not happen: every partition will be "
                           "restored from the changelogs")  # fmt: skip
        return done

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        """Under exactly-once, start the assigned partitions' transactional producers (which
        fences their previous owners and ends their open transactions) before Faust reads
        their changelogs and committed offsets.

        Before Faust restores the tables, memory drops what it holds of the partitions that
        left and of those that came (their states, unwritten changes, clocks, held events,
        timers: ``RulesApp.on_partitions_moved``): a partition this worker owned before and
        gets back is restored from the changelog, not resumed from what memory kept of it.
        After a rebalance whose commit did not happen (:meth:`on_partitions_revoked`), the
        partitions kept are restored too, from the changelog's start."""
        self._rebalances += 1
        self._joined_as = self._member_id()
        if self._revoked_at is not None:
            REBALANCE_SECONDS.observe(time.monotonic() - self._revoked_at)
            self._revoked_at = None
        numbers = self._batch_numbers(assigned)
        moved = (self._owned ^ numbers) if self._clean_revoke else (self._owned | numbers)
        if not self._clean_revoke and self._transactions() is None:
            self._torn = None  # every partition is restored from the changelogs: memory is whole again
        self._owned, self._clean_revoke = numbers, False
        for tp in [tp for tp in self._read_offset if tp.topic in self._batch_topics()]:
            self._read_offset.pop(tp, None)  # set by a batch that outlived the revoke
        self._batch_acked.clear()
        self._drop_waiting()
        if moved:
            restart = getattr(self.app, "restore_from_start", None)
            if restart is not None:
                restart(moved & numbers)
            forget = getattr(self.app, "on_partitions_moved", None)
            if forget is not None:
                forget(moved)
        transactions = self._transactions()
        if transactions is not None:
            try:
                await transactions.assign(self._eos_partitions(assigned))
            except Exception as exc:
                logger.error(
                    "exactly-once: cannot take the assigned partitions, stopping the worker: %r", exc
                )
                transactions.failed = exc
                await self.app.crash(exc)
                return
        await super().on_partitions_assigned(assigned, generation_id)

    def _batch_topics(self) -> Collection[str]:
        """The topics this consumer hands to handlers: the batch agents' and the merged ones'."""
        handlers: Mapping[str, BatchHandler] = getattr(self.app, "batch_handlers", {})
        rounds: Mapping[str, RoundHandler] = getattr(self.app, "round_handlers", {})
        return {*handlers, *rounds}

    def _batch_numbers(self, assigned: Collection[TP]) -> set[int]:
        """The partition numbers of the batch-agent topics in ``assigned`` (Faust's assignor
        gives a worker partition *p* of every such topic, and of their tables' changelogs)."""
        topics = self._batch_topics()
        return {tp.partition for tp in assigned if tp.topic in topics}

    async def _run_hooks(self, name: str) -> None:
        """Run the app's commit hooks ``name`` (``commit_snapshot`` or ``commit_delivery``), in order."""
        for hook in getattr(self.app, name, ()):
            done = hook()
            if inspect.isawaitable(done):
                await done

    def _eos_partitions(self, assigned: set[TP]) -> set[int]:
        """The partition numbers of the batch-agent topics in ``assigned``; an error unless each
        comes with every batch-agent topic's partition of that number (one transaction covers
        them all: see :mod:`agents.transactions`)."""
        topics = set(self._batch_topics())
        ours = {(tp.topic, tp.partition) for tp in assigned if tp.topic in topics}
        numbers = {p for _, p in ours}
        missing = sorted({(t, p) for t in topics for p in numbers} - ours)
        if missing:
            msg = (
                f"exactly-once needs partition p of every input topic on one worker; assigned "
                f"without {missing[:5]}: the input topics' partition counts differ (APP_PARTITIONS)?"
            )
            raise RuntimeError(msg)
        return numbers

    async def _commit_tps(self, tps: Any, start_new_transaction: bool) -> bool:
        """One commit. Exactly-once: :meth:`_commit_transactions`. At least once: under the
        gate (no handler or state-changing timer in the middle), take the offsets after the
        handled batches and hand the changed states to the producer (``commit_snapshot``);
        then, handlers running again, flush and check every delivery (``commit_delivery``)
        and commit the offsets. So the changelog holds the states of exactly the batches the
        offsets cover: a crash reads the rest again on top of states that do not count it.
        (Faust takes the offsets, then awaits, then writes the states: a batch handled in
        that await was in the states but not in the offsets, and counted twice after a crash.)"""
        if self._transactions() is not None:
            return await self._commit_transactions(begin=start_new_transaction)
        return await self._commit_at_least_once(start_new_transaction=start_new_transaction)

    async def _commit_at_least_once(self, *, start_new_transaction: bool, always: bool = False) -> bool:
        """The at-least-once commit (see :meth:`_commit_tps`); ``always``: write the changed
        states even with no offset to commit (before a rebalance: a timer may have changed
        them), and report success when there was nothing to commit."""
        async with self.gate:
            if self._torn is not None:
                return False
            # every partition with handled batches, taken under the gate: ``tps`` was listed
            # before it, and a partition whose first batch ended meanwhile is in the states
            offsets = self._filter_committable_offsets(list(self._filter_tps_with_pending_acks(None)))
            if not offsets and not always:
                return False
            await self._run_hooks("commit_snapshot")
        try:
            await self._handle_attached(offsets)  # Faust's attached messages (the worker has none)
        except ProducerSendError as exc:
            await self.crash(exc)
            return False
        await self._run_hooks("commit_delivery")
        if not offsets:
            return True
        before = {tp: self._committed_offset.get(tp) for tp in offsets}
        done = bool(await super()._commit_offsets(offsets, start_new_transaction=start_new_transaction))
        if not done:
            self._commit_again(offsets, before)
        return done

    def _commit_again(self, offsets: Mapping[TP, int], before: Mapping[TP, int | None]) -> None:
        """After a commit whose offsets did not land (the group rebalanced meanwhile: Faust says
        nothing), make the next commit (the revocation's) take them again. Faust records them as
        committed whatever the outcome, and the batches were taken as committed here: that
        commit found nothing to do, the rebalance took it as clean, and the partitions kept
        were read again from the old offsets on top of states that count them."""
        logger.warning("the offsets of %d partitions were not committed (a rebalance?): the next "
                       "commit takes them again", len(offsets))  # fmt: skip
        for tp, offset in offsets.items():
            self._committed_offset[tp] = before[tp]
            if self._batch_acked.get(tp, -1) < offset:  # a later batch ended meanwhile: it covers this one
                self._batch_acked[tp] = offset
            self._acked.setdefault(tp, [])

    async def _commit_transactions(self, *, begin: bool) -> bool:
        """One exactly-once commit: under the gate (no handler running), take the offsets
        after the handled batches, run the ``commit_snapshot`` hooks (the changed states go to
        the transactions), then commit every partition's transaction with its offsets.

        A failure stops the worker: nothing after it is committed, and the restarted worker
        resumes from the last commit (its producers abort the failed transactions)."""
        transactions, gate = self._transactions(), self.gate
        if transactions is None:
            return False
        async with gate:
            if not transactions.open or transactions.failed is not None:
                return False
            started = time.perf_counter()
            assignment = self.assignment()
            offsets: dict[TP, int] = {}
            for tp in list(self._batch_acked):
                offset = self._held_cap(tp, self._batch_acked.pop(tp))
                committed = self._committed_offset.get(tp)
                if tp in assignment and (committed is None or offset > committed):
                    offsets[tp] = offset
            try:
                await self._run_hooks("commit_snapshot")
                await transactions.commit(offsets, begin=begin)
            except Exception as exc:
                transactions.failed = transactions.failed or exc
                transactions.open = False
                logger.error("exactly-once commit failed, stopping the worker: %r", exc)
                await self.app.crash(exc)
                raise
            COMMIT_SECONDS.observe(time.perf_counter() - started)
            if offsets:
                self._committed_offset.update(offsets)
                self.app.monitor.on_tp_commit(offsets)
            return bool(offsets)

    async def on_stop(self) -> None:
        await super().on_stop()  # its last commit ends the transactions (no new ones begin)
        transactions = self._transactions()
        if transactions is not None:
            app = cast("RulesApp", self.app)
            await app.within_stop_limit("the transactions' end", transactions.close())
        client, self._ends_client = self._ends_client, None
        if client is not None:
            await stop_consumer(client)
        admin, self._offsets_admin = self._offsets_admin, None
        if admin is not None:
            with contextlib.suppress(Exception):  # the cluster gone: nothing left to close cleanly
                await admin.close()

    async def seek_to_committed(self) -> Mapping[TP, int]:
        """Seek every partition to its committed offset; one with none, or 0, to its start.

        aiokafka seeks only to a committed offset above 0: a partition with none kept its
        position. Records fetched and dropped before the seek (a batch fetched while the flow
        was stopped, or the records waiting in a merge) were then never read again: a worker
        that took over a dead one's source partition, never committed, lost the first 9,856
        records it had fetched during the rebalance. The table changelogs' positions are
        Faust's recovery's, not touched here."""
        committed = await super().seek_to_committed()
        fresh = [tp for tp, offset in committed.items() if not offset and not self._is_changelog_tp(tp)]
        for tp in fresh:
            if committed[tp] == 0:
                await self._seek(tp, 0)
        if unset := [tp for tp in fresh if committed[tp] is None]:
            await self._thread.seek_to_beginning(*unset)
        return committed

    async def perform_seek(self) -> None:
        """Seek to the committed offsets, stream partitions paused until flow control resumes.

        The consumer thread runs calls on two workers, so a fetch that was already under way
        could consume records after the seek; Faust then skips them as paused and they were
        never fetched again. So: pause, let that fetch finish, and only then seek.
        """
        streams = frozenset(tp for tp in self.assignment() if not self._is_changelog_tp(tp))
        self.pause_partitions(streams)
        self._held = self._held | streams
        await self._fetches.none()
        self._drop_waiting()  # the seek goes back to the committed offsets, before them
        await super().perform_seek()

    def release_held(self) -> None:
        """Resume what :meth:`perform_seek` paused (still assigned partitions only)."""
        held, self._held = self._held, frozenset()
        if held:
            self.resume_partitions(held & self.assignment())


async def committed_ends(bootstrap: Target, tps: Collection[TP], timeout_s: float = 30.0) -> dict[TP, int]:
    """Per partition: one past the offset of the last record a ``read_committed`` reader gets
    below the partition's last stable offset; its earliest offset when it gets none.

    Faust's recovery reads a changelog partition until it has seen the record at the end
    offset less one. A partition written in transactions ends with a commit (or abort)
    marker, which no consumer ever returns, so that recovery never ended (Faust's own
    exactly-once mode gives up on waiting after two idle 5 s polls). This reads each
    partition's tail backwards, 64 records, then 8 times more each round, until it finds
    a committed record or the partition's start: an aborted transaction's records (a
    worker killed mid-commit) are skipped like the markers.
    """
    parts = {TopicPartition(tp.topic, tp.partition): tp for tp in tps}
    if not parts:
        return {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    consumer = aiokafka.AIOKafkaConsumer(
        **connection(bootstrap),
        enable_auto_commit=False,
        isolation_level="read_committed",
        fetch_max_wait_ms=10,
    )
    await asyncio.wait_for(consumer.start(), timeout_s)
    try:
        consumer.assign(list(parts))
        ends = await asyncio.wait_for(consumer.end_offsets(list(parts)), timeout_s)  # last stable offsets
        starts = await asyncio.wait_for(consumer.beginning_offsets(list(parts)), timeout_s)
        found: dict[TopicPartition, int] = {}
        low = dict(ends)
        step = dict.fromkeys(parts, 64)
        pending = {tp for tp in parts if ends[tp] > starts[tp]}
        while pending:
            for tp in pending:
                low[tp] = max(starts[tp], low[tp] - step[tp])
                consumer.seek(tp, low[tp])
            reading = set(pending)
            while reading:
                if loop.time() > deadline:
                    msg = f"changelog tails not read within {timeout_s:.0f} s: {sorted(reading)}"
                    raise TimeoutError(msg)
                batch = await consumer.getmany(*reading, timeout_ms=100)
                for tp, records in batch.items():
                    last = max((r.offset for r in records if r.offset < ends[tp]), default=None)
                    if last is not None and last > found.get(tp, -1):
                        found[tp] = last
                for tp in list(reading):
                    if await consumer.position(tp) >= ends[tp]:
                        reading.discard(tp)
            for tp in list(pending):
                if tp in found or low[tp] <= starts[tp]:
                    pending.discard(tp)
                else:
                    step[tp] *= 8
        return {orig: found[tp] + 1 if tp in found else starts[tp] for tp, orig in parts.items()}
    finally:
        await consumer.stop()


class WorkerRecovery(Recovery):
    """Faust's table recovery, its end the last committed changelog record (:func:`committed_ends`)."""

    async def _build_highwaters(
        self, consumer: ConsumerT, tps: set[TP], destination: Any, title: str
    ) -> None:
        bootstrap = getattr(self.app, "bootstrap_servers", "")
        if not bootstrap or not tps:
            await super()._build_highwaters(consumer, tps, destination, title)
            return
        target = Endpoint(bootstrap, getattr(self.app, "kafka_auth", KafkaAuth()))
        ends = await committed_ends(target, tps, timeout_s=float(self.app.conf.broker_request_timeout))
        # Faust's "highwater": the offset of the last record recovery will see (-1: none)
        highwaters = {tp: end - 1 for tp, end in ends.items()}
        self.log.info(
            "Last committed record of %s changelog partitions:\n%s",
            title,
            self._highwater_logtable(highwaters, title=title),
        )
        destination.clear()
        destination.update(highwaters)


class WorkerTableManager(TableManager):
    """Faust's table manager with :class:`WorkerRecovery`."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = WorkerRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


#: After this long stopping, the worker logs what each of its tasks waits on (the supervisor
#: kills it at 6 s): how a stop that waited on a flush that never returned was found
STOP_REPORT_S = 3.0


def awaiting() -> str:
    """What each task of the running loop waits on: its chain of awaits, outermost first."""
    lines = []
    for task in asyncio.all_tasks():
        lines.append(f"task {task.get_name()}:")
        awaited: Any = task.get_coro()
        while awaited is not None:  # down the chain of awaits to the innermost
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                lines.append(f"  awaits {awaited!r:.200}")
                break
            owner = frame.f_locals.get("self")
            where = f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
            lines.append(f"  {where}" + (f" of {owner!r:.120}" if owner is not None else ""))
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return "\n".join(lines)


def _report_stop() -> None:
    logger.warning("still stopping after %.0f s; what each task waits on:\n%s", STOP_REPORT_S, awaiting())


def _exit_after_cut() -> None:
    """The stop's last resort, :data:`STOP_CLUSTER_S` after its first step cut short
    (:meth:`RulesApp.within_stop_limit`): a later step may wait on one of them still (exactly
    once, runs of ``tests/agents/test_worker.py`` hung so after the last commit was cut), so
    the process ends here. Nothing is lost, as there."""
    logger.warning("still stopping %.0f s after a step was cut short on a cluster that does not "
                   "answer: exiting now; what was not committed is read again at the next start; "
                   "what each task waits on:\n%s", STOP_CLUSTER_S, awaiting())  # fmt: skip
    logging.shutdown()
    os._exit(0)


class QuietWorker(faust.Worker):
    """Faust's worker without its terminal spinner (and so without a DEBUG root logger), and
    saying what it waits on when a stop takes longer than :data:`STOP_REPORT_S`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spinner = None

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        super().on_setup_root_logger(logger, level)
        quiet_libraries(level)

    async def on_stop(self) -> None:
        asyncio.get_running_loop().call_later(STOP_REPORT_S, _report_stop)
        await super().on_stop()


class IdempotentProducer(Producer):
    """Faust's producer with the idempotent producer on (``RulesApp.idempotence``): a send
    retried after a lost answer is written once and in order. Faust never sets it."""

    def _settings_default(self) -> Mapping[str, Any]:
        settings = dict(super()._settings_default())
        settings["enable_idempotence"] = bool(getattr(self.app, "idempotence", True))
        return settings

    @property
    def _producer_type(self) -> type[aiokafka.AIOKafkaProducer]:
        return TrackingProducer  # see its docstring: a flush that never returned

    async def on_stop(self) -> None:
        app = cast("RulesApp", self.app)
        await app.within_stop_limit("the producer's stop", super().on_stop())


class WorkerTransport(Transport):
    Consumer = BatchConsumer
    Producer = IdempotentProducer


class RulesApp(faust.App):
    """The rule worker's Faust app: standard, except the consumer transport above.

    ``commit_snapshot``: callables run under the gate before every offset commit (the state
    stores' changes handed to the producer); ``commit_delivery``: then, outside it (the flush
    and the check of every delivery; none exactly once, the transactions do it).
    ``batch_handlers``: per topic, the handler of a :meth:`batch_agent`; ``round_handlers``:
    of a :meth:`round_agent`.
    ``early_tasks``: coroutine functions started with the app, before table recovery.
    Faust starts its own tasks (``@app.task``) only once recovery is complete, and
    recovery ends with a seek that waits for the fetch under way (see
    :meth:`BatchConsumer.perform_seek`); a batch handler in that fetch that
    waits for what such a task provides (the registry tables) would wait forever.
    """

    commit_snapshot: tuple[Callable[[], object], ...] = ()  # each may return an awaitable
    commit_delivery: tuple[Callable[[], object], ...] = ()
    early_tasks: tuple[Callable[[], Awaitable[None]], ...] = ()
    #: the idempotent producer (``APP_KAFKA_IDEMPOTENCE``)
    idempotence: bool = True
    #: most records per handler call (a fetch holds up to a few thousand per partition)
    batch_size: int = 500
    #: the cluster's bootstrap servers (``host:port,...``): the changelogs' tails are read there
    bootstrap_servers: str = ""
    #: how the worker authenticates there (``KAFKA_SECURITY_PROTOCOL`` and friends)
    kafka_auth: KafkaAuth = KafkaAuth()
    #: exactly-once (``APP_PROCESSING_GUARANTEE``): the partitions' transactions; None at least once
    transactions: PartitionTransactions | None = None
    #: called at each rebalance, before the tables are restored, with the partition numbers
    #: that left this worker or came to it (memory drops what it holds of them)
    on_partitions_moved: Callable[[set[int]], None] | None = None
    #: whether a merged topic's records wait for its lagging partitions (:mod:`agents.merge`):
    #: the rule worker's do while the source has a regrouped stream
    hold_for_time: Callable[[str], bool] | None = None
    #: the offset of a batch topic's partition's first record its handler still holds (None:
    #: none); the commit stops before it (the rule worker's regroup side, :mod:`agents.merge`)
    held_from: Callable[[TP], int | None] | None = None
    #: forget what the handlers hold: it is read again after a seek or a rebalance
    drop_held: Callable[[], None] | None = None

    def progress(self, topic: str) -> dict[int, tuple[bool, int | None]]:
        """See :meth:`BatchConsumer.progress`."""
        return cast("BatchConsumer", self.consumer).progress(topic)

    def positions(self, topic: str) -> dict[int, int]:
        """See :meth:`BatchConsumer.positions`."""
        return cast("BatchConsumer", self.consumer).positions(topic)

    async def ends(self, topic: str, partitions: Collection[int], timeout_s: float) -> dict[int, int] | None:
        """See :meth:`BatchConsumer.ends`."""
        return await cast("BatchConsumer", self.consumer).ends(topic, partitions, timeout_s)

    async def starts(
        self, topic: str, partitions: Collection[int], timeout_s: float
    ) -> dict[int, int] | None:
        """See :meth:`BatchConsumer.starts`."""
        return await cast("BatchConsumer", self.consumer).starts(topic, partitions, timeout_s)

    def flow_stopped(self) -> bool:
        """Whether a rebalance is under way (the consumer's flow stopped): no batch is handed
        to the handlers then, and the timers that evaluate wait too."""
        return not cast("BatchConsumer", self.consumer).flow_active

    def pace(self, topic: str, partitions: Collection[int]) -> set[int]:
        """See :meth:`BatchConsumer.pace`."""
        return cast("BatchConsumer", self.consumer).pace(topic, partitions)

    def paced(self, topic: str) -> frozenset[int]:
        """See :meth:`BatchConsumer.paced`."""
        return cast("BatchConsumer", self.consumer).paced(topic)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("TableManager", WorkerTableManager)
        super().__init__(*args, **kwargs)
        self.batch_handlers: dict[str, BatchHandler] = {}
        self.round_handlers: dict[str, RoundHandler] = {}
        self._stop_deadline: float | None = None  # set by the stop's first step that needs the cluster
        self._stop_cut = False  # a step of the stop was cut short

    async def on_start(self) -> None:
        await super().on_start()
        for task in self.early_tasks:
            self.add_future(task())  # cancelled when the app stops, as Faust's tasks are
        self.add_future(self.watch_group())  # from the start: a first join can fail too

    async def watch_group(self) -> None:
        """Crash the worker once aiokafka's group routine has stopped
        (:meth:`BatchConsumer.group_failure`), saying why: such a worker takes no partition
        again and reads nothing, while its process, its metrics and its heartbeats may look
        well. Its supervisor (``make run``'s, or the orchestrator's) starts it again, and the
        new process joins the group afresh. Found when Faust's assignor asserted on a static
        member's URL (``agents.assignor``); this covers whatever else may stop it."""
        consumer = cast("BatchConsumer", self.consumer)
        while True:
            await asyncio.sleep(GROUP_CHECK_S)
            if self.should_stop:  # a stop's own end of the routine is no failure
                return
            failure = consumer.group_failure()
            if failure is not None:
                logger.error("the worker's consumer group routine stopped (%r): it would take no "
                             "partition again and read nothing; the worker stops, for its "
                             "supervisor to start it again", failure)  # fmt: skip
                await self.crash(failure)
                return

    async def within_stop_limit(self, what: str, step: Awaitable[None]) -> None:
        """Run ``step`` of the worker's stop, cut short once the stop has waited
        :data:`STOP_CLUSTER_S` in all on such steps (the cluster gone, or not answering)."""
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + STOP_CLUSTER_S
        task = asyncio.ensure_future(step)
        # not wait_for: it waits for the cancelled step to end, and a commit waiting on the
        # producer's flush did not end on cancel; the step is left to the loop's last cancel
        await asyncio.wait({task}, timeout=max(0.1, self._stop_deadline - time.monotonic()))
        if task.done():
            task.result()
        else:
            task.cancel()
            if self._stop_cut:
                logger.warning("stopping without %s too", what)
            else:
                logger.warning("stopping without %s: the cluster did not answer within %.0f s of the "
                               "stop; what was not committed is read again at the next start",
                               what, STOP_CLUSTER_S)  # fmt: skip
                asyncio.get_running_loop().call_later(STOP_CLUSTER_S, _exit_after_cut)
            self._stop_cut = True

    async def _consumer_wait_empty(self, consumer: Any, logger: Any) -> None:
        """Faust's (the handlers' last records, then the last commit), within the stop's limit
        when the app stops; as it is at a rebalance."""
        if not self.should_stop:
            return await super()._consumer_wait_empty(consumer, logger)
        await self.within_stop_limit("the last commit", super()._consumer_wait_empty(consumer, logger))

    async def _producer_flush(self, logger: Any) -> None:
        """Faust's, within the stop's limit when the app stops; as it is at a rebalance."""
        if not self.should_stop:
            return await super()._producer_flush(logger)
        await self.within_stop_limit("the producer's flush", super()._producer_flush(logger))

    def exclusive(self) -> asyncio.Lock:
        """The commit gate, for a timer that changes rule states and hands their outputs to
        the producer: held across both, a commit never takes the states without the outputs."""
        return cast("BatchConsumer", self.consumer).gate

    def restore_from_start(self, partitions: Collection[int]) -> None:
        """Have the coming table recovery read the changelogs of ``partitions`` from their
        start, kept partitions included (Faust reads a kept one from where it last stopped)."""
        recovery = cast("WorkerTableManager", self.tables).recovery
        for tp in [tp for tp in recovery.active_offsets if tp.partition in partitions]:
            del recovery.active_offsets[tp]

    def enable_transactions(self) -> PartitionTransactions:
        """Exactly-once from now on (before the worker starts): see :mod:`agents.transactions`."""
        self.transactions = PartitionTransactions(self.conf.id, self.new_transactional_producer)
        return self.transactions

    def new_transactional_producer(self, transactional_id: str) -> aiokafka.AIOKafkaProducer:
        """An unstarted aiokafka producer with the worker producer's settings and ``transactional_id``."""
        producer = cast("IdempotentProducer", self.producer)
        options = {
            **producer._settings_default(),  # noqa: SLF001 - Faust's settings for its own producer
            **producer._settings_auth(),  # noqa: SLF001
            "acks": "all",
            "enable_idempotence": True,
        }
        return TrackingProducer(
            **options, transactional_id=transactional_id, transaction_timeout_ms=TRANSACTION_TIMEOUT_MS
        )

    def batch_agent(self, topic: str) -> Callable[[BatchHandler], BatchHandler]:
        """Subscribe to ``topic`` and have ``handler(tp, records)`` process it a batch at a time."""

        def register(handler: BatchHandler) -> BatchHandler:
            self._subscribe(topic)
            self.batch_handlers[topic] = handler
            return handler

        return register

    def round_agent(self, topic: str) -> Callable[[RoundHandler], RoundHandler]:
        """Subscribe to ``topic`` and have ``handler(parts)`` process it a round at a time: its
        partitions' records merged by record time while :attr:`hold_for_time` says so
        (:mod:`agents.merge`), each partition's in offset order."""

        def register(handler: RoundHandler) -> RoundHandler:
            self._subscribe(topic)
            self.round_handlers[topic] = handler
            return handler

        return register

    def _subscribe(self, topic: str) -> None:
        if topic in self.batch_handlers or topic in self.round_handlers:
            msg = f"topic {topic} already has a batch agent"
            raise ValueError(msg)
        self.topics.add(self.topic(topic, key_serializer="raw", value_serializer="raw"))

    def on_rebalance_end(self) -> None:
        super().on_rebalance_end()
        consumer = self.consumer
        if isinstance(consumer, BatchConsumer):
            consumer.release_held()

    def _new_transport(self) -> TransportT:
        transport: TransportT = WorkerTransport(self.conf.broker_consumer, self)
        return transport
