"""A topic created after the producer started must not strand another topic's batches.

aiokafka's producer tracks a topic in its metadata only when it sends to a topic its
metadata lacks; a topic sent to while it tracked none is never tracked, and the next
metadata update after some other topic is tracked drops it (see
:class:`app.kafka.clients.TrackingProducer`). The rule worker met this at a first start,
with a changelog topic created a moment late: its flush, and so every commit after it,
never returned. Both producers run the same steps on the real broker: aiokafka's own must
show the stranded batch (if a new aiokafka fixes it, this test says the workaround can
go), ours must deliver everything.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from app.kafka.broker import KafkaBroker
from app.kafka.clients import TrackingProducer

pytestmark = [pytest.mark.integration]

#: long enough that the first topic's batch is still queued when the narrowed metadata lands
LINGER_MS = 1500
#: how long the producers get to deliver both records after the linger
FLUSH_S = 2.5
#: past the flush window: the stranded batch then fails, and the producer can stop
REQUEST_TIMEOUT_MS = 5_000


async def _steps(kind: Any, bootstrap: str, late_topic: str) -> bool:
    """Send to a topic of the metadata held, then to one created after: whether the producer
    then delivers both within the linger and :data:`FLUSH_S` (the stranded batch would wait for
    its leader until the request timeout, 5 s here, 20 minutes in Faust's producer)."""
    options = {"linger_ms": LINGER_MS, "request_timeout_ms": REQUEST_TIMEOUT_MS}
    producer: AIOKafkaProducer = kind(bootstrap_servers=bootstrap, **options)
    await producer.start()
    try:
        # the metadata of every topic, tracking none: what the client's periodic refresh (or a
        # refresh after a lost connection) holds until a topic is tracked
        await producer.client.force_metadata_update()
        assert "events.logs" in producer.client.cluster.topics()
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(late_topic, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()
        first = await producer.send("events.logs", b"first", partition=0)  # lingers in the queue
        late = await producer.send(late_topic, b"late", partition=0)  # tracked: the metadata narrows
        try:
            await asyncio.wait_for(producer.flush(), timeout=LINGER_MS / 1000 + FLUSH_S)
        except TimeoutError:
            return False
        await asyncio.gather(first, late)
        return True
    finally:
        await asyncio.wait_for(producer.stop(), timeout=15)


def _run(kind: Any, broker: KafkaBroker, late_topic: str) -> bool:
    return asyncio.run(_steps(kind, broker.bootstrap, late_topic))


def test_aiokafkas_producer_strands_a_batch_when_a_later_topic_narrows_its_metadata(
    broker: KafkaBroker,
) -> None:
    assert _run(AIOKafkaProducer, broker, "late.plain") is False


def test_the_tracking_producer_delivers_both(broker: KafkaBroker) -> None:
    assert _run(TrackingProducer, broker, "late.tracking") is True
