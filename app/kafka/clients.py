"""Kafka client factories with this project's defaults, and small admin helpers.

Producers default to ``acks=all`` and the idempotent producer
(:attr:`Settings.enable_idempotence`, on unless configured off) with a short linger
for batching: a retried send is written once, in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from app.errors import BrokerError
from app.kafka.auth import KafkaAuth
from app.kafka.errors import broker_errors
from app.placement import KeyHashes
from app.runtime.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoint:
    """A cluster and how to authenticate to it, without the rest of the settings."""

    bootstrap: str
    auth: KafkaAuth


#: Where a helper connects: a settings object (its cluster and its TLS/SASL settings), an
#: :class:`Endpoint`, or a bare ``host:port[,host:port]`` string (plaintext, no
#: authentication: tests and the embedded broker).
Target = Settings | Endpoint | str


def connection(target: Target) -> dict[str, Any]:
    """aiokafka's ``bootstrap_servers`` and security keyword arguments for ``target``."""
    if isinstance(target, Settings):
        return {"bootstrap_servers": target.bootstrap_servers, **target.kafka_auth.client_options()}
    if isinstance(target, Endpoint):
        return {"bootstrap_servers": target.bootstrap, **target.auth.client_options()}
    return {"bootstrap_servers": target, **KafkaAuth().client_options()}


def bootstrap_of(target: Target) -> str:
    if isinstance(target, Settings):
        return target.bootstrap_servers
    return target.bootstrap if isinstance(target, Endpoint) else target


class CachedPartitioner(DefaultPartitioner):
    """aiokafka's default partitioner with the key hashes remembered (:class:`KeyHashes`):
    the same partition for every key, as any Kafka client would pick."""

    def __init__(self, hashes: KeyHashes | None = None) -> None:
        self.hashes = hashes or KeyHashes()

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return DefaultPartitioner.__call__(key, all_partitions, available)
        return all_partitions[self.hashes(key) % len(all_partitions)]


class TrackingProducer(AIOKafkaProducer):
    """aiokafka's producer, with every topic it sends to kept in its client's metadata.

    aiokafka's client asks the cluster for the metadata of the topics it tracks, or of
    every topic while it tracks none. Its ``send`` starts tracking a topic only when the
    metadata it holds lacks the topic. So a topic first sent to while the client tracked
    none (its metadata then held them all) is never tracked. Once another topic is (one
    sent to before it existed), the next update holds that one alone: a batch of the
    first topic still in the accumulator then has no leader, the sender waits for one
    forever, and ``flush`` never returns (aiokafka 0.14). The rule worker met it at a
    first start, a changelog topic created a moment late: every commit flushes first, so
    its offsets were never committed again, and a SIGTERM waited on the commit until the
    supervisor killed it. ``tests/kafka/test_tracking_producer.py`` holds both.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tracked: set[str] = set()

    def _track(self, topic: str) -> None:
        if topic not in self._tracked:
            self._tracked.add(topic)
            self.client.add_topic(topic)  # a no-op when aiokafka tracks it already

    async def partitions_for(self, topic: str) -> Any:
        self._track(topic)
        return await super().partitions_for(topic)

    async def send(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        self._track(topic)
        return await super().send(topic, *args, **kwargs)

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Any:
        self._track(topic)
        return await super().send_batch(batch, topic, partition=partition)


def make_producer(settings: Settings, **overrides: Any) -> AIOKafkaProducer:
    """A producer with acks=all, 5 ms linger, bounded in-flight buffering and the
    :class:`CachedPartitioner`."""
    options: dict[str, Any] = {
        **connection(settings),
        "partitioner": CachedPartitioner(),
        "acks": "all",
        "linger_ms": 5,
        "max_batch_size": 256 * 1024,
        "enable_idempotence": settings.enable_idempotence,
        "request_timeout_ms": 30_000,
    }
    options.update(overrides)
    return TrackingProducer(**options)


def make_consumer(settings: Settings, *topics: str, **overrides: Any) -> AIOKafkaConsumer:
    """A consumer reading from the earliest offset unless told otherwise, committed records only.

    ``read_committed``: records of an aborted transaction (an exactly-once rule worker that
    crashed mid-commit, docs/exactly-once.md) are never returned, and those of an open one only
    once it commits. Without transactions it changes nothing. The position of such a consumer
    passes the transactions' commit markers, which are never returned: a partition is read to
    its end when ``position()`` reaches the end offset, not when a record's offset does.
    """
    options: dict[str, Any] = {
        **connection(settings),
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
    }
    options.update(overrides)
    return AIOKafkaConsumer(*topics, **options)


async def end_offsets(bootstrap: Target, topics: list[str], timeout_s: float = 10.0) -> dict[str, int]:
    """Records ever written to each topic: the sum of its partitions' high watermarks.

    A topic that does not exist counts 0.
    """
    marks = await high_watermarks(bootstrap, topics, timeout_s)
    out = {t: 0 for t in topics}
    for tp, mark in marks.items():
        out[tp.topic] += mark
    return out


async def topic_partitions(
    bootstrap: Target, topics: list[str], timeout_s: float = 10.0
) -> dict[str, list[int]]:
    """The partition numbers of each of ``topics`` that exists, from a metadata request for all
    topics. (A consumer's ``topics()`` asks the same but keeps the answer to itself: its own
    metadata knows only the topics it subscribed to or was assigned.)"""
    client = AIOKafkaClient(**connection(bootstrap), request_timeout_ms=int(timeout_s * 1000))
    try:
        with broker_errors(f"read topic metadata from {bootstrap_of(bootstrap)}"):
            await asyncio.wait_for(client.bootstrap(), timeout_s)
            cluster = await asyncio.wait_for(client.fetch_all_metadata(), timeout_s)
            found = cluster.topics()
            return {t: sorted(cluster.partitions_for_topic(t) or ()) for t in topics if t in found}
    finally:
        await client.close()


async def partition_counts(bootstrap: Target, topics: list[str], timeout_s: float = 10.0) -> dict[str, int]:
    """How many partitions each of ``topics`` has (topics that do not exist are left out)."""
    return {t: len(ps) for t, ps in (await topic_partitions(bootstrap, topics, timeout_s)).items()}


async def partitions_of(
    bootstrap: Target, topics: list[str], timeout_s: float = 10.0
) -> list[TopicPartition]:
    """Every partition of ``topics`` that exists, in topic order then partition order."""
    found = await topic_partitions(bootstrap, topics, timeout_s)
    return [TopicPartition(t, p) for t in topics for p in found.get(t, ())]


async def high_watermarks(
    bootstrap: Target, topics: list[str], timeout_s: float = 10.0
) -> dict[TopicPartition, int]:
    """The end offset (high watermark, from ListOffsets latest) of every partition of ``topics``.

    Topics that do not exist are left out. With transactional producers the end offset
    also counts the commit and abort markers, so it is an upper bound on data records.
    """
    tps = await partitions_of(bootstrap, topics, timeout_s)
    if not tps:
        return {}
    consumer = AIOKafkaConsumer(**connection(bootstrap), enable_auto_commit=False)
    try:
        with broker_errors(f"read end offsets from {bootstrap_of(bootstrap)}"):
            await asyncio.wait_for(consumer.start(), timeout_s)
            return dict(await asyncio.wait_for(consumer.end_offsets(tps), timeout_s))
    finally:
        await stop_consumer(consumer)


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """``consumer.stop()``, through a known fault of aiokafka's (aio-libs/aiokafka#647: its close
    awaits the tasks it has just cancelled): stopped while a fetch was backing off from a broker
    gone, ``stop()`` raised that task's CancelledError before closing the client, and the
    dispatcher and store-sync exited 1 with a traceback where they should stop cleanly. Swallowed
    unless this task itself is being cancelled; the client is closed then, as ``stop()`` would."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        logger.debug("the consumer's close met a task it cancelled; closing its client")
        await consumer._client.close()  # noqa: SLF001 - what stop() did not reach


#: how long a commit a role makes for monitoring only may take (the offsets that count are in
#: the role's own store): milliseconds on a broker that answers; a role's stop, which commits
#: last, has 6 s of grace under the supervisor for all it does
MONITOR_COMMIT_S = 1.0


async def commit_for_monitoring(
    consumer: AIOKafkaConsumer, offsets: Mapping[TopicPartition, int], timeout_s: float = MONITOR_COMMIT_S
) -> bool:
    """Commit ``offsets`` that a role keeps in its own store as well, for the consumer lag the
    console shows; whether it was done. At most ``timeout_s``, and never an error: aiokafka's
    commit waits for a group coordinator for as long as none answers, so a broker gone made the
    dispatcher's stop, which commits last, wait for ever."""
    if not offsets:  # aiokafka refuses an empty commit
        return False
    try:
        await asyncio.wait_for(consumer.commit(dict(offsets)), timeout_s)
    except (KafkaError, TimeoutError) as exc:
        logger.debug("commit for monitoring skipped: %r", exc)
        return False
    return True


async def assign_kept(
    consumer: AIOKafkaConsumer,
    bootstrap: Target,
    topics: list[str],
    kept: Mapping[tuple[str, int], int],
    timeout_s: float = 10.0,
) -> dict[TopicPartition, int]:
    """Assign ``consumer`` (started) every partition of ``topics`` that exists, each at its
    ``kept[(topic, partition)]`` offset, or at the beginning without one. A kept offset
    past the partition's end means the topic was recreated (an embedded broker restarted
    empty): that partition is read from the beginning, with a warning. Returns the
    partitions' end offsets (the consumer's own: the last stable offsets of a
    ``read_committed`` one).

    One metadata request, then the consumer's own end offsets, then one seek to the
    beginning for every partition that needs it: each seek waits for the fetch in flight
    (up to ``fetch_max_wait_ms``), so a seek per partition took 8 s over the store's 12."""
    tps = await partitions_of(bootstrap, topics, timeout_s)
    with broker_errors(f"read end offsets from {bootstrap_of(bootstrap)}"):
        marks = dict(await asyncio.wait_for(consumer.end_offsets(tps), timeout_s)) if tps else {}
    # no await from the assignment to the seeks: the fetcher's own reset of a new assignment
    # (to the group's committed offset, or auto_offset_reset) would land after them
    consumer.assign(tps)
    from_start: list[TopicPartition] = []
    for tp in tps:
        at = kept.get((tp.topic, tp.partition))
        end = marks.get(tp, 0)
        if at is not None and at > end:
            logger.warning("%s:%d ends at %d, before the kept offset %d: the topic was recreated; "
                           "reading it from the beginning", tp.topic, tp.partition, end, at)  # fmt: skip
            at = None
        if at is None:
            from_start.append(tp)
        else:
            consumer.seek(tp, at)
    if from_start:
        await consumer.seek_to_beginning(*from_start)
    return marks


#: how long :func:`read_to_end` waits for a partition to move before it gives up
STALL_S = 30.0


async def read_to_end(
    consumer: AIOKafkaConsumer,
    ends: Mapping[TopicPartition, int],
    *,
    stall_s: float = STALL_S,
    poll_ms: int = 1000,
    max_records: int | None = None,
) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
    """The records of ``consumer`` (assigned and positioned) before ``ends``, in offset order
    per partition, until every partition's position reached its end (a ``read_committed``
    position passes the commit markers no record carries: take the ends from that consumer's
    own ``end_offsets``, its last stable offsets, so an open transaction cannot hold the end
    out of reach).

    A poll that brings nothing is not the end: a starved host or a busy broker answers late.
    Raises :class:`~app.errors.BrokerError`, naming each partition left and where it stands,
    when no partition moved for ``stall_s``: a reader that stopped there would pass a part of
    the topic off as the whole (a backtest with fewer alerts, a rebuilt log with gaps)."""
    left = {tp: end for tp, end in ends.items() if end > 0}
    loop = asyncio.get_running_loop()
    seen: dict[TopicPartition, int] = {}
    moved = loop.time()
    while left:
        batch = await consumer.getmany(timeout_ms=poll_ms, max_records=max_records)
        for tp, records in batch.items():
            end = left.get(tp)
            for rec in records:
                if end is not None and rec.offset < end:
                    yield rec
        for tp in list(left):
            at = await consumer.position(tp)
            if at != seen.get(tp):
                seen[tp], moved = at, loop.time()
            if at >= left[tp]:
                del left[tp]
        if left and loop.time() - moved > stall_s:
            where = ", ".join(f"{tp.topic}:{tp.partition} at {seen[tp]} of {end}" for tp, end in left.items())
            msg = f"no record came for {stall_s:g} s before the end of {where}"
            raise BrokerError(msg)


async def topic_records(
    bootstrap: Target, topics: list[str], *, isolation_level: str = "read_committed", stall_s: float = STALL_S
) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topics`` from its start to its end as of now, per partition in offset
    order (:func:`read_to_end`, through a consumer of its own that no group knows). Read
    committed by default: an aborted transaction's records reach no reader, and the end is
    the last stable offset; ``read_uncommitted`` reads to the high watermark, aborted records
    too."""
    consumer = AIOKafkaConsumer(
        **connection(bootstrap), enable_auto_commit=False, isolation_level=isolation_level,
        auto_offset_reset="earliest",
    )  # fmt: skip
    await consumer.start()
    try:
        ends = await assign_kept(consumer, bootstrap, topics, {})  # every partition from its start
        async for r in read_to_end(consumer, ends, stall_s=stall_s):
            yield r
    finally:
        await stop_consumer(consumer)
