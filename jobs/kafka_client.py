"""Blocking Kafka calls for the Spark data source, over aiokafka.

Spark calls the source's methods synchronously, in Python worker processes, so
each function here runs its own short-lived event loop and client. Nothing is
shared between calls or threads.

Errors are :class:`KafkaSourceError` with a message that names the broker,
the topic and what to do: an unreachable broker, a missing topic, a fetch that
makes no progress within the timeout, or lost offsets.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from app.errors import BrokerError
from app.kafka.clients import Endpoint, topic_partitions
from jobs.kafka_offsets import TP, KafkaSourceOptions, Offsets

logger = logging.getLogger(__name__)

FETCH_RECORDS = 5000
#: one wait for records; short, because a fetch that holds only a transaction marker (or
#: aborted records) yields nothing yet moves the position, which the loop then sees
POLL_MS = 100
#: how long a subscribed topic may be absent from metadata before it counts as missing: a
#: topic created a moment ago is left out until its partitions have a leader
NEW_TOPIC_S = 2.0


class KafkaSourceError(BrokerError):
    """The Kafka source cannot do its job: the message says why and what to check."""


def _unreachable(opts: KafkaSourceOptions, exc: BaseException) -> KafkaSourceError:
    return KafkaSourceError(
        f"cannot reach Kafka at {opts.bootstrap} ({exc!r}); check 'kafka.bootstrap.servers' "
        "and that the broker is running"
    )


def _consumer(opts: KafkaSourceOptions, **kw: object) -> AIOKafkaConsumer:
    timeout = min(opts.timeout_ms, 30_000)
    return AIOKafkaConsumer(
        bootstrap_servers=opts.bootstrap,
        **opts.auth.client_options(),
        enable_auto_commit=False,
        request_timeout_ms=timeout,
        metadata_max_age_ms=5_000,
        isolation_level=opts.isolation,
        **kw,
    )


async def _subscribed(opts: KafkaSourceOptions, consumer: AIOKafkaConsumer) -> list[TP]:
    """The partitions of the subscription; a :class:`KafkaSourceError` for a missing topic or
    assigned partition."""
    timeout_s = opts.timeout_ms / 1000
    existing = await asyncio.wait_for(consumer.topics(), timeout_s)
    if opts.pattern is not None:
        rx = re.compile(opts.pattern)
        topics = sorted(t for t in existing if rx.fullmatch(t))
    else:
        topics = sorted({t for t in opts.subscribe} | {t for t, _ in opts.assign})
        settle = time.monotonic() + min(NEW_TOPIC_S, timeout_s)
        while (missing := [t for t in topics if t not in existing]) and time.monotonic() < settle:
            await asyncio.sleep(0.1)
            existing = await asyncio.wait_for(consumer.topics(), timeout_s)
        if missing:
            msg = (
                f"topic(s) {', '.join(missing)} do not exist on {opts.bootstrap}; create them "
                "(`python -m app topics`) or fix the 'subscribe'/'assign' option"
            )
            raise KafkaSourceError(msg)
    parts = await topic_partitions(Endpoint(opts.bootstrap, opts.auth), topics, timeout_s)
    tps = [(t, p) for t in topics for p in parts.get(t, ())]
    if opts.assign:
        unknown = sorted(set(opts.assign) - set(tps))
        if unknown:
            msg = f"assigned partition(s) {unknown} do not exist on {opts.bootstrap}"
            raise KafkaSourceError(msg)
        tps = sorted(opts.assign)
    return tps


@dataclass(frozen=True)
class Snapshot:
    """The partitions of the subscription with their earliest and latest offsets."""

    partitions: list[TP]
    earliest: Offsets
    latest: Offsets


async def _snapshot(opts: KafkaSourceOptions, *, offsets: bool) -> Snapshot:
    consumer = _consumer(opts)
    timeout_s = opts.timeout_ms / 1000
    try:
        await asyncio.wait_for(consumer.start(), min(timeout_s, 15))
        tps = await _subscribed(opts, consumer)
        if not offsets or not tps:
            return Snapshot(tps, {}, {})
        tpos = [TopicPartition(t, p) for t, p in tps]
        first = await asyncio.wait_for(consumer.beginning_offsets(tpos), timeout_s)
        last = await asyncio.wait_for(consumer.end_offsets(tpos), timeout_s)
    except KafkaSourceError:
        raise
    except (TimeoutError, KafkaError, OSError, BrokerError) as exc:
        raise _unreachable(opts, exc) from exc
    finally:
        await consumer.stop()
    earliest = {(tp.topic, tp.partition): int(o) for tp, o in first.items()}
    latest = {(tp.topic, tp.partition): int(o) for tp, o in last.items()}
    return Snapshot(tps, earliest, {tp: max(latest[tp], earliest[tp]) for tp in tps})


def snapshot(opts: KafkaSourceOptions) -> Snapshot:
    """Discover the subscribed partitions and their offset bounds (one client session).

    Latest offsets are the end offsets of the isolation level: the high watermark,
    or with ``read_committed`` the last stable offset (before the first open
    transaction), as Spark's connector and a Kafka consumer see them.
    """
    return asyncio.run(_snapshot(opts, offsets=True))


def check_subscription(opts: KafkaSourceOptions) -> list[TP]:
    """The subscribed partitions, or a :class:`KafkaSourceError` saying that the broker is
    unreachable or which topic or partition is missing."""
    return asyncio.run(_snapshot(opts, offsets=False)).partitions


def fetch(opts: KafkaSourceOptions, tp: TP, start: int, end: int) -> Iterator[list[ConsumerRecord]]:
    """Yield the records of ``tp`` with ``start <= offset < end``, in offset order, in chunks.

    Offsets of the range that hold no record (transaction markers, aborted
    records under ``read_committed``, compaction) are skipped: progress is the
    consumer's position, which moves past them, not the last record's offset,
    so a range that ends on a marker, or holds nothing else, ends too. If
    ``start`` is no longer in the log it raises, or with
    ``failOnDataLoss=false`` continues from the earliest offset. Raises
    :class:`KafkaSourceError` when no progress is made for ``timeout_ms``.
    A private event loop drives the async client; closing the iterator early
    stops the client.
    """
    loop = asyncio.new_event_loop()
    chunks = _fetch(opts, tp, start, end)
    try:
        while True:
            try:
                yield loop.run_until_complete(chunks.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(chunks.aclose())
        loop.close()


async def _fetch(
    opts: KafkaSourceOptions, tp: TP, start: int, end: int
) -> AsyncGenerator[list[ConsumerRecord], None]:
    tpo = TopicPartition(*tp)
    consumer = _consumer(
        opts, auto_offset_reset="none", max_partition_fetch_bytes=4 << 20, fetch_max_bytes=16 << 20
    )
    try:
        try:
            await asyncio.wait_for(consumer.start(), min(opts.timeout_ms / 1000, 15))
        except (TimeoutError, KafkaError, OSError) as exc:
            raise _unreachable(opts, exc) from exc
        consumer.assign([tpo])
        consumer.seek(tpo, start)
        position, last_progress = start, time.monotonic()
        while position < end:
            try:
                batch = await consumer.getmany(tpo, timeout_ms=POLL_MS, max_records=FETCH_RECORDS)
            except OffsetOutOfRangeError:
                if opts.fail_on_data_loss:
                    msg = (
                        f"offset {position} of {tp[0]}-{tp[1]} is no longer in the log (retention or a "
                        "recreated topic); records were lost. Set failOnDataLoss=false to skip them"
                    )
                    raise KafkaSourceError(msg) from None
                logger.warning("offsets of %s-%d from %d are gone; continuing at the earliest", *tp, position)
                await consumer.seek_to_beginning(tpo)
                continue
            records = [r for r in batch.get(tpo, ()) if r.offset < end]
            if records:
                yield records
            new_position = await consumer.position(tpo)
            if new_position > position:
                position, last_progress = new_position, time.monotonic()
            elif time.monotonic() - last_progress > opts.timeout_ms / 1000:
                msg = (
                    f"no progress reading {tp[0]}-{tp[1]} at offset {position} (want {end}) from "
                    f"{opts.bootstrap} within {opts.timeout_ms} ms"
                )
                raise KafkaSourceError(msg)
    finally:
        await consumer.stop()
