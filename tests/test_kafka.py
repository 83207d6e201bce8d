"""Kafka helpers against the real embedded broker."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from app.broker import EmbeddedBroker
from app.kafka import end_offsets

pytestmark = [pytest.mark.integration]


def test_end_offsets_count_every_record_even_in_multi_record_batches(broker: EmbeddedBroker) -> None:
    async def produce() -> None:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=50)
        await p.start()
        try:
            for n in (300, 50):  # two batches; Tansu's ListOffsets alone would say 301
                futs = [await p.send("events.logs", value=b"x", partition=0) for _ in range(n)]
                await asyncio.gather(*futs)
            await (await p.send("events.logs", value=b"y", partition=1))
        finally:
            await p.stop()

    asyncio.run(produce())
    counts = asyncio.run(end_offsets(broker.bootstrap, ["events.logs", "events.finance", "no.such.topic"]))
    assert counts == {"events.logs": 351, "events.finance": 0, "no.such.topic": 0}
