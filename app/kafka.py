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
    """Sum of the end offsets of each topic's partitions (records ever written).

    A topic that does not exist counts 0.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        await asyncio.wait_for(consumer.start(), timeout_s)
        existing = await asyncio.wait_for(consumer.topics(), timeout_s)
        out: dict[str, int] = {}
        for topic in topics:
            parts = consumer.partitions_for_topic(topic) if topic in existing else None
            if not parts:
                out[topic] = 0
                continue
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            ends = await asyncio.wait_for(consumer.end_offsets(tps), timeout_s)
            out[topic] = sum(ends.values())
        return out
    except (KafkaError, OSError, asyncio.TimeoutError) as exc:
        msg = f"cannot read end offsets from {bootstrap}: {exc!r}"
        raise BrokerError(msg) from exc
    finally:
        await consumer.stop()
