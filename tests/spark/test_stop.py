"""A stop that interrupts a micro-batch while the sink collects it: Spark must take it for a
stop, not a failure (``jobs.sink.collect``), and a stopping role waits for the batch to end
first where it can (``jobs.engine.stop_between_batches``); where it cannot, the cut is told
in one line, not in Spark's errors, and the batch is done again at the next start."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from jobs.engine import stop_between_batches
from jobs.sink import BatchInterrupted, collect
from tests.conftest import child_env
from tests.procs import run_script

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


#: the archive's kind of query (a Parquet file sink) stopped in its first micro-batch, which
#: outlasts the stop's wait: in a process of its own, whose output is the role's log
CUT_SHORT = """
import logging, sys, time
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
from pyspark.sql import functions as F
from jobs.engine import stop_between_batches
from jobs.session import build_session
from tests.spark.test_stop import _slow_stream
tmp = Path(sys.argv[1])
spark = build_session("local[1]", app_name="cut-short")
query = (
    _slow_stream(spark, tmp / "in", ROWS).writeStream.queryName("archive-like").format("parquet")
    .option("path", str(tmp / "out")).option("checkpointLocation", str(tmp / "cp")).start()
)
while not query.status["isTriggerActive"]:
    time.sleep(0.05)
time.sleep(1.0)  # the write's tasks run
stop_between_batches(query, wait_s=0.2)
print("exception:", query.exception())
spark.stop()
"""
ROWS = 150  # 3 s of UDF time


def test_a_batch_the_stop_cuts_short_is_told_in_one_line_and_done_again_at_the_next_start(
    spark: SparkSession, tmp_path: Path
) -> None:
    code, out, err = run_script(CUT_SHORT.replace("ROWS", str(ROWS)), str(tmp_path), env=child_env())
    assert code == 0, err[-3000:]
    assert "exception: None" in out  # a stop, not a failure
    said = [line for line in err.splitlines() if "jobs.engine" in line]
    assert said == [
        "INFO jobs.engine: query 'archive-like' still ran its first micro-batch after 0.2 s: the stop "
        "cuts it short, and it is done again at the next start (Spark's logging off from here)"
    ], err[-3000:]
    assert " ERROR " not in err and "Exception" not in err, err[-3000:]  # Spark's aborts untold

    resumed = (
        spark.readStream.text(str(tmp_path / "in")).select(F.col("value").cast("long").alias("n"))
        .writeStream.format("parquet").option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start()
    )  # fmt: skip
    assert resumed.awaitTermination(60) is not False and resumed.exception() is None
    written = [r["n"] for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(written) == list(range(ROWS))  # the cut batch, whole and once
