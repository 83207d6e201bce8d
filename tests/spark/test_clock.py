"""``jobs.windows.clocked``, the stream partitions' clocks that every native plan of a backtest
reads, against a reference in Python."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import SparkSession

from jobs import windows

pytestmark = pytest.mark.integration  # a real Spark


def test_the_partition_clock_is_the_running_max_whatever_the_chunks(spark: SparkSession) -> None:
    """``clocked`` computes each stream partition's clock per chunk of offsets, in parallel;
    it must be the running ``max`` in (partition, offset) order across chunks, records
    partitions and stream partitions, NULL before a partition's first event."""
    rng = random.Random(7)  # noqa: S311 - test data
    rows = []
    for offset in range(200):
        for part in (0, 1):
            if rng.random() < 0.7:
                sk = rng.choice(["a", "b", "c"])
                rows.append((None, "sensors", [sk], part, offset, rng.randrange(10_000), "{}"))
    rows.append(("bad", "sensors", ["a"], 0, 301, 99_999, "{}"))  # a DLQ record: not an event
    schema = (
        "__dlq string, __source string, __streams array<string>, __part int, __offset long, __ts_ms long, "
        "__fields string"
    )
    decoded = spark.createDataFrame(rows, schema)
    expected: dict[tuple[int, int], tuple[int | None, int]] = {}
    newest: dict[str, int] = {}
    for _, _, (sk,), part, offset, ts, _ in sorted(
        (r for r in rows if r[0] is None), key=lambda r: (r[3], r[4])
    ):
        before = newest.get(sk)
        expected[(part, offset)] = (before, max(ts, before if before is not None else ts))
        newest[sk] = max(ts, before if before is not None else ts)
    stream = windows.NativeStream("sensors", "sensors", 0)
    for chunk in (0, 1, 7, 1 << 16):  # 0: one task per stream partition
        got = {
            (r["__part"], r["__offset"]): (r["__prev"], r["__clock"])
            for r in windows.clocked(decoded, stream, chunk).collect()
        }
        assert got == expected, chunk
