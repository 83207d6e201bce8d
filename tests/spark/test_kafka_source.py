"""The kafka_py Spark source against the real embedded broker: schema, offsets, limits,
restart from a checkpoint, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from app.broker import KafkaBroker, free_port
from jobs.kafka_source import read_kafka
from tests.spark.conftest import await_query, collect_batches, produce_to

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TOPIC = "events.sensors"  # 2 partitions in the broker fixture

# Spark's built-in Kafka source schema (KafkaRecordToRowConverter.kafkaSchema without headers)
BUILTIN = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)


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


def run_stream(spark: SparkSession, opts: dict[str, str], checkpoint: Path) -> dict[int, list[Any]]:
    batches: dict[int, list[Any]] = {}
    q = (
        read_kafka(spark, opts, streaming=True)
        .writeStream.foreachBatch(collect_batches(batches))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_query(q)
    return batches


def test_batch_read_has_the_builtin_schema_and_every_record(spark: SparkSession, broker: KafkaBroker) -> None:
    fill(broker.bootstrap, 30)
    df = read_kafka(spark, options(broker.bootstrap), streaming=False)
    assert df.schema == StructType.fromDDL(BUILTIN)
    rows = df.collect()
    assert offsets_of(rows) == [(p, o) for p in (0, 1) for o in range(30)]
    first = next(r for r in rows if r["partition"] == 1 and r["offset"] == 7)
    assert (first["key"], first["value"], first["topic"]) == (b"k1", b"p1-7", TOPIC)
    assert first["timestamp"] is not None and first["timestampType"] == 0


def test_batch_json_starting_and_ending_offsets_are_exact(spark: SparkSession, broker: KafkaBroker) -> None:
    fill(broker.bootstrap, 20)
    opts = options(
        broker.bootstrap,
        startingOffsets=json.dumps({TOPIC: {"0": 5, "1": -2}}),
        endingOffsets=json.dumps({TOPIC: {"0": 8, "1": -1}}),
    )
    rows = read_kafka(spark, opts, streaming=False).collect()
    assert offsets_of(rows) == [(0, 5), (0, 6), (0, 7)] + [(1, o) for o in range(20)]


def test_stream_latest_skips_the_backlog_and_a_restart_resumes_exactly(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path
) -> None:
    fill(broker.bootstrap, 10)
    ckpt = tmp_path / "ckpt"
    first = run_stream(spark, options(broker.bootstrap, startingOffsets="latest"), ckpt)
    assert sum(len(rows) for rows in first.values()) == 0
    fill(broker.bootstrap, 15, first=10)
    second = run_stream(spark, options(broker.bootstrap, startingOffsets="latest"), ckpt)
    assert offsets_of([r for rows in second.values() for r in rows]) == [
        (p, o) for p in (0, 1) for o in range(10, 25)
    ]
    third = run_stream(spark, options(broker.bootstrap, startingOffsets="earliest"), ckpt)  # checkpoint wins
    assert sum(len(rows) for rows in third.values()) == 0


def test_max_offsets_per_trigger_bounds_each_batch_and_a_restart_has_no_gap_or_duplicate(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path
) -> None:
    fill(broker.bootstrap, 40)
    ckpt = tmp_path / "ckpt"
    opts = options(broker.bootstrap, startingOffsets="earliest", maxOffsetsPerTrigger="25")
    first = run_stream(spark, opts, ckpt)
    sizes = [len(first[b]) for b in sorted(first)]
    assert sizes and max(sizes) <= 25 and sum(sizes) == 80 and len(sizes) >= 4
    fill(broker.bootstrap, 7, first=40)
    second = run_stream(spark, opts, ckpt)
    assert min(second) > max(first), "batch ids continue after a restart"
    seen = offsets_of([r for b in (first, second) for rows in b.values() for r in rows])
    assert seen == [(p, o) for p in (0, 1) for o in range(47)]


def test_stream_json_starting_offsets_per_partition(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path
) -> None:
    fill(broker.bootstrap, 6)
    opts = options(broker.bootstrap, startingOffsets=json.dumps({TOPIC: {"0": 4, "1": -1}}))
    batches = run_stream(spark, opts, tmp_path / "ckpt")
    assert offsets_of([r for rows in batches.values() for r in rows]) == [(0, 4), (0, 5)]


def test_missing_topic_is_a_clear_error(spark: SparkSession, broker: KafkaBroker, tmp_path: Path) -> None:
    opts = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": "no.such.topic"}
    with pytest.raises(Exception, match=r"topic\(s\) no\.such\.topic do not exist on 127\.0\.0\.1"):
        read_kafka(spark, opts, streaming=False).collect()
    with pytest.raises(Exception, match=r"topic\(s\) no\.such\.topic do not exist"):
        run_stream(spark, opts, tmp_path / "ckpt")


def test_unreachable_broker_is_a_clear_error(spark: SparkSession) -> None:
    opts = {"kafka.bootstrap.servers": f"127.0.0.1:{free_port()}", "subscribe": TOPIC}
    with pytest.raises(Exception, match=r"cannot reach Kafka at 127\.0\.0\.1:\d+"):
        read_kafka(spark, opts, streaming=False).collect()


def test_the_setting_switches_to_the_native_connector(
    spark: SparkSession, broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APP_SPARK_KAFKA_FORMAT", "kafka")
    # the spark-sql-kafka-0-10 jar is not installed here, so Spark must say it looked for "kafka"
    with pytest.raises(Exception, match=r"(?i)data source.*kafka"):
        read_kafka(spark, options(broker.bootstrap), streaming=False).collect()
