"""Bounded reads from (and writes to) a real broker for tests."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from app.kafka.clients import Target, connection, partitions_of
from app.topics import ALERTS


async def _consume(bootstrap: Target, topic: str, min_count: int, timeout_s: float) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic,
        **connection(bootstrap),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",  # as the system's readers: an aborted transaction's records never
    )
    await consumer.start()
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                out.extend(records)
            if min_count and len(out) >= min_count:
                # drain what is already there, then stop
                more = await consumer.getmany(timeout_ms=300)
                for records in more.values():
                    out.extend(records)
                break
    finally:
        await consumer.stop()
    return out


def consume(bootstrap: Target, topic: str, *, min_count: int = 0, timeout_s: float = 10.0) -> list[Any]:
    """Committed records of ``topic`` from the earliest offset: stop once ``min_count`` are
    read (0: read until ``timeout_s``). Never blocks longer than ``timeout_s`` + 1 s."""
    return asyncio.run(_consume(bootstrap, topic, min_count, timeout_s))


def consume_json(bootstrap: str, topic: str, **kw: Any) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in consume(bootstrap, topic, **kw)]


def produce(
    bootstrap: str,
    topic: str,
    items: list[tuple[bytes | None, bytes]],
    headers: list[list[tuple[str, bytes]] | None] | None = None,
) -> None:
    """Produce (key, value) pairs, each with its ``headers`` when given, and wait for every ack."""
    from aiokafka import AIOKafkaProducer

    each = headers if headers is not None else [None] * len(items)

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        await p.start()
        try:
            futs = [
                await p.send(topic, value=v, key=k, headers=h) for (k, v), h in zip(items, each, strict=True)
            ]
            await asyncio.gather(*futs)
        finally:
            await p.stop()

    asyncio.run(run())


def wait_for_json(
    bootstrap: str, topic: str, count: int, *, timeout_s: float, what: str
) -> list[dict[str, Any]]:
    """Poll ``topic`` until it holds at least ``count`` JSON records; all of them."""
    from tests.procs import wait_for

    return wait_for(
        lambda: (a := consume_json(bootstrap, topic, min_count=count, timeout_s=3)) and len(a) >= count and a,
        timeout_s=timeout_s,
        what=what,
    )


async def _write(target: Target, topic: str, value: bytes) -> bool:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**connection(target), request_timeout_ms=5000, acks="all")
    try:
        await asyncio.wait_for(producer.start(), 10)
        await asyncio.wait_for(producer.send_and_wait(topic, value, key=b"k"), 10)
    except (KafkaError, TimeoutError):
        return False
    finally:
        await producer.stop()
    return True


def can_write(target: Target, topic: str, value: bytes = b"{}") -> bool:
    """True when ``target``'s principal (plaintext for a bare address) could write ``value`` to
    ``topic``; False when the broker refused the connection, the login or the write."""
    return asyncio.run(_write(target, topic, value))


def committed(bootstrap: str, group: str, topic: str = ALERTS) -> int:
    """Sum of ``group``'s committed offsets over ``topic`` (0 where none).

    Compared with the number of records produced (end offsets would also count the
    markers of transactional producers).
    """

    async def main() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = await partitions_of(bootstrap, [topic])
            return sum([(await consumer.committed(tp)) or 0 for tp in tps])
        finally:
            await consumer.stop()

    return asyncio.run(asyncio.wait_for(main(), 20))


def rewind(bootstrap: str, group: str, topic: str, offset: int = 0) -> None:
    """Commit ``offset`` for every partition of ``topic`` in ``group`` (which must have no
    member): the offsets a crash between a commit's states and its offsets leaves behind."""

    async def main() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = await partitions_of(bootstrap, [topic])
            consumer.assign(tps)
            await consumer.commit({tp: offset for tp in tps})
        finally:
            await consumer.stop()

    asyncio.run(asyncio.wait_for(main(), 20))
