"""How the rule worker's outputs reach Kafka: a handler's batch at a time, as record batches
(:class:`Outbox`), and what runs before each offset commit (:func:`commit_hooks`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, cast

import faust
import orjson
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.structs import TopicPartition

from agents.metrics import ALERTS_OUT, LATE, ROUTED
from agents.state_store import RECORD_OVERHEAD_BYTES, TableStore
from app.events import dlq_record
from app.eventtime import REFUSED
from app.kafka.clients import CachedPartitioner
from app.rules.evaluator import LATE_TOPIC, Output
from app.topics import ALERTS, DLQ

logger = logging.getLogger(__name__)

#: Most record batches of one partition the :class:`Outbox` queues in the producer before
#: it waits for them to be sent (up to 1 MiB each: ``producer_max_batch_size``).
MAX_QUEUED_BATCHES = 8
#: the most bytes of one record batch of a state changelog (:attr:`Outbox.batch_bytes`): a
#: commit's changed states of one partition, with the record of the last offsets they count,
#: go out as one batch up to this size, which Kafka appends whole or not at all. The worker
#: creates its changelog topics with a ``max.message.bytes`` this large (``agents.wiring``)
STATE_BATCH_BYTES = 16 * 1024 * 1024
#: the ``max.message.bytes`` a state changelog needs for such a batch (with Kafka's own fields)
STATE_TOPIC_MAX_MESSAGE_BYTES = STATE_BATCH_BYTES + RECORD_OVERHEAD_BYTES


class Outbox:
    """Hands a worker's outputs to Faust's producer, a handler's batch at a time.

    ``send_all`` returns once every record is queued: one record batch per topic
    partition (more when one fills up), in the order given, on the partition the
    producer's partitioner picks for the key. Per record, aiokafka's ``send`` costs
    tens of microseconds of Python (partition lookup, a future, the accumulator); a
    worker emits about one record per event. A record the producer could not
    deliver crashes the worker and fails the next commit (:meth:`check` runs
    before it), so no offset is committed past a lost alert; the restarted worker
    replays from the last commit.

    aiokafka's ``send_batch`` waits until the partition's queue is empty, which under
    load is a broker round trip: a batch is usually still waiting while the one
    before it is in flight. So a batch for a partition with batches queued goes in
    behind them at once, as aiokafka's accumulator would queue it after the wait,
    up to :data:`MAX_QUEUED_BATCHES`; past that, ``send_batch`` waits, which bounds
    what a stalled broker leaves in memory. The sender takes a partition's batches
    in queue order, so the records keep theirs.
    """

    def __init__(self, app: faust.App, partitioner: CachedPartitioner) -> None:
        self.app = app
        #: the producer's own partitioner: a key goes where Faust's producer would send it
        self.partitioner = partitioner
        self.failed: BaseException | None = None
        self._crashing: asyncio.Future[Any] | None = None
        #: per topic (the state changelogs), the most bytes of one of :meth:`place`'s record
        #: batches; other topics' batches are the producer's (``producer_max_batch_size``)
        self.batch_bytes: dict[str, int] = {}
        #: the (topic, partition) whose commit took several batches, warned of once each
        self._split: set[tuple[str, int]] = set()

    async def send_all(
        self,
        records: Sequence[tuple[str, bytes, bytes]],
        source_partition: int = 0,
        placed: Sequence[tuple[str, int, bytes, bytes]] = (),
    ) -> None:
        """Queue ``(topic, key, value)`` records on the partitions the partitioner picks, then
        ``placed`` ones, ``(topic, partition, key, value)``, on their given partitions.

        ``source_partition``: the input partition whose batch produced them; under exactly-once
        they go into that partition's transaction."""
        if not records and not placed:
            return
        producer = self.producer_for(source_partition)
        partitioner = self.partitioner
        partitions: dict[str, list[int]] = {}
        building: dict[tuple[str, int], list[Any]] = {}  # per partition, its record batches in order
        for topic, key, value in records:
            found = partitions.get(topic)
            if found is None:
                found = partitions[topic] = sorted(await producer.partitions_for(topic))
            self._append(
                producer, building.setdefault((topic, partitioner(key, found, found)), []), key, value
            )
        for topic, partition, key, value in placed:
            self._append(producer, building.setdefault((topic, partition), []), key, value)
        await self._send_built(producer, building)

    async def send_placed(self, records: Iterable[tuple[str, int, bytes, bytes | None]]) -> None:
        """Queue ``(topic, partition, key, value)`` records (the state changelog) on their
        given partitions, in order; a None value is a tombstone (:meth:`place`, then
        :meth:`send_placement`)."""
        await self.send_placement(self.place(records))

    def place(self, records: Iterable[tuple[str, int, bytes, bytes | None]]) -> Placement:
        """Copy ``(topic, partition, key, value)`` records into record batches, per partition
        and in order, to send later (:meth:`send_placement`).

        Each record is copied into its partition's record batch as it comes, and every one is
        in a batch before any is sent: ``records`` is read in one go, with no other task
        running in between (a generator of states sees none change). Under exactly-once each
        record goes into the transaction of its own partition number: a state's changelog
        partition is that of the input partition whose events own it.

        A topic in :attr:`batch_bytes` (a state changelog) gets one batch per partition up to
        that size, so a commit's states of one partition and the record of the offsets they
        count land together or not at all (``agents.state_store.ordered``): a crash between two
        batches left some states written beside the old offsets, and the restart counted their
        events again. A partition whose states exceed it takes several, with a warning."""
        building: dict[tuple[str, int], list[Any]] = {}  # per partition, its record batches in order
        producers: dict[int, Any] = {}
        sizes = self.batch_bytes
        for topic, partition, key, value in records:
            batches = building.get((topic, partition))
            if batches is None:
                batches = building[(topic, partition)] = []
                if partition not in producers:
                    producers[partition] = self.producer_for(partition)
            self._append(producers[partition], batches, key, value, sizes.get(topic))
        for (topic, partition), batches in building.items():
            if len(batches) > 1 and topic in sizes and (topic, partition) not in self._split:
                self._split.add((topic, partition))
                logger.warning(
                    "the states of %s partition %d took %d record batches of %d bytes at most in one "
                    "commit: a crash between them would count some events twice (at least once; "
                    "docs/worker.md); logged once per partition", topic, partition, len(batches),
                    sizes[topic],
                )  # fmt: skip
        return Placement(building, producers)

    async def send_placement(self, placement: Placement) -> None:
        """Queue the record batches :meth:`place` built, each partition's in order."""
        for (topic, partition), batches in placement.batches.items():
            for batch in batches:
                await self._send_batch(placement.producers[partition], batch, topic, partition)

    @property
    def exactly_once(self) -> bool:
        """Whether each input partition's outputs go into its own transaction (:meth:`producer_for`)."""
        return getattr(self.app, "transactions", None) is not None

    def producer_for(self, source_partition: int) -> Any:
        """The aiokafka producer for the outputs of ``source_partition``: Faust's (at least once),
        or that partition's transactional producer (exactly-once)."""
        transactions = getattr(self.app, "transactions", None)
        if transactions is not None:
            return transactions.producer(source_partition)
        return cast("Any", self.app.producer)._ensure_producer()  # noqa: SLF001 - its aiokafka producer

    async def _send_built(self, producer: Any, building: dict[tuple[str, int], list[Any]]) -> None:
        """Queue each partition's record batches (:meth:`_append`), in order."""
        for (topic, partition), batches in building.items():
            for batch in batches:
                await self._send_batch(producer, batch, topic, partition)

    @staticmethod
    def _append(
        producer: Any, batches: list[Any], key: bytes, value: bytes | None, size: int | None = None
    ) -> None:
        """Append a record to the last of one partition's ``batches``, opening a batch when
        there is none or the last is full: the producer's, or of at most ``size`` bytes."""
        if not batches or batches[-1].append(timestamp=None, key=key, value=value) is None:
            batch = producer.create_batch() if size is None else sized_batch(producer, size)
            batch.append(timestamp=None, key=key, value=value)  # a new batch takes any record
            batches.append(batch)

    async def _send_batch(self, producer: Any, batch: Any, topic: str, partition: int) -> None:
        """Queue one record batch for ``topic``/``partition``: behind the partition's queued
        batches without waiting while there are fewer than :data:`MAX_QUEUED_BATCHES`."""
        tp = TopicPartition(topic, partition)
        queue = producer._message_accumulator  # noqa: SLF001 - aiokafka's, see the class docstring
        queued = queue._batches.get(tp)  # noqa: SLF001
        if queued and len(queued) < MAX_QUEUED_BATCHES and not queue._closed and queue._exception is None:  # noqa: SLF001
            fut = queue._append_batch(batch, tp).future  # noqa: SLF001 - what add_batch does after its wait
        else:  # nothing queued (or too much, or a closed or failed producer, which send_batch reports)
            fut = await producer.send_batch(batch, topic, partition=partition)
        fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is None or self.failed is not None:
            return
        self.failed = fut.exception()
        logger.error("an output record was not delivered, stopping the worker: %r", self.failed)
        self._crashing = asyncio.ensure_future(self.app.crash(self.failed))  # type: ignore[arg-type]

    def check(self) -> None:
        if self.failed is not None:
            msg = "an output record was not delivered"
            raise RuntimeError(msg) from self.failed

    def records(self, out: Output, source: str) -> list[tuple[str, bytes, bytes]]:
        """A batch's outputs as records, counted: alerts, branch copies, late copies, and
        dead letters for the events refused for their time (``events_time_refused_total``).

        Counted once per label set and batch: a labelled ``inc`` costs a few microseconds,
        and a flapping rule raises an alert every few events."""
        records: list[tuple[str, bytes, bytes]] = []
        alerts: dict[tuple[str, str], int] = {}
        for alert in out.alerts:
            label = (alert.rule_id, alert.status)
            alerts[label] = alerts.get(label, 0) + 1
            records.append((ALERTS, alert.fingerprint.encode(), alert.to_json()))
        routed: dict[str, int] = {}
        for topic, key, value in out.routed:
            routed[topic] = routed.get(topic, 0) + 1
            records.append((topic, key, value))
        for rule_id, value in out.late:
            records.append((LATE_TOPIC, rule_id.encode(), value))
        for ev, reason in out.refused:  # too far ahead of its partition's clock (docs/event-time.md)
            dead = dlq_record(source, reason, orjson.dumps(ev.fields), adapter="rule-worker", field="ts")
            records.append((DLQ, source.encode(), dead))
        if out.refused:
            REFUSED.labels(source, "ahead", "worker").inc(len(out.refused))
        for (rule_id, status), n in alerts.items():
            ALERTS_OUT.labels(rule_id, status).inc(n)
        for topic, n in routed.items():
            ROUTED.labels(topic).inc(n)
        if out.late_count:  # every late policy: drop counts them too (docs/rules.md)
            LATE.labels(source).inc(out.late_count)
        return records


def state_batch_bytes(limits: Mapping[str, int]) -> dict[str, int]:
    """Per state changelog, the most bytes of a batch of its states (:attr:`Outbox.batch_bytes`):
    :data:`STATE_BATCH_BYTES`, or less where the topic's ``max.message.bytes`` (``limits``)
    takes less, with a warning naming the command that raises it (a topic created by a release
    before 2026-12-01 has the cluster's default, 1 MiB)."""
    out: dict[str, int] = {}
    for topic, limit in limits.items():
        out[topic] = min(STATE_BATCH_BYTES, limit - RECORD_OVERHEAD_BYTES)
        if limit < STATE_TOPIC_MAX_MESSAGE_BYTES:
            logger.warning(
                "state changelog %s takes record batches of %d bytes at most (its max.message.bytes): "
                "a commit's states of one partition beyond that go in several batches, and a crash "
                "between them counts some events twice (at least once). Raise it: kafka-configs.sh "
                "--alter --entity-type topics --entity-name %s --add-config max.message.bytes=%d",
                topic, limit, topic, STATE_TOPIC_MAX_MESSAGE_BYTES,
            )  # fmt: skip
    return out


def sized_batch(producer: Any, size: int) -> BatchBuilder:
    """An empty record batch of at most ``size`` bytes for aiokafka ``producer``, as its
    ``create_batch`` makes one of its ``max_batch_size`` (its compression, transactional when
    the producer is)."""
    queue = producer._message_accumulator  # noqa: SLF001 - aiokafka's, as create_batch reads it
    txn = queue._txn_manager  # noqa: SLF001
    return BatchBuilder(
        size,
        queue._compression_type,  # noqa: SLF001
        is_transactional=txn is not None and txn.transactional_id is not None,
    )


class Placement(NamedTuple):
    """Records copied into record batches, not sent yet (:meth:`Outbox.place`)."""

    #: per topic partition, its record batches in order
    batches: dict[tuple[str, int], list[Any]]
    #: per partition number, the producer its batches go through
    producers: dict[int, Any]


class CommitHooks(NamedTuple):
    """What runs before every offset commit: ``snapshot`` under the commit gate, with the
    offsets taken (``RulesApp.commit_snapshot``), then ``delivery`` with the handlers
    running again (``RulesApp.commit_delivery``)."""

    snapshot: tuple[Callable[[], object], ...]
    delivery: tuple[Callable[[], object], ...]


def commit_hooks(
    outbox: Outbox,
    stores: Iterable[TableStore],
    flush: Callable[[], Awaitable[None]],
    *,
    exactly_once: bool = False,
) -> CommitHooks:
    """What runs before every offset commit, in order. Under the gate: fail if an output was
    lost; take the changed states, copied into record batches (the snapshot). Then, the
    handlers running again: flush the producer (``flush``), so every output of the batches
    the snapshot covers is delivered; send the states; flush again; fail if any output or
    state record was not delivered. The consumer then commits the offsets.

    The outputs go first so that a state record never lands without the outputs of the
    events it counts: a crash after the states and before the offsets makes the restart
    drop those events as evaluated (``agents.wiring.first_records``, ``first_forwards``),
    and an alert they raised, still in the producer at the crash, would have been lost.

    ``exactly_once``: the states go into the partitions' transactions in the snapshot, and
    the commit that follows flushes each transactional producer and fails when a record of
    its transaction was not delivered."""
    stores = tuple(stores)

    def changes() -> Iterator[tuple[str, int, bytes, bytes | None]]:
        return (record for store in stores for record in store.changes())

    if exactly_once:

        async def write_state() -> None:
            """The changed states, into the transactions, before the offsets that cover them."""
            await outbox.send_placed(changes())

        return CommitHooks((outbox.check, write_state), ())

    taken: list[Placement] = []

    def take_states() -> None:
        taken.append(outbox.place(changes()))

    async def delivered() -> None:
        await flush()
        outbox.check()
        placements, taken[:] = list(taken), []
        for placement in placements:
            await outbox.send_placement(placement)
        await flush()
        outbox.check()

    return CommitHooks((outbox.check, take_states), (delivered,))
