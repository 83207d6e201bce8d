"""The worker's Outbox: a handler's records go out as one record batch per topic partition,
on the partition any Kafka client picks for the key and in order; a record the producer
could not deliver stops the worker and fails the commit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import TopicPartition

from agents.outbox import (
    MAX_QUEUED_BATCHES,
    STATE_BATCH_BYTES,
    STATE_TOPIC_MAX_MESSAGE_BYTES,
    Outbox,
    commit_hooks,
    state_batch_bytes,
)
from agents.state_store import TableStore
from app.kafka.admin import ensure_topics, max_message_bytes
from app.kafka.broker import KafkaBroker
from app.kafka.clients import CachedPartitioner
from app.rules.evaluator import LATE_TOPIC, Output
from app.topics import TopicSpec
from tests.agents.worker_helpers import TOPIC, fake_table


class _App:
    """What the Outbox uses of a Faust app: its producer (``_ensure_producer``) and ``crash``."""

    def __init__(self, producer: Any) -> None:
        self.producer = self
        self._producer = producer
        self.crashed: list[BaseException] = []

    def _ensure_producer(self) -> Any:
        return self._producer

    async def crash(self, reason: BaseException) -> None:
        self.crashed.append(reason)


async def _through_broker(
    bootstrap: str, topics: dict[str, int], max_batch_size: int, send: Callable[[Outbox], Awaitable[None]],
    expect: int,
) -> dict[tuple[str, int], list[tuple[bytes, bytes | None]]]:  # fmt: skip
    """Create ``topics`` (name: partitions), have ``send`` queue records on an Outbox over a
    real producer, flush, then read every topic back: per topic partition, (key, value) in order."""
    await ensure_topics(
        bootstrap, 1, specs=tuple(TopicSpec(t, "key", partitions=n) for t, n in topics.items())
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=max_batch_size)
    await producer.start()
    try:
        box = Outbox(_App(producer), CachedPartitioner())  # type: ignore[arg-type]
        await send(box)
        await asyncio.wait_for(producer.flush(), 30)
        box.check()
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    got: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
    try:
        async with asyncio.timeout(60):
            while sum(map(len, got.values())) < expect:
                for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                    got.setdefault((tp.topic, tp.partition), []).extend((m.key, m.value) for m in msgs)
    finally:
        await consumer.stop()
    return got


@pytest.mark.slow
def test_records_land_on_the_default_partition_in_order(broker: KafkaBroker) -> None:
    """Real broker: 3,000 records over 4 partitions and two topics, in batches small
    enough that each partition's records fill several."""
    topics = {"out.a": 4, "out.b": 1}
    records = [
        (topic, f"key-{i % 37}".encode(), f"{topic}:{i:05d}:{'x' * 80}".encode())
        for i in range(3000)
        for topic in topics
    ]

    async def send(box: Outbox) -> None:  # chunks in quick succession: batches queue behind waiting ones
        for start, end in ((0, 10), (10, 400), (400, 410), (410, 2500), (2500, len(records))):
            await box.send_all(records[start:end])

    got = asyncio.run(_through_broker(broker.bootstrap, topics, 16 * 1024, send, len(records)))
    expected: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
    for topic, key, value in records:
        parts = list(range(topics[topic]))
        expected.setdefault((topic, DefaultPartitioner()(key, parts, parts)), []).append((key, value))
    assert len(expected) == 5  # every partition of both topics took records
    assert got == expected


class _Producer:
    """Stands in for aiokafka's producer where a test must settle deliveries itself:
    ``send_batch`` returns the delivery future, left to the test."""

    def __init__(
        self, waiting: tuple[str, int] | None = None, batch_capacity: int | None = None, queued: int = 1
    ) -> None:
        self.batch_capacity = batch_capacity
        self.futures: list[asyncio.Future[Any]] = []
        self.batches: list[tuple[str, int, list[bytes]]] = []  # handed to send_batch
        self.queued: list[tuple[str, int, list[bytes]]] = []  # queued behind a waiting batch
        self.sent: list[tuple[str, int, bytes]] = []
        #: aiokafka's accumulator: per partition, the batches still waiting for the sender
        self._message_accumulator = SimpleNamespace(
            _batches={} if waiting is None else {TopicPartition(*waiting): ["a batch"] * queued},
            _closed=False,
            _exception=None,
            _append_batch=self._append_batch,
        )

    def _append_batch(self, batch: _Batch, tp: TopicPartition) -> SimpleNamespace:
        self.queued.append((tp.topic, tp.partition, batch.keys))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return SimpleNamespace(future=fut)

    async def send(self, topic: str, value: bytes, *, key: bytes, partition: int) -> asyncio.Future[Any]:
        self.sent.append((topic, partition, key))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut

    async def partitions_for(self, _topic: str) -> set[int]:
        return {0, 1}

    def create_batch(self) -> _Batch:
        return _Batch(self.batch_capacity)

    async def send_batch(self, batch: _Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        self.batches.append((topic, partition, batch.keys))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(fut)
        return fut


class _Batch:
    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.keys: list[bytes] = []

    def append(self, *, timestamp: None, key: bytes, value: bytes | None) -> object | None:
        if self.capacity is not None and len(self.keys) >= self.capacity:
            return None  # full, as aiokafka's builder says
        self.keys.append(key)
        return object()


def test_delivered_records_leave_the_commit_alone() -> None:
    async def run() -> Outbox:
        producer = _Producer()
        box = Outbox(_App(producer), CachedPartitioner())  # type: ignore[arg-type]
        await box.send_all([("alerts", b"k", b"v")])
        producer.futures[0].set_result(None)
        await asyncio.sleep(0)
        return box

    box = asyncio.run(run())
    box.check()  # no exception: the commit may go ahead
    assert box.failed is None


def test_late_events_are_counted_whatever_their_rules_late_policy() -> None:
    """``worker_late_events_total`` counts every rule an event came too late for: two here,
    of which one copies it aside (the one record) and one drops it. It counted the copies
    alone, so under the default policy (drop) it stayed at 0 whatever came late."""
    from prometheus_client import REGISTRY

    def late() -> float:
        return REGISTRY.get_sample_value("worker_late_events_total", {"source": "late-test"}) or 0.0

    box = Outbox(_App(_Producer()), CachedPartitioner())  # type: ignore[arg-type]
    before = late()
    records = box.records(Output(late=[("hourly-side", b"{}")], late_count=2), "late-test")
    assert records == [(LATE_TOPIC, b"hourly-side", b"{}")]
    assert late() - before == 2


def test_an_undelivered_record_crashes_the_worker_and_fails_the_commit() -> None:
    async def run() -> tuple[_App, Outbox, _Producer]:
        producer = _Producer()
        app = _App(producer)
        box = Outbox(app, CachedPartitioner())  # type: ignore[arg-type]
        await box.send_all([("alerts", b"k1", b"v1"), ("alerts", b"k2", b"v2"), ("alerts", b"k3", b"v3")])
        for fut, error in zip(producer.futures, ("broker gone", "again"), strict=True):
            fut.set_exception(ConnectionError(error))
        for _ in range(3):
            await asyncio.sleep(0)
        return app, box, producer

    app, box, producer = asyncio.run(run())
    assert len(producer.batches) == 2  # one batch per partition the three keys hash to
    assert [str(e) for e in app.crashed] == ["broker gone"]  # once, for the first failure
    with pytest.raises(RuntimeError, match="not delivered") as info:
        box.check()
    assert isinstance(info.value.__cause__, ConnectionError)


def _three_alerts(producer: _Producer, fail: bool = False) -> tuple[_App, Outbox]:
    async def run() -> tuple[_App, Outbox]:
        app = _App(producer)
        box = Outbox(app, CachedPartitioner())  # type: ignore[arg-type]
        await box.send_all([("alerts", b"k1", b"v1"), ("alerts", b"k2", b"v2"), ("alerts", b"k3", b"v3")])
        for fut in producer.futures:
            if fail:
                fut.set_exception(ConnectionError("broker gone"))
            else:
                fut.set_result(None)
        for _ in range(3):
            await asyncio.sleep(0)
        return app, box

    return asyncio.run(run())


def test_a_batch_for_a_partition_with_a_batch_waiting_is_queued_behind_it_at_once() -> None:
    """send_batch would wait for the waiting batch to be sent (a broker round trip): the
    batch of that partition is queued behind it instead, in order, and its delivery is
    watched; the other partition's goes through send_batch."""
    producer = _Producer(waiting=("alerts", 1))
    _app, box = _three_alerts(producer)
    box.check()
    assert producer.queued == [("alerts", 1, [b"k1", b"k2"])]  # k1 and k2 hash to 1
    assert producer.batches == [("alerts", 0, [b"k3"])]
    assert producer.sent == []  # no record goes through send one by one

    producer = _Producer(waiting=("alerts", 1))
    app, box = _three_alerts(producer, fail=True)
    assert len(app.crashed) == 1  # a queued batch that fails stops the worker too
    with pytest.raises(RuntimeError, match="not delivered"):
        box.check()


def test_past_the_queue_bound_a_batch_waits_for_the_queue_to_drain() -> None:
    """With MAX_QUEUED_BATCHES already queued for a partition, its next batch goes through
    send_batch, which waits for them to be sent: a stalled broker does not fill the memory."""
    producer = _Producer(waiting=("alerts", 1), queued=MAX_QUEUED_BATCHES)
    _app, box = _three_alerts(producer)
    box.check()
    assert producer.queued == []
    assert producer.batches == [("alerts", 1, [b"k1", b"k2"]), ("alerts", 0, [b"k3"])]

    producer = _Producer(waiting=("alerts", 1), queued=MAX_QUEUED_BATCHES - 1)
    _three_alerts(producer)
    assert producer.queued == [("alerts", 1, [b"k1", b"k2"])]


@pytest.mark.slow
def test_placed_records_and_tombstones_land_on_their_given_partitions_in_order(
    broker: KafkaBroker,
) -> None:
    """Real broker: the state changelog goes out on the partition each record names (the
    partition of the events that own the state), not where the key would hash, with its
    tombstones (a None value) kept as such and in order."""
    topic = "out.changelog"
    records = [(topic, i % 3, f"rule\x1fkey-{i % 11}".encode(), None if i % 7 == 0 else f"{i}".encode())
               for i in range(600)]  # fmt: skip

    async def send(box: Outbox) -> None:
        await box.send_placed(records[:5])
        await box.send_placed(records[5:])
        await box.send_placed([])

    got = asyncio.run(_through_broker(broker.bootstrap, {topic: 3}, 4 * 1024, send, len(records)))
    expected: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
    for _topic, partition, key, value in records:
        expected.setdefault((topic, partition), []).append((key, value))
    assert got == expected
    assert sum(value is None for pairs in got.values() for _key, value in pairs) == 86


def test_placed_records_are_batched_per_partition_before_any_is_sent() -> None:
    """The changelog's records go into one record batch per partition as they come (a full
    one first, in order), and nothing is sent before the last record is in a batch."""
    sent_when: list[int] = []

    def records() -> Any:
        for i, (partition, key) in enumerate(
            [(0, b"a"), (1, b"b"), (0, b"c"), (0, b"d"), (1, b"e"), (0, b"f")]
        ):
            sent_when.append(len(producer.batches))  # batches handed to send_batch so far
            yield "changelog", partition, key, None if i == 4 else key

    async def run() -> None:
        box = Outbox(_App(producer), CachedPartitioner())  # type: ignore[arg-type]
        await box.send_placed(records())
        await box.send_placed([])  # nothing: no producer call
        for fut in producer.futures:
            fut.set_result(None)
        await asyncio.sleep(0)
        box.check()

    producer = _Producer(batch_capacity=2)
    asyncio.run(run())
    assert sent_when == [0] * 6
    assert producer.batches == [
        ("changelog", 0, [b"a", b"c"]),  # full at "d": sent first
        ("changelog", 0, [b"d", b"f"]),
        ("changelog", 1, [b"b", b"e"]),
    ]
    assert producer.sent == []


def test_the_commit_waits_for_the_states_and_fails_on_a_record_lost_in_the_flush() -> None:
    """Before each commit: the changed states go to the producer, the producer is flushed,
    and a record that failed meanwhile fails the commit (no offset past a lost record)."""

    async def run() -> tuple[_Producer, list[str]]:
        producer = _Producer()
        box = Outbox(_App(producer), CachedPartitioner())  # type: ignore[arg-type]
        store = TableStore(fake_table(), 10_000)
        outcome = "ok"

        async def flush() -> None:  # the producer's flush: each batch is delivered, or fails
            for fut in producer.futures:
                if fut.done():
                    continue
                if outcome == "ok":
                    fut.set_result(None)
                else:
                    fut.set_exception(ConnectionError(outcome))
            await asyncio.sleep(0)

        (check, take_states), (delivered,) = commit_hooks(box, [store], flush)
        results = []
        for outcome in ("ok", "broker gone"):
            store.store.put(f"r\x1f{outcome}", {"partition": 1, "n": 1})
            check()
            take_states()
            try:
                await delivered()
                results.append("committed")
            except RuntimeError as exc:
                results.append(f"failed: {exc.__cause__}")
        return producer, results

    producer, results = asyncio.run(run())
    assert [(t, p, len(keys)) for t, p, keys in producer.batches] == [(TOPIC, 1, 1), (TOPIC, 1, 1)]
    assert results == ["committed", "failed: broker gone"]


def test_the_states_go_out_after_the_outputs_of_the_batches_they_count_are_delivered() -> None:
    """A state record must never land without the outputs of the events it counts: after a
    crash between the states and the offsets, the restart drops those events as evaluated,
    and an alert still in the producer at the crash would be lost. So the commit flushes the
    outputs, then sends the states taken under the gate, then flushes again."""
    steps: list[str] = []

    async def run() -> _Producer:
        producer = _Producer()
        box = Outbox(_App(producer), CachedPartitioner())  # type: ignore[arg-type]
        store = TableStore(fake_table(), 10_000)

        async def flush() -> None:
            steps.append(f"flush ({len(producer.batches)} batches sent)")
            for fut in producer.futures:
                if not fut.done():
                    fut.set_result(None)

        (check, take_states), (delivered,) = commit_hooks(box, [store], flush)
        await box.send_all([("alerts", b"k", b"an alert")])  # an output of a handled batch
        store.store.put("r\x1fd1", {"partition": 0, "n": 1})
        check()
        take_states()  # under the gate
        steps.append(f"taken ({len(producer.batches)} batches sent)")
        store.store.put("r\x1fd2", {"partition": 0, "n": 1})  # a later batch: the next commit's
        await delivered()
        return producer

    producer = asyncio.run(run())
    assert steps == ["taken (1 batches sent)", "flush (1 batches sent)", "flush (2 batches sent)"]
    assert [(t, keys) for t, _, keys in producer.batches] == [("alerts", [b"k"]), (TOPIC, [b'"r\\u001fd1"'])]


@pytest.mark.slow
def test_a_commits_states_of_one_partition_go_in_one_record_batch_beyond_the_producers(
    broker: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """Real broker: 3 MiB of states of one changelog partition, three times the producer's
    largest batch, go out as one record batch, which Kafka appends whole or not at all, and
    come back in order. On a changelog created before (the cluster's 1 MiB), they take several
    batches, and the worker says how to raise it: a crash between two batches left some states
    written beside the old offsets, and the restart counted their events again."""
    made, old = "out.changelog-big", "out.changelog-old"
    value = b"s" * 3000
    records = [(topic, 1, f"rule\x1fkey-{i}".encode(), value) for topic in (made, old) for i in range(1000)]

    async def run() -> tuple[dict[str, int], dict[str, list[int]], dict[tuple[str, int], list[bytes]]]:
        specs = (TopicSpec(made, "key", compacted=True, partitions=2,
                           max_message_bytes=STATE_TOPIC_MAX_MESSAGE_BYTES),
                 TopicSpec(old, "key", compacted=True, partitions=2))  # fmt: skip
        await ensure_topics(broker.bootstrap, 1, specs=specs)
        limits = state_batch_bytes(await max_message_bytes(broker.bootstrap, [made, old]))
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, max_batch_size=1024 * 1024)
        await producer.start()
        try:
            box = Outbox(_App(producer), CachedPartitioner())  # type: ignore[arg-type]
            box.batch_bytes = limits
            placement = box.place(records)
            batches = {
                topic: [len(b) for (t, _), b in placement.batches.items() if t == topic]
                for topic in (made, old)
            }
            await box.send_placement(placement)
            await asyncio.wait_for(producer.flush(), 30)
            box.check()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            made, old, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        got: dict[tuple[str, int], list[bytes]] = {}
        try:
            async with asyncio.timeout(60):
                while sum(map(len, got.values())) < len(records):
                    for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                        got.setdefault((tp.topic, tp.partition), []).extend(m.key for m in msgs)
        finally:
            await consumer.stop()
        return limits, batches, got

    limits, batches, got = asyncio.run(run())
    assert limits[made] == STATE_BATCH_BYTES
    assert batches == {made: [1], old: [3]}
    keys = [f"rule\x1fkey-{i}".encode() for i in range(1000)]
    assert got == {(made, 1): keys, (old, 1): keys}
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith(f"state changelog {old} takes record batches of 1048588 bytes") for m in said), (
        said
    )
    assert any(m.startswith(f"the states of {old} partition 1 took 3 record batches") for m in said), said
