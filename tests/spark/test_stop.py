"""A stop that interrupts a micro-batch while the sink collects it: Spark must take it for a
stop, not a failure (``jobs.sink.collect``), and a stopping role waits for the batch to end
first where it can (``jobs.engine.stop_between_batches``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.engine import stop_between_batches
from jobs.sink import BatchInterrupted, collect

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:Cannot infer the eval type from type hints"),  # a plain UDF
]


def _slowly(n: int) -> int:
    time.sleep(0.02)
    return n


def _slow_stream(spark: SparkSession, folder: Path, rows: int) -> DataFrame:
    """One file of ``rows`` lines, each through a UDF that takes 20 ms."""
    folder.mkdir()
    (folder / "part.txt").write_text("".join(f"{i}\n" for i in range(rows)))
    slowly = F.udf(_slowly, "long")
    return spark.readStream.text(str(folder)).select(slowly(F.col("value").cast("long")).alias("n"))


def test_a_stop_during_the_sinks_collect_is_told_in_two_lines_and_taken_for_a_stop(
    spark: SparkSession, tmp_path: Path
) -> None:
    started, raised = threading.Event(), []

    def sink(df: DataFrame, _batch_id: int) -> None:
        started.set()
        try:
            collect(df)
        except Exception as exc:
            raised.append(exc)
            raise

    query = (
        _slow_stream(spark, tmp_path / "in", 1_000)  # 20 s of UDF time: the stop comes first
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        assert started.wait(60), "the first batch did not reach the sink"
        time.sleep(1.0)  # the collect's job runs
    finally:
        query.stop()
    assert len(raised) == 1 and isinstance(raised[0], BatchInterrupted), raised
    said = str(raised[0])
    assert said.startswith("py4j.protocol.Py4JJavaError: An error occurred while calling")
    assert len(said) < 300 and "Interrupt" in said.splitlines()[-1], said
    assert query.exception() is None  # Spark took it for the stop it was


def test_a_stop_waits_for_the_running_batch_to_end(spark: SparkSession, tmp_path: Path) -> None:
    started, outcome = threading.Event(), []

    def sink(df: DataFrame, _batch_id: int) -> None:
        started.set()
        outcome.append(len(collect(df)))

    query = (
        _slow_stream(spark, tmp_path / "in", 100)  # about 2 s of UDF time
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        assert started.wait(60), "the first batch did not reach the sink"
        stop_between_batches(query, wait_s=30)
    finally:
        query.stop()
    assert outcome == [100]  # the batch ran to its end before the stop
    assert not query.isActive and query.exception() is None
