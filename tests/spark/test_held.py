"""``jobs.held``: what a Spark backtest's plans read more than once, persisted for the run."""

from __future__ import annotations

import pytest
from pyspark import StorageLevel
from pyspark.sql import SparkSession

from jobs import held, windows
from jobs.decode import DECODED_SCHEMA

pytestmark = pytest.mark.integration  # a real Spark


def test_inside_holding_a_streams_clocks_are_computed_once_then_released(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    """A backtest's plans each ask for a stream's clocks: inside ``jobs.held.holding`` the first
    answer is persisted and a later, separately built equal plan reads it from Spark's
    cache; at the exit it is released, with what the caller handed over; outside, nothing
    is persisted."""
    rows = [("sensors", p, o, 1_000 * o, "{}", None, ["a"], None) for p in (0, 1) for o in range(20)]
    decoded = spark.createDataFrame(rows, DECODED_SCHEMA)
    stream = windows.NativeStream("sensors", "sensors", 0)
    mine = spark.range(3).cache()  # the caller's own (a backtest's cached decode)
    with held.holding(mine):
        first = windows.clocked(decoded, stream, 0)
        assert first.storageLevel != StorageLevel.NONE
        expected = sorted(first.collect())
        capsys.readouterr()
        again = windows.clocked(decoded, stream, 0)
        again.explain()
        assert "InMemoryTableScan" in capsys.readouterr().out
        assert sorted(again.collect()) == expected
    assert first.storageLevel == StorageLevel.NONE
    assert mine.storageLevel == StorageLevel.NONE
    outside = windows.clocked(decoded, stream, 0)
    assert outside.storageLevel == StorageLevel.NONE
    outside.explain()
    assert "InMemoryTableScan" not in capsys.readouterr().out


def test_holding_leaves_a_plan_someone_else_persisted_to_them(spark: SparkSession) -> None:
    """Clocks already persisted outside the context (an equal plan) are served from that
    cache, not persisted again, and still there after the exit."""
    rows = [("sensors", 0, o, 1_000 * o, "{}", None, ["a"], None) for o in range(10)]
    decoded = spark.createDataFrame(rows, DECODED_SCHEMA)
    stream = windows.NativeStream("sensors", "sensors", 0)
    theirs = windows.clocked(decoded, stream, 0).cache()
    try:
        theirs.count()
        with held.holding():
            mine = windows.clocked(decoded, stream, 0)
            assert mine.storageLevel != StorageLevel.NONE  # their cache serves it
            assert sorted(mine.collect()) == sorted(theirs.collect())
        assert theirs.storageLevel != StorageLevel.NONE
    finally:
        theirs.unpersist()
