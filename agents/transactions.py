"""Exactly-once for the rule worker: one Kafka transaction per input partition and commit.

``APP_PROCESSING_GUARANTEE=exactly_once`` (docs/exactly-once.md). The worker's input
topics (the source topics and their regroup topics) and its state changelogs all have
``APP_PARTITIONS`` partitions, and Faust's assignor gives partition *p* of every one of them
to the same worker (one co-partitioned group). Partition *p* is the unit of work: its
batches' outputs (alerts, DLQ, regrouped events, branch and late copies), the changelog
records of its rule states (stamped with *p*) and the offsets of every input topic's
partition *p* go through one transactional producer, whose ``transactional_id`` is
``<group>-eos-<p>``. Each commit (each second, and before partitions are revoked) sends
the offsets to the transaction and commits it; the changelog records, the outputs and
the offsets of that second become visible together, or (a crash) never.

Why per partition and not one producer for the worker: aiokafka 0.14 sends
``TxnOffsetCommit`` without the group's generation (no KIP-447), so the broker cannot tell
a zombie's offset commit from the owner's. What fences a zombie is the transactional id:
the new owner of partition *p* starts a producer with ``<group>-eos-<p>`` before it reads
*p*'s changelog or committed offsets, which (InitProducerId) bumps the id's epoch and
aborts whatever transaction the previous owner had open; the previous owner's next send,
offset commit or commit fails with ``ProducerFenced`` and the worker stops. An id per
worker would change with every assignment, and fence nobody.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition
from prometheus_client import Histogram

logger = logging.getLogger(__name__)

#: Broker-side bound on an open transaction: a worker that died mid-transaction and is not
#: restarted holds back read_committed readers of the partitions it wrote (``alerts``) this
#: long at most; a restarted one aborts it at once. A commit runs each second.
TRANSACTION_TIMEOUT_MS = 10_000

COMMIT_SECONDS = Histogram(
    "worker_transaction_commit_seconds",
    "Exactly-once: one commit, the changed states' records and every partition's transaction, "
    "while evaluation waits",
    buckets=(1e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5),
)


class PartitionTransactions:
    """The transactional producers of the partitions this worker owns, one per partition number.

    ``new_producer(transactional_id)``: an unstarted ``AIOKafkaProducer`` with that id (the
    worker's producer settings). Not thread-safe; every call is on the worker's event loop,
    and the consumer serialises handlers and commits (its gate).
    """

    def __init__(self, group_id: str, new_producer: Callable[[str], AIOKafkaProducer]) -> None:
        self.group_id = group_id
        self.new_producer = new_producer
        self.producers: dict[int, AIOKafkaProducer] = {}
        #: transactions begun on every producer: outputs may be sent
        self.open = False
        #: the first failure: nothing is committed after it (the worker is stopping)
        self.failed: BaseException | None = None
        self.commits = 0

    def transactional_id(self, partition: int) -> str:
        return f"{self.group_id}-eos-{partition}"

    def producer(self, partition: int) -> AIOKafkaProducer:
        """The producer of ``partition``'s transaction; an error when it is not open."""
        if not self.open:
            msg = f"no open transaction for partition {partition} (rebalancing, stopping or failed)"
            raise RuntimeError(msg)
        try:
            return self.producers[partition]
        except KeyError:
            msg = f"partition {partition} is not assigned to this worker: it has no transactional producer"
            raise RuntimeError(msg) from None

    async def assign(self, partitions: Iterable[int]) -> None:
        """Own ``partitions``: stop the producers of the others, start (and so fence the previous
        owner of) those of the new ones, and begin a transaction on each."""
        wanted = set(partitions)
        if self.failed is not None:
            msg = "a transaction failed: this worker is stopping"
            raise RuntimeError(msg) from self.failed
        if self.open:
            msg = "assign() with transactions still open: the revocation's commit did not run"
            raise RuntimeError(msg)
        for p in sorted(set(self.producers) - wanted):
            await self.producers.pop(p).stop()
        new = sorted(wanted - set(self.producers))
        if new:
            started = await asyncio.gather(*(self._start(p) for p in new), return_exceptions=True)
            for p, result in zip(new, started, strict=True):
                if isinstance(result, BaseException):
                    await self.close()
                    raise result
                self.producers[p] = result
            logger.info("transactional producers started for partitions %s (previous owners fenced)", new)
        for producer in self.producers.values():
            await producer.begin_transaction()
        self.open = True

    async def _start(self, partition: int) -> AIOKafkaProducer:
        producer = self.new_producer(self.transactional_id(partition))
        try:
            await producer.start()  # InitProducerId: bumps the epoch, ends the previous owner's transaction
        except BaseException:
            await producer.stop()
            raise
        return producer

    async def commit(self, offsets: Mapping[Any, int], *, begin: bool) -> None:
        """Add each partition's input ``offsets`` (``{tp: next offset}``) to its transaction,
        commit every open transaction (each flushes its producer first), and, ``begin``, begin
        the next ones. Any failure is raised and ends the transactions: the worker must stop."""
        if not self.open:
            return
        by_partition: dict[int, dict[TopicPartition, int]] = {}
        for tp, offset in offsets.items():
            if tp.partition not in self.producers:
                msg = f"offset for {tp}, a partition this worker has no transactional producer for"
                raise RuntimeError(msg)
            by_partition.setdefault(tp.partition, {})[TopicPartition(tp.topic, tp.partition)] = offset
        self.open = False

        async def one(partition: int, producer: AIOKafkaProducer) -> None:
            if partition in by_partition:
                await producer.send_offsets_to_transaction(by_partition[partition], self.group_id)
            await producer.commit_transaction()
            if begin:
                await producer.begin_transaction()

        try:
            await asyncio.gather(*(one(p, producer) for p, producer in self.producers.items()))
        except BaseException as exc:
            self.failed = exc
            for producer in self.producers.values():
                _settle(producer)
            raise
        self.commits += 1
        self.open = begin

    async def close(self) -> None:
        """Stop every producer (an open transaction is left to the broker: the next owner of its
        partition aborts it as it starts, or the transaction timeout does)."""
        self.open = False
        producers, self.producers = list(self.producers.values()), {}
        for producer in producers:
            _settle(producer)
            try:
                await producer.stop()
            except Exception as exc:  # stopping: report, go on with the others
                logger.warning("stopping a transactional producer failed: %r", exc)


def _settle(producer: AIOKafkaProducer) -> None:
    """Mark a failed transaction's outcome as seen. aiokafka sets a fenced or failed
    producer's transaction future to the error whether or not anyone awaits it; left unread,
    asyncio logs it from a finalizer, at whatever moment the garbage collector runs."""
    manager = getattr(producer, "_txn_manager", None)
    waiter = getattr(manager, "_transaction_waiter", None)
    if isinstance(waiter, asyncio.Future) and waiter.done() and not waiter.cancelled():
        waiter.exception()
