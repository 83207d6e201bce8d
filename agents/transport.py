"""Faust's aiokafka transport, fixed for two ways a restarted worker lost data.

**Exact high watermarks for changelog recovery.**

Faust recovers a table by reading its changelog up to the high watermark it
gets from ListOffsets(latest). The embedded Tansu broker answers that with
the base offset of the last record batch plus one, so when several state
updates went out in one batch, recovery stopped early and a restarted worker
lost window and lifecycle state. This consumer thread also reads the true
high watermark from a Fetch response (:func:`app.kafka.high_watermarks`)
and uses the larger value; on Apache Kafka both agree.

**No stream records fetched between resume and seek.** After recovery,
Faust's ``Recovery`` resumes the stream partitions, *then* seeks them to the
committed offsets, and only then resumes flow control, which clears every
stream queue. Records fetched in that gap were delivered, advanced Faust's
read offset and the fetch position, and were then cleared from the queue, so
a worker restarted after events arrived sometimes consumed none of them
until new events came. :meth:`ExactHighwaterConsumer.perform_seek` holds the
stream partitions paused through the seek, and :meth:`RulesApp.on_rebalance_end`
releases them once flow control is active again.

These are subclasses wired in by :class:`RulesApp`; nothing in Faust is patched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer, Transport
from faust.types import TP, TransportT

from app.kafka import high_watermarks

logger = logging.getLogger(__name__)


#: Default longest wait of a fetch on the broker (``RulesApp.fetch_max_wait_ms``,
#: ``APP_FETCH_MAX_WAIT_MS``). Faust hard-codes 1.5 s; the embedded Tansu broker answers a
#: waiting fetch only when that time is up, so every record that arrived during a wait was
#: delayed by up to 1.5 s (p50 ~410 ms). Apache Kafka answers as soon as data arrives; for
#: it a short wait only means more idle fetches.
FETCH_MAX_WAIT_MS = 5


class ExactHighwaterConsumerThread(AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        wait = getattr(self.app, "fetch_max_wait_ms", FETCH_MAX_WAIT_MS)
        consumer._fetch_max_wait_ms = wait  # noqa: SLF001 - read by start()
        return consumer

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        listed = dict(await super()._highwaters(partitions))
        if not partitions:
            return listed
        bootstrap = ",".join(f"{u.host}:{u.port}" for u in self.app.conf.broker_consumer)
        marks = await high_watermarks(bootstrap, sorted({tp.topic for tp in partitions}))
        for tp in partitions:
            exact = marks.get(tp)
            if exact is not None and exact > (listed.get(tp) or 0):
                logger.debug("high watermark of %s: %d (ListOffsets said %s)", tp, exact, listed.get(tp))
                listed[tp] = exact
        return listed


class ExactHighwaterConsumer(Consumer):
    _held: frozenset[TP] = frozenset()
    _fetches_in_flight: int = 0
    _no_fetch_in_flight: asyncio.Event | None = None

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return ExactHighwaterConsumerThread(self, loop=self.loop, beacon=self.beacon)

    def _idle_event(self) -> asyncio.Event:
        if self._no_fetch_in_flight is None:
            self._no_fetch_in_flight = asyncio.Event()
            self._no_fetch_in_flight.set()
        return self._no_fetch_in_flight

    async def _wait_next_records(self, timeout: float) -> Any:
        idle = self._idle_event()
        self._fetches_in_flight += 1
        idle.clear()
        try:
            return await super()._wait_next_records(timeout)
        finally:
            self._fetches_in_flight -= 1
            if not self._fetches_in_flight:
                idle.set()

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
        for flush in getattr(self.app, "before_commit", ()):
            flush()
        return await super()._commit_offsets(offsets, start_new_transaction)

    def release_held(self) -> None:
        """Resume what :meth:`perform_seek` paused (still assigned partitions only)."""
        held, self._held = self._held, frozenset()
        if held:
            self.resume_partitions(held & self.assignment())


class ExactHighwaterTransport(Transport):
    Consumer = ExactHighwaterConsumer


class RulesApp(faust.App):
    """The rule worker's Faust app: standard, except the consumer transport above.

    ``before_commit``: callables run before every offset commit (the state stores' flush).
    """

    before_commit: tuple[Callable[[], object], ...] = ()
    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS

    def on_rebalance_end(self) -> None:
        super().on_rebalance_end()
        consumer = self.consumer
        if isinstance(consumer, ExactHighwaterConsumer):
            consumer.release_held()

    def _new_transport(self) -> TransportT:
        transport: TransportT = ExactHighwaterTransport(self.conf.broker_consumer, self)
        return transport
