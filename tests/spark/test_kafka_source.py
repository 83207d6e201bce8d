"""The Spark engine's Kafka sources against the real broker, each test on both formats
(Spark's connector ``kafka`` and the fallback ``kafka_py``): schema, options, limits,
restarts from a checkpoint, transactions (offset gaps, read_committed) and clear errors."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from app.kafka.broker import KafkaBroker, free_port
from jobs import kafka_client
from jobs.kafka_client import KafkaSourceError
from jobs.kafka_offsets import KafkaSourceOptions
from jobs.kafka_source import read_kafka
from tests.conftest import child_env
from tests.procs import role
from tests.spark.conftest import (
    FORMATS,
    collect_batches,
    produce_to,
    produce_txn,
    run_restarting,
    transaction,
)
from tests.spark.helpers import RULES

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TOPIC = "events.sensors"  # 2 partitions in the broker fixture

# Spark's built-in Kafka source schema (KafkaRecordToRowConverter.kafkaSchema without headers)
BUILTIN = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)


@pytest.fixture(params=FORMATS)
def fmt(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def fill(bootstrap: str, per_partition: int, first: int = 0) -> None:
    produce_to(
        bootstrap,
        TOPIC,
        [
            (p, f"k{p}".encode(), f"p{p}-{i}".encode())
            for i in range(first, first + per_partition)
            for p in (0, 1)
        ],
    )


def options(bootstrap: str, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, "subscribe": TOPIC, **extra}


def offsets_of(rows: list[Any]) -> list[tuple[int, int]]:
    return sorted((r["partition"], r["offset"]) for r in rows)


def every_row(batches: dict[int, list[Any]]) -> list[Any]:
    return [r for rows in batches.values() for r in rows]


def read(spark: SparkSession, fmt: str, opts: dict[str, str]) -> list[Any]:
    return read_kafka(spark, opts, streaming=False, fmt=fmt).collect()


def run_stream(spark: SparkSession, fmt: str, opts: dict[str, str], checkpoint: Path) -> dict[int, list[Any]]:
    """Run an ``availableNow`` query to its end: the rows of each batch id (a re-run batch
    replaces itself, so a restart after a worker that missed its start changes nothing)."""
    batches: dict[int, list[Any]] = {}

    def start() -> StreamingQuery:
        return (
            read_kafka(spark, opts, streaming=True, fmt=fmt)
            .writeStream.foreachBatch(collect_batches(batches))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    run_restarting(start)
    return batches


def test_batch_read_has_the_builtin_schema_and_every_record(
    spark: SparkSession, broker: KafkaBroker, fmt: str
) -> None:
    fill(broker.bootstrap, 30)
    df = read_kafka(spark, options(broker.bootstrap), streaming=False, fmt=fmt)
    assert df.schema == StructType.fromDDL(BUILTIN)
    rows = df.collect()
    assert offsets_of(rows) == [(p, o) for p in (0, 1) for o in range(30)]
    first = next(r for r in rows if r["partition"] == 1 and r["offset"] == 7)
    assert (first["key"], first["value"], first["topic"]) == (b"k1", b"p1-7", TOPIC)
    assert first["timestamp"] is not None and first["timestampType"] == 0


def test_batch_json_starting_and_ending_offsets_are_exact(
    spark: SparkSession, broker: KafkaBroker, fmt: str
) -> None:
    fill(broker.bootstrap, 20)
    opts = options(
        broker.bootstrap,
        startingOffsets=json.dumps({TOPIC: {"0": 5, "1": -2}}),
        endingOffsets=json.dumps({TOPIC: {"0": 8, "1": -1}}),
    )
    assert offsets_of(read(spark, fmt, opts)) == [(0, 5), (0, 6), (0, 7)] + [(1, o) for o in range(20)]


def test_assign_reads_only_the_assigned_partitions(
    spark: SparkSession, broker: KafkaBroker, fmt: str
) -> None:
    fill(broker.bootstrap, 4)
    opts = {"kafka.bootstrap.servers": broker.bootstrap, "assign": json.dumps({TOPIC: [1]})}
    assert offsets_of(read(spark, fmt, opts)) == [(1, o) for o in range(4)]


def test_stream_latest_skips_the_backlog_and_a_restart_resumes_exactly(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path, fmt: str
) -> None:
    fill(broker.bootstrap, 10)
    ckpt = tmp_path / "ckpt"
    first = run_stream(spark, fmt, options(broker.bootstrap, startingOffsets="latest"), ckpt)
    assert every_row(first) == []
    fill(broker.bootstrap, 15, first=10)
    second = run_stream(spark, fmt, options(broker.bootstrap, startingOffsets="latest"), ckpt)
    assert offsets_of(every_row(second)) == [(p, o) for p in (0, 1) for o in range(10, 25)]
    third = run_stream(
        spark, fmt, options(broker.bootstrap, startingOffsets="earliest"), ckpt
    )  # checkpoint wins
    assert every_row(third) == []


def test_max_offsets_per_trigger_bounds_each_batch_and_a_restart_has_no_gap_or_duplicate(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path, fmt: str
) -> None:
    fill(broker.bootstrap, 40)
    ckpt = tmp_path / "ckpt"
    opts = options(broker.bootstrap, startingOffsets="earliest", maxOffsetsPerTrigger="25")
    first = run_stream(spark, fmt, opts, ckpt)
    sizes = [len(first[b]) for b in sorted(first)]
    assert sizes and max(sizes) <= 25 and sum(sizes) == 80 and len(sizes) >= 4
    fill(broker.bootstrap, 7, first=40)
    second = run_stream(spark, fmt, opts, ckpt)
    assert min(second) > max(first), "batch ids continue after a restart"
    seen = offsets_of(every_row(first) + every_row(second))
    assert seen == [(p, o) for p in (0, 1) for o in range(47)]


def test_stream_json_starting_offsets_per_partition(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path, fmt: str
) -> None:
    fill(broker.bootstrap, 6)
    opts = options(broker.bootstrap, startingOffsets=json.dumps({TOPIC: {"0": 4, "1": -1}}))
    assert offsets_of(every_row(run_stream(spark, fmt, opts, tmp_path / "ckpt"))) == [(0, 4), (0, 5)]


def transactional(bootstrap: str) -> list[tuple[int, int]]:
    """Partition 0: 5 committed records (offsets 0-4, marker 5), 3 aborted (6-8, marker 9),
    4 committed (10-13, marker 14, the last offset); partition 1: 3 plain records. The
    committed (partition, offset) pairs."""
    one = "tests-spark-layout"  # one transactional id: each marker lands before the next records
    produce_txn(bootstrap, TOPIC, [(0, b"k0", b"c%d" % i) for i in range(5)], txn_id=one)
    produce_txn(bootstrap, TOPIC, [(0, b"k0", b"a%d" % i) for i in range(3)], commit=False, txn_id=one)
    produce_txn(bootstrap, TOPIC, [(0, b"k0", b"c%d" % i) for i in range(5, 9)], txn_id=one)
    produce_to(bootstrap, TOPIC, [(1, b"k1", b"p%d" % i) for i in range(3)])
    return [(0, o) for o in (*range(5), *range(10, 14))] + [(1, o) for o in range(3)]


def test_transactions_read_committed_by_default_across_offset_gaps(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path, fmt: str
) -> None:
    committed = transactional(broker.bootstrap)
    assert offsets_of(read(spark, fmt, options(broker.bootstrap))) == committed
    uncommitted = read(spark, fmt, options(broker.bootstrap, **{"kafka.isolation.level": "read_uncommitted"}))
    assert offsets_of(uncommitted) == sorted([*committed, (0, 6), (0, 7), (0, 8)])  # aborted, still no marker

    # batches of 3 end on markers and inside the aborted range: nothing stalls, lost or repeated
    opts = options(broker.bootstrap, startingOffsets="earliest", maxOffsetsPerTrigger="3")
    started = time.monotonic()
    first = run_stream(spark, fmt, opts, tmp_path / "ckpt")
    assert offsets_of(every_row(first)) == committed
    assert [
        r["value"] for r in sorted(every_row(first), key=lambda r: r["offset"]) if r["partition"] == 0
    ] == [b"c%d" % i for i in range(9)]
    assert time.monotonic() - started < 60, "a gap must not wait out a fetch timeout"

    with transaction(broker.bootstrap, TOPIC, [(0, b"k0", b"open%d" % i) for i in range(3)]) as txn:
        produce_to(broker.bootstrap, TOPIC, [(1, b"k1", b"p3")])
        # read_committed stops before the open transaction (offsets 15-17), the rest goes on
        assert offsets_of(every_row(run_stream(spark, fmt, opts, tmp_path / "ckpt"))) == [(1, 3)]
        assert offsets_of(read(spark, fmt, options(broker.bootstrap))) == sorted([*committed, (1, 3)])
        txn.commit()
    after = run_stream(spark, fmt, opts, tmp_path / "ckpt")
    assert offsets_of(every_row(after)) == [(0, 15), (0, 16), (0, 17)]


def test_kafka_py_fetches_every_range_of_a_transactional_partition_without_stalling(
    broker: KafkaBroker,
) -> None:
    """Ranges that end on, start at or hold only markers and aborted records: the fetch ends
    on the consumer's position, never waits for an offset that holds no record (a stall
    would raise "no progress" after the 5 s timeout)."""
    committed = {o for p, o in transactional(broker.bootstrap) if p == 0}
    for isolation, visible in (("read_committed", committed), ("read_uncommitted", committed | {6, 7, 8})):
        opts = KafkaSourceOptions.parse(
            options(
                broker.bootstrap,
                **{"kafka.isolation.level": isolation, "kafka.default.api.timeout.ms": "5000"},
            ),
            streaming=False,
        )
        assert kafka_client.snapshot(opts).latest[(TOPIC, 0)] == 15  # the last commit marker is offset 14
        for start in range(15):
            for end in range(start + 1, 16):
                started = time.monotonic()
                got = [r.offset for chunk in kafka_client.fetch(opts, (TOPIC, 0), start, end) for r in chunk]
                assert got == sorted(o for o in visible if start <= o < end), (isolation, start, end)
                assert time.monotonic() - started < 3, (isolation, start, end)


def test_missing_topic_or_partition_is_a_clear_error(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path, fmt: str
) -> None:
    opts = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": "no.such.topic"}
    with pytest.raises(KafkaSourceError, match=r"topic\(s\) no\.such\.topic do not exist on 127\.0\.0\.1"):
        read(spark, fmt, opts)
    with pytest.raises(KafkaSourceError, match=r"topic\(s\) no\.such\.topic do not exist"):
        run_stream(spark, fmt, opts, tmp_path / "ckpt")
    assign = {"kafka.bootstrap.servers": broker.bootstrap, "assign": json.dumps({TOPIC: [0, 5]})}
    with pytest.raises(
        KafkaSourceError, match=r"assigned partition\(s\) \[\('events\.sensors', 5\)\] do not"
    ):
        read(spark, fmt, assign)


def test_a_topic_created_a_moment_ago_is_not_missing(broker: KafkaBroker) -> None:
    """Its partitions have no leader for a few ms, and metadata leaves it out meanwhile (one
    check in ten failed without the wait for it)."""

    async def create(name: str) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, 2, 1)])
        finally:
            await admin.close()

    for i in range(10):
        asyncio.run(create(f"new-{i}"))
        opts = KafkaSourceOptions.subscription(options(broker.bootstrap, subscribe=f"new-{i}"))
        assert kafka_client.check_subscription(opts) == [(f"new-{i}", 0), (f"new-{i}", 1)]


def test_unreachable_broker_is_a_clear_error(spark: SparkSession, fmt: str) -> None:
    opts = {"kafka.bootstrap.servers": f"127.0.0.1:{free_port()}", "subscribe": TOPIC}
    started = time.monotonic()
    with pytest.raises(KafkaSourceError, match=r"cannot reach Kafka at 127\.0\.0\.1:\d+"):
        read(spark, fmt, opts)
    assert time.monotonic() - started < 20


def test_the_kafka_format_without_the_connector_says_how_to_fetch_it(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    """A session started without the jars (here a backtest's own, in a subprocess) gives the
    command that fetches them instead of Spark's "data source not found"."""
    env = child_env(
        KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
        APP_DATA_DIR=str(tmp_path / "data"),
        APP_SPARK_KAFKA_JARS=str(tmp_path / "no-jars"),
    )
    log = tmp_path / "backtest.log"
    args = ["app", "backtest", "--engine", "spark", "--master", "local[1]", "--rules", str(RULES)]
    with role([*args, "--topic", TOPIC], env, log) as proc:
        assert proc.wait(120) == 2
    out = log.read_text(errors="replace")
    assert "error: APP_SPARK_KAFKA_FORMAT=kafka needs Spark's Kafka connector" in out, out[-2000:]
    assert "scripts/fetch-jars.sh spark-kafka" in out
