"""``jobs.backtest``'s raw records: numbered in the JVM, in file order, across splits."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from jobs.backtest import file_records

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_file_records_number_every_line_in_file_order_across_many_splits(
    spark: SparkSession, tmp_path: Path
) -> None:
    lines = [f'{{"n": {i}, "pad": "{"x" * (i % 37)}"}}' for i in range(5_000)] + ["", "{broken"]
    path = tmp_path / "lines.jsonl"
    path.write_text("\n".join(lines) + "\n")
    before = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "8k")  # dozens of splits
    try:
        df = file_records(spark, path)
        assert spark.read.text(str(path)).rdd.getNumPartitions() > 10
        rows = df.collect()
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", before or "128m")
    got = sorted((r["offset"], r["value"].decode()) for r in rows)
    assert got == list(enumerate(lines))
    assert {(r["topic"], r["partition"]) for r in rows} == {(None, 0)}
