"""Stream partitions spread over the shuffle partitions: the Python Murmur3 is Spark's, and
Spark itself places the salted stream keys of one stream on distinct partitions."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs.placement import placed, shuffle_partition, spark_hash, unplaced
from jobs.streams import parse_stream_key, stream_key

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a real Spark

TEXTS = ["", "a", "ab", "abc", "abcd", "abcde", "\x00ssensors\x1f0", "é€😀", "logs.by.client_ip\x1f7\x1e99"]


def test_spark_hash_is_sparks_hash(spark: SparkSession) -> None:
    df = spark.createDataFrame([(t,) for t in TEXTS], "t string")
    got = {r["t"]: r["h"] for r in df.select("t", F.hash("t").alias("h")).collect()}
    assert {t: spark_hash(t) for t in TEXTS} == got


@pytest.mark.parametrize("partitions", [2, 3, 4])
def test_one_streams_partitions_run_on_distinct_shuffle_partitions(
    spark: SparkSession, partitions: int
) -> None:
    keys = [stream_key("sensors", p) for p in range(partitions)]
    df = spark.createDataFrame([(k,) for k in keys], "k string").repartition(partitions, "k")
    where = {r["k"]: r["pid"] for r in df.select("k", F.spark_partition_id().alias("pid")).collect()}
    assert sorted(where.values()) == list(range(partitions))
    assert where == {k: shuffle_partition(k, partitions) for k in keys}


def test_the_salt_is_a_function_of_the_key_alone() -> None:
    key = stream_key("logs.by.client_ip", 3)
    assert parse_stream_key(key) == ("logs.by.client_ip", 3)
    assert placed(unplaced(key), "logs.by.client_ip", 3) == key  # computed afresh: the cache is stream_key's
    assert unplaced("no-salt") == "no-salt"
