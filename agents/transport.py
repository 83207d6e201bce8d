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
when the handler returns. Offsets are then committed by Faust's own commit
loop (``_new_offset``), with its flush of the producer and, before it, the
``before_commit`` hooks (the rule worker's: write the changed states, flush,
check every delivery), so delivery stays at least once. Every other topic
(table changelogs in recovery, other agents) takes Faust's path unchanged.

**No spinner.** Faust's worker draws a progress spinner and, for it, sets the
root logger to DEBUG whenever the log level is WARN or above, so every debug
call in the process (aiokafka logs one per record produced) built a log
record for a spinner nobody sees. :class:`QuietWorker` has no spinner.

These are subclasses wired in by :class:`RulesApp`; nothing in Faust is patched.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer, Producer, Transport
from faust.types import TP, TransportT

logger = logging.getLogger(__name__)

#: A batch agent's handler: the partition and its records, in offset order.
BatchHandler = Callable[[TP, list[Any]], Awaitable[None]]


#: Longest wait for the consumer's thread to stop (mode's default: 60 s). Its stop only stops
#: aiokafka's consumer: it leaves the group and closes the connections. With the cluster gone,
#: that retried until the 60 s were up, so a SIGTERM took a minute to stop the worker. Cutting
#: it short loses nothing: offsets go through the consumer's own commits, and what they did not
#: cover is read again after a restart (at least once, as after a crash).
CONSUMER_THREAD_STOP_S = 5.0


class WorkerConsumerThread(AIOKafkaConsumerThread):
    shutdown_timeout = CONSUMER_THREAD_STOP_S


class BatchConsumer(Consumer):
    _held: frozenset[TP] = frozenset()
    _fetches_in_flight: int = 0
    _no_fetch_in_flight: asyncio.Event | None = None
    #: per batch-agent partition: the offset after the last batch its handler finished
    _batch_acked: dict[TP, int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._batch_acked = {}

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return WorkerConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def _idle_event(self) -> asyncio.Event:
        if self._no_fetch_in_flight is None:
            self._no_fetch_in_flight = asyncio.Event()
            self._no_fetch_in_flight.set()
        return self._no_fetch_in_flight

    async def _wait_next_records(self, timeout: float) -> Any:
        """Fetch; hand batch-agent partitions to their handlers, the rest to Faust's streams.

        The handlers run inside the fetch's in-flight window, so :meth:`perform_seek`
        waits for a batch under evaluation before it moves the position.
        """
        idle = self._idle_event()
        self._fetches_in_flight += 1
        idle.clear()
        try:
            records, active = await super()._wait_next_records(timeout)
            handlers: Mapping[str, BatchHandler] = getattr(self.app, "batch_handlers", {})
            if records and handlers:
                records = await self._deliver_batches(records, active, handlers)
            return records, active
        finally:
            self._fetches_in_flight -= 1
            if not self._fetches_in_flight:
                idle.set()

    async def _deliver_batches(
        self, records: Mapping[TP, list[Any]], active: set[TP] | None, handlers: Mapping[str, BatchHandler]
    ) -> dict[TP, list[Any]]:
        """Run the handlers of the batch-agent partitions in ``records``; return the other partitions.

        A batch fetched while flow control is off (a rebalance began), after the
        generation changed, or for a partition no longer active is dropped
        unprocessed, as Faust's ``getmany`` drops records then: the position is
        reset to the committed offset when the rebalance ends, so it is read again.
        """
        rest: dict[TP, list[Any]] = {}
        generation = self.app.consumer_generation_id
        size = max(1, int(getattr(self.app, "batch_size", 500)))
        monitor = self.app.monitor
        for tp, batch in records.items():
            handler = handlers.get(tp.topic)
            if handler is None:
                rest[tp] = batch
                continue
            read = self._read_offset[tp]
            if read is not None and batch and batch[0].offset < read:
                batch = [r for r in batch if r.offset >= read]  # already processed: re-fetched after a seek
            for start in range(0, len(batch), size):
                if not self.flow_active or self.should_stop or self.app.consumer_generation_id != generation:
                    return rest
                if active is not None and tp not in active and tp not in self._buffered_partitions:
                    break
                chunk = batch[start : start + size]
                await handler(tp, chunk)
                after = chunk[-1].offset + 1
                self._read_offset[tp] = after
                self._acked.setdefault(tp, [])  # lists tp in Faust's commit loop
                self._batch_acked[tp] = after
                if monitor is not None:
                    monitor.stream_inbound_time[tp] = time.monotonic()  # Faust's "stream idle" check
                await asyncio.sleep(0)  # let timers (the commit each second) and other tasks run
        return rest

    def _new_offset(self, tp: TP) -> int | None:
        """The offset to commit: past the last handled batch for batch-agent partitions."""
        done = self._batch_acked.pop(tp, None)
        return done if done is not None else super()._new_offset(tp)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        for tp in revoked:
            self._batch_acked.pop(tp, None)
        await super().on_partitions_revoked(revoked)

    async def perform_seek(self) -> None:
        """Seek to the committed offsets, stream partitions paused until flow control resumes.

        The consumer thread runs calls on two workers, so a fetch that was already under way
        could consume records after the seek; Faust then skips them as paused and they were
        never fetched again. So: pause, let that fetch finish, and only then seek.
        """
        streams = frozenset(tp for tp in self.assignment() if not self._is_changelog_tp(tp))
        self.pause_partitions(streams)
        self._held = self._held | streams
        await self._idle_event().wait()
        await super().perform_seek()

    async def _commit_offsets(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        """Write the rule state first, so the changelog always covers the offsets committed."""
        for hook in getattr(self.app, "before_commit", ()):
            done = hook()
            if inspect.isawaitable(done):
                await done
        return await super()._commit_offsets(offsets, start_new_transaction)

    def release_held(self) -> None:
        """Resume what :meth:`perform_seek` paused (still assigned partitions only)."""
        held, self._held = self._held, frozenset()
        if held:
            self.resume_partitions(held & self.assignment())


class QuietWorker(faust.Worker):
    """Faust's worker without its terminal spinner (and so without a DEBUG root logger)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spinner = None


class IdempotentProducer(Producer):
    """Faust's producer with the idempotent producer on (``RulesApp.idempotence``): a send
    retried after a lost answer is written once and in order. Faust never sets it."""

    def _settings_default(self) -> Mapping[str, Any]:
        settings = dict(super()._settings_default())
        settings["enable_idempotence"] = bool(getattr(self.app, "idempotence", True))
        return settings


class WorkerTransport(Transport):
    Consumer = BatchConsumer
    Producer = IdempotentProducer


class RulesApp(faust.App):
    """The rule worker's Faust app: standard, except the consumer transport above.

    ``before_commit``: callables run before every offset commit (the state stores' flush).
    ``batch_handlers``: per topic, the handler of a :meth:`batch_agent`.
    ``early_tasks``: coroutine functions started with the app, before table recovery.
    Faust starts its own tasks (``@app.task``) only once recovery is complete, and
    recovery ends with a seek that waits for the fetch under way (see
    :meth:`BatchConsumer.perform_seek`); a batch handler in that fetch that
    waits for what such a task provides (the registry tables) would wait forever.
    """

    before_commit: tuple[Callable[[], object], ...] = ()  # each may return an awaitable
    early_tasks: tuple[Callable[[], Awaitable[None]], ...] = ()
    #: the idempotent producer (``APP_KAFKA_IDEMPOTENCE``)
    idempotence: bool = True
    #: most records per handler call (a fetch holds up to a few thousand per partition)
    batch_size: int = 500

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch_handlers: dict[str, BatchHandler] = {}

    async def on_start(self) -> None:
        await super().on_start()
        for task in self.early_tasks:
            self.add_future(task())  # cancelled when the app stops, as Faust's tasks are

    def batch_agent(self, topic: str) -> Callable[[BatchHandler], BatchHandler]:
        """Subscribe to ``topic`` and have ``handler(tp, records)`` process it a batch at a time."""

        def register(handler: BatchHandler) -> BatchHandler:
            if topic in self.batch_handlers:
                msg = f"topic {topic} already has a batch agent"
                raise ValueError(msg)
            self.batch_handlers[topic] = handler
            self.topics.add(self.topic(topic, key_serializer="raw", value_serializer="raw"))
            return handler

        return register

    def on_rebalance_end(self) -> None:
        super().on_rebalance_end()
        consumer = self.consumer
        if isinstance(consumer, BatchConsumer):
            consumer.release_held()

    def _new_transport(self) -> TransportT:
        transport: TransportT = WorkerTransport(self.conf.broker_consumer, self)
        return transport
