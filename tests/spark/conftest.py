"""One SparkSession for the whole test run (local[2], 2 shuffle partitions, no UI, Spark's
Kafka connector on its class path), plus bounded helpers for streaming queries and
partition-exact producing, also in transactions."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from jobs.engine import WorkerRestarts
from jobs.session import build_session

QUERY_TIMEOUT_S = 90
#: the Kafka sources of the Spark engine: Spark's connector (the default) and the fallback
FORMATS = ("kafka", "kafka_py")
_TXN_IDS = itertools.count()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session(
        "local[2]",
        app_name="streamalert-tests",
        shuffle_partitions=2,
        extra={"spark.ui.enabled": "false", "spark.sql.streaming.minBatchesToRetain": "10"},
    )
    try:
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        session.stop()


def await_query(q: StreamingQuery, timeout_s: float = QUERY_TIMEOUT_S) -> StreamingQuery:
    """Wait for a query (e.g. ``availableNow``) to finish; stop it and fail the test on timeout."""
    try:
        done = q.awaitTermination(timeout_s)
    finally:
        if q.isActive:
            q.stop()
    assert done, f"streaming query {q.name} did not finish within {timeout_s}s"
    return q


def run_restarting(start: Callable[[], StreamingQuery]) -> StreamingQuery:
    """Start a query and wait for it; when its Python worker missed Spark's 10 s to connect
    back, start it again from the same checkpoint, as the roles do (:class:`WorkerRestarts`).
    Any other failure fails the test, and so does that one past the restarts."""
    restarts = WorkerRestarts("test")
    while True:
        query = start()
        try:
            return await_query(query)
        except StreamingQueryException as exc:
            if not restarts.allow(exc, query, threading.Event()):
                raise


def collect_batches(store: dict[int, list[Any]]) -> Callable[[DataFrame, int], None]:
    """A foreachBatch function keeping the rows of each batch id (a re-run batch replaces itself)."""

    def sink(df: DataFrame, batch_id: int) -> None:
        store[batch_id] = df.collect()

    return sink


def produce_to(bootstrap: str, topic: str, items: list[tuple[int, bytes | None, bytes]]) -> None:
    """Produce ``(partition, key, value)`` records to exact partitions and wait for every ack."""

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        await p.start()
        try:
            futs = [await p.send(topic, value=v, key=k, partition=part) for part, k, v in items]
            await asyncio.gather(*futs)
        finally:
            await p.stop()

    asyncio.run(run())


@contextmanager
def transaction(
    bootstrap: str, topic: str, items: list[tuple[int, bytes | None, bytes]], txn_id: str | None = None
) -> Iterator[Any]:
    """Produce ``(partition, key, value)`` records in one open transaction, acknowledged but not
    committed; the body may call ``commit()`` or ``abort()`` on what it gets, else it is aborted
    at the end. The producer runs on a private event loop, driven only inside these calls.

    Transactions under one ``txn_id`` are laid out in order: a producer's InitProducerId waits
    until the previous transaction's markers are written. Under different ids (the default, a
    new one per call), a later transaction's records may land before an earlier one's marker."""
    loop = asyncio.new_event_loop()

    async def make() -> AIOKafkaProducer:  # aiokafka binds a producer to the loop that creates it
        return AIOKafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=txn_id or f"tests-spark-{next(_TXN_IDS)}"
        )

    p = loop.run_until_complete(make())

    async def begin() -> None:
        await p.start()
        await p.begin_transaction()
        for part, k, v in items:
            await p.send_and_wait(topic, value=v, key=k, partition=part)

    class Txn:
        done = False

        def commit(self) -> None:
            loop.run_until_complete(p.commit_transaction())
            self.done = True

        def abort(self) -> None:
            loop.run_until_complete(p.abort_transaction())
            self.done = True

    txn = Txn()
    try:
        loop.run_until_complete(begin())
        yield txn
        if not txn.done:
            txn.abort()
    finally:
        loop.run_until_complete(p.stop())
        loop.close()


def produce_txn(
    bootstrap: str,
    topic: str,
    items: list[tuple[int, bytes | None, bytes]],
    *,
    commit: bool = True,
    txn_id: str | None = None,
) -> None:
    """Produce ``(partition, key, value)`` records in one transaction, then commit or abort it."""
    with transaction(bootstrap, topic, items, txn_id) as txn:
        if commit:
            txn.commit()
        else:
            txn.abort()
