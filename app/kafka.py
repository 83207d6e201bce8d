"""Kafka client factories with this project's defaults, and small admin helpers.

Producers default to ``acks=all`` with a short linger for batching; the
idempotent producer follows :attr:`Settings.enable_idempotence` (the embedded
Tansu broker rejects ``InitProducerId``, so it is off there and deterministic
alert ids carry the dedup instead).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from app.config import Settings
from app.errors import BrokerError

logger = logging.getLogger(__name__)


def make_producer(settings: Settings, **overrides: Any) -> AIOKafkaProducer:
    """A producer with acks=all, 5 ms linger and bounded in-flight buffering."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "acks": "all",
        "linger_ms": 5,
        "max_batch_size": 256 * 1024,
        "enable_idempotence": settings.enable_idempotence,
        "request_timeout_ms": 30_000,
    }
    options.update(overrides)
    return AIOKafkaProducer(**options)


def make_consumer(settings: Settings, *topics: str, **overrides: Any) -> AIOKafkaConsumer:
    """A consumer reading from the earliest offset unless told otherwise."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
    }
    options.update(overrides)
    return AIOKafkaConsumer(*topics, **options)


async def end_offsets(bootstrap: str, topics: list[str], timeout_s: float = 10.0) -> dict[str, int]:
    """Records ever written to each topic: the sum of its partitions' high watermarks.

    A topic that does not exist counts 0. See :func:`high_watermarks` for why
    this does not trust ListOffsets alone.
    """
    marks = await high_watermarks(bootstrap, topics, timeout_s)
    out = {t: 0 for t in topics}
    for tp, mark in marks.items():
        out[tp.topic] += mark
    return out


async def partition_counts(bootstrap: str, topics: list[str], timeout_s: float = 10.0) -> dict[str, int]:
    """How many partitions each of ``topics`` has (topics that do not exist are left out)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        await asyncio.wait_for(consumer.start(), timeout_s)
        existing = await asyncio.wait_for(consumer.topics(), timeout_s)
        return {t: len(consumer.partitions_for_topic(t) or ()) for t in topics if t in existing}
    finally:
        await consumer.stop()


async def high_watermarks(
    bootstrap: str, topics: list[str], timeout_s: float = 10.0
) -> dict[TopicPartition, int]:
    """The true end offset (high watermark) of every partition of ``topics``.

    The embedded Tansu broker answers ListOffsets(latest) with the base offset
    of the last record batch plus one, which undercounts when that batch holds
    several records. A Fetch response carries the correct high watermark, so
    this reads one fetch from just below the ListOffsets answer (at most the
    last batch) and takes the larger value. On Apache Kafka both agree.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        await asyncio.wait_for(consumer.start(), timeout_s)
        existing = await asyncio.wait_for(consumer.topics(), timeout_s)
        tps = [
            TopicPartition(t, p)
            for t in topics
            if t in existing
            for p in sorted(consumer.partitions_for_topic(t) or ())
        ]
        if not tps:
            return {}
        listed = await asyncio.wait_for(consumer.end_offsets(tps), timeout_s)
        marks = dict(listed)
        pending = [tp for tp in tps if listed[tp] > 0]
        if pending:
            consumer.assign(pending)
            for tp in pending:
                consumer.seek(tp, listed[tp] - 1)
            deadline = asyncio.get_running_loop().time() + timeout_s
            while pending and asyncio.get_running_loop().time() < deadline:
                await consumer.getmany(*pending, timeout_ms=200, max_records=1)
                for tp in list(pending):
                    hw = consumer.highwater(tp)
                    if hw is not None:
                        marks[tp] = max(marks[tp], hw)
                        pending.remove(tp)
        return marks
    except (TimeoutError, KafkaError, OSError) as exc:
        msg = f"cannot read end offsets from {bootstrap}: {exc!r}"
        raise BrokerError(msg) from exc
    finally:
        await consumer.stop()
