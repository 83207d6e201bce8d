"""Validated, bounded publishing of events to one topic, with a dead-letter path.

Lifecycle: ``async with Publisher(settings, topic, source, adapter) as pub:``
starts a producer from :func:`app.kafka.clients.make_producer`; each ``await
pub.publish(item)`` validates ``item`` with the source schema and sends the
normalised event keyed by its key, or sends a :func:`app.events.dlq_record` to
``dlq.events`` keyed by the source. Leaving the block flushes and awaits every
delivery. One publisher belongs to one event loop; it is not thread-safe.

Acknowledgements: :meth:`send`, :meth:`reject` and :meth:`send_record` return
the record's delivery future, which resolves once the broker acknowledged it
(``acks=all``) or fails; callers that answer a client only after the broker
has the data (the HTTP endpoint, the file tailer's position, the MQTT bridge's
PUBACK) await these. :meth:`flush` awaits everything sent so far. Callers that
validate first and publish later (all-or-nothing batches) use :meth:`check`
and :meth:`accept` instead of :meth:`admit`.

Backpressure: at most ``max_in_flight`` sends are outstanding; ``publish``
waits for deliveries beyond that.

Broker outages: the producer is idempotent (``acks=all``), so it retries the records in
flight until the broker is back, without duplicates and in order; meanwhile ``publish``
waits (the input is held, nothing is dropped). A wait longer than :data:`STALL_WARN_S`
logs one WARNING, and one INFO once the broker acknowledges again. A record counts in
``failed`` only when the producer gives it up (a non-retriable error; without
idempotence also a record unacknowledged after ``request_timeout_ms``).

Counters are both Prometheus metrics (per process) and plain attributes (per publisher).
``produced`` and ``dead_lettered`` count broker acknowledgements, so after close they are
what is on the topics. Kafka record timestamps are left at produce time on purpose: event time lives in
``ts``, and 2013 record timestamps would be deleted at once by topic retention.

Event time: with ``wall_clock`` (the default: live adapters), :meth:`check`
also refuses an event more than ``APP_MAX_EVENT_SKEW`` ahead of the wall clock
or more than ``APP_MAX_EVENT_AGE`` behind it (:class:`app.eventtime.WallClockBound`);
a replay of a recorded file passes ``wall_clock=False``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType
from typing import Any, TypeAlias

import orjson
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from prometheus_client import Counter, Gauge

from app import topics
from app.errors import BrokerError, ConfigError, IngestDecodeError
from app.events import Event, dlq_record, encode, schema_for
from app.eventtime import WallClockBound
from app.kafka.clients import make_producer
from app.kafka.errors import CLIENT_ERRORS
from app.runtime.settings import Settings
from ingest.model import ConvertError

logger = logging.getLogger(__name__)

NO_BOOTSTRAP = "KAFKA_BOOTSTRAP_SERVERS is not set; start the system with `make run` or point it at a cluster"
#: A publisher held this long by unacknowledged records logs that Kafka is not answering.
STALL_WARN_S = 5.0

ACCEPTED = Counter("ingest_accepted_total", "Events that passed validation", ["source", "adapter"])
REJECTED = Counter("ingest_rejected_total", "Inputs sent to the dead-letter topic", ["source", "adapter"])
PRODUCED = Counter("ingest_produced_total", "Records acknowledged by the broker", ["topic"])
IN_FLIGHT = Gauge("ingest_in_flight", "Records sent but not yet acknowledged")

#: at most this long connecting ahead of the first event (``Publisher._warm_up``)
WARM_UP_S = 5.0
#: A record's delivery: resolves to its RecordMetadata once the broker acknowledged it.
Delivery: TypeAlias = asyncio.Future[Any]


class Publisher:
    """Publishes ``source`` events to ``topic``; see the module docstring for the contract."""

    def __init__(
        self,
        settings: Settings,
        topic: str,
        source: str,
        adapter: str,
        *,
        max_in_flight: int = 1000,
        start_timeout_s: float = 30.0,
        close_timeout_s: float = 60.0,
        wall_clock: bool = True,
    ) -> None:
        self.schema = schema_for(source)
        self._time_bound = WallClockBound.of(settings) if wall_clock else None
        self.topic, self.source, self.adapter = topic, source, adapter
        self._settings = settings
        self._max_in_flight = max(1, max_in_flight)
        self._room = asyncio.Event()  # set while fewer than max_in_flight are pending
        self._room.set()
        self._start_timeout_s, self._close_timeout_s = start_timeout_s, close_timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self.accepted = self.rejected = 0  # validated / dead-lettered inputs
        self.produced = self.dead_lettered = 0  # acknowledged on topic / on dlq.events
        self.failed = 0  # records the broker never acknowledged
        self.last_error: BaseException | None = None
        self._accepted_metric = ACCEPTED.labels(source, adapter)
        self._rejected_metric = REJECTED.labels(source, adapter)
        self._produced_metric = {t: PRODUCED.labels(t) for t in (topic, topics.DLQ)}

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def __aenter__(self) -> Publisher:
        if not self._settings.bootstrap_servers:
            raise ConfigError(NO_BOOTSTRAP)
        producer = make_producer(self._settings)
        try:
            await asyncio.wait_for(producer.start(), self._start_timeout_s)
        except CLIENT_ERRORS as exc:
            await producer.stop()
            msg = f"cannot start a producer on {self._settings.bootstrap_servers}: {exc!r}"
            if self._settings.enable_idempotence:
                msg += " (a cluster that refuses InitProducerId needs APP_KAFKA_IDEMPOTENCE=off)"
            raise BrokerError(msg) from exc
        self._producer = producer
        try:
            await asyncio.wait_for(self._warm_up(producer), WARM_UP_S)
        except CLIENT_ERRORS as exc:  # TimeoutError among them
            logger.info("%s: not connected before the first event (%r)", self.topic, exc)
        return self

    async def _warm_up(self, producer: AIOKafkaProducer) -> None:
        """Fetch the topic's metadata and connect to its partitions' leaders now, so the first
        event does not wait for either (on ``make run``'s broker each connection is a SASL
        handshake): a producer paced on the demo's clock sends its first events on time. Beside
        another ``make run`` on 2 cores, the fleet's readings that came too late for
        ``device-silent`` made 8 and 7 silences in a pair of runs without it, none and 1 in a
        pair with it; how far behind they came varied as much either way (up to 52 and 41
        minutes of event time), so this is not all of that lateness."""
        cluster = producer.client.cluster
        parts = await producer.partitions_for(self.topic)
        leaders = {cluster.leader_for_partition(TopicPartition(self.topic, p)) for p in parts}
        for node in sorted(n for n in leaders if n is not None and n >= 0):
            await producer.client.ready(node)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def publish(self, item: object) -> Event | None:
        """Validate and send ``item``; return the event, or None if it was dead-lettered."""
        event = await self.admit(item)
        if event is not None:
            await self.send(event)
        return event

    async def admit(self, item: object) -> Event | None:
        """Validate ``item`` (raw JSON as bytes or str, or a decoded object)
        without sending it. Invalid input is dead-lettered here and None returned."""
        try:
            event = self.check(item)
        except IngestDecodeError as exc:
            raw = item if isinstance(item, bytes | str) else orjson.dumps(item, default=str)
            await self.reject(exc.reason, raw, field=exc.field)
            return None
        return self.accept(event)

    async def submit(self, item: object, *, where: str = "") -> Delivery:
        """Validate and send ``item``, or dead-letter it (also a ConvertError, with
        ``where`` and its reason); return the delivery future either way, so the
        caller can track the acknowledgement of every input in order."""
        if isinstance(item, ConvertError):
            prefix = f"{where}: " if where else (f"line {item.line}: " if item.line else "")
            return await self.reject(prefix + item.reason, item.raw, field=item.field)
        try:
            event = self.check(item)
        except IngestDecodeError as exc:
            raw = item if isinstance(item, bytes | str) else orjson.dumps(item, default=str)
            reason = f"{where}: {exc.reason}" if where else exc.reason
            return await self.reject(reason, raw, field=exc.field)
        return await self.send(self.accept(event))

    def check(self, item: object) -> Event:
        """Validate ``item`` with the source schema and the wall-clock bound, and return the
        event; raises IngestDecodeError with the reason and field. No side effect but the
        ``events_time_refused_total`` counter of an event refused for its time."""
        event = self.schema.decode(item) if isinstance(item, bytes | str) else self.schema.validate(item)
        if self._time_bound is not None:
            self._time_bound.check(event, self.source)
        return event

    def accept(self, event: Event) -> Event:
        """Count an event validated with :meth:`check` as accepted; returns it."""
        self.accepted += 1
        self._accepted_metric.inc()
        return event

    async def send(self, event: Event, *, where: str = "") -> Delivery:
        """Send an already validated event keyed by ``event.key``; an event too
        large for the producer is dead-lettered instead, its reason prefixed with
        ``where`` (``FILE:LINE``) when given. Returns the delivery future (of the
        dead-letter record in that case)."""
        value = encode(event.fields)
        try:
            return await self._send(self.topic, event.key.encode(), value, dead_letter=False)
        except MessageSizeTooLargeError as exc:
            prefix = f"{where}: " if where else ""
            return await self.reject(f"{prefix}event too large to produce: {exc}", value)

    async def send_record(self, key: str, value: bytes | None, *, topic: str | None = None) -> Delivery:
        """Send a record that the caller validated by its own rules (a table row,
        or ``None``: a tombstone on a compacted topic), keyed by ``key``, to
        ``topic`` (default: the publisher's). Counted as accepted and produced."""
        self.accepted += 1
        self._accepted_metric.inc()
        return await self._send(topic or self.topic, key.encode(), value, dead_letter=False)

    async def reject(self, reason: str, raw: bytes | str, *, field: str | None = None) -> Delivery:
        """Send a dead-letter record for input that cannot become an event (the payload whole,
        unless the record would be too large for Kafka: see :func:`app.events.dlq_record`);
        returns its delivery future."""
        self.rejected += 1
        self._rejected_metric.inc()
        record = dlq_record(self.source, reason, raw, adapter=self.adapter, field=field)
        return await self._send(topics.DLQ, self.source.encode(), record, dead_letter=True)

    async def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every record sent so far is acknowledged or failed; True
        when all of them were acknowledged (``failed`` did not grow). Raises
        TimeoutError after ``timeout_s``; the records stay in flight."""
        if self._producer is None:
            msg = "Publisher used outside `async with` (or after close)"
            raise RuntimeError(msg)
        failed = self.failed
        pending = list(self._pending)
        if pending:
            await asyncio.wait_for(asyncio.wait(pending), timeout_s)
        return self.failed == failed

    async def _send(self, topic: str, key: bytes, value: bytes | None, *, dead_letter: bool) -> Delivery:
        if self._producer is None:
            msg = "Publisher used outside `async with` (or after close)"
            raise RuntimeError(msg)
        while len(self._pending) >= self._max_in_flight:
            self._room.clear()
            await self._wait_for_room()
        try:
            fut = await self._producer.send(topic, value=value, key=key)
        except MessageSizeTooLargeError:
            raise
        except KafkaError as exc:
            msg = f"cannot send to {topic}: {exc!r}"
            raise BrokerError(msg) from exc
        self._pending.add(fut)
        IN_FLIGHT.inc()
        fut.add_done_callback(lambda f: self._on_done(topic, dead_letter, f))
        return fut

    async def _wait_for_room(self) -> None:
        """Wait until fewer than ``max_in_flight`` records are unacknowledged; say so when
        that takes longer than :data:`STALL_WARN_S` (the broker is gone or stalled)."""
        try:
            await asyncio.wait_for(self._room.wait(), STALL_WARN_S)
            return
        except TimeoutError:
            pass
        began = time.monotonic()
        logger.warning(
            "Kafka acknowledged nothing for %.0f s (%d records for %s wait); input is held and "
            "the producer retries until it answers", STALL_WARN_S, len(self._pending), self.topic,
        )  # fmt: skip
        await self._room.wait()
        logger.info(
            "Kafka acknowledges again after %.1f s; publishing", STALL_WARN_S + time.monotonic() - began
        )

    def _on_done(self, topic: str, dead_letter: bool, fut: asyncio.Future[Any]) -> None:
        self._pending.discard(fut)
        IN_FLIGHT.dec()
        if len(self._pending) < self._max_in_flight:
            self._room.set()
        exc = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or exc is not None:
            self.failed += 1
            self.last_error = exc or asyncio.CancelledError()
            logger.error("delivery to %s failed: %r", topic, self.last_error)
            return
        metric = self._produced_metric.get(topic) or self._produced_metric.setdefault(
            topic, PRODUCED.labels(topic)
        )
        metric.inc()
        if dead_letter:
            self.dead_lettered += 1
        else:
            self.produced += 1

    async def close(self) -> None:
        """Flush, await every outstanding delivery (bounded by ``close_timeout_s``)
        and stop the producer. Safe to call twice. Deliveries that fail or time
        out are counted in ``failed``; close itself does not raise for them."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            await asyncio.wait_for(self._drain(producer), self._close_timeout_s)
        except (TimeoutError, KafkaError) as exc:
            self.last_error = exc
            logger.error("flushing %d records to %s failed: %r", len(self._pending), self.topic, exc)
        finally:
            await producer.stop()
            for fut in list(self._pending):
                fut.cancel()
            await asyncio.sleep(0)  # let the done callbacks of cancelled futures run

    async def _drain(self, producer: AIOKafkaProducer) -> None:
        await producer.flush()
        if self._pending:
            await asyncio.wait(list(self._pending))
