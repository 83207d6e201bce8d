"""The geo UDFs are called only on the rows that can give a value (``jobs.udfs.guarded``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DoubleType

from app.rules.spark_sql import UDF_NAMES, to_spark_sql
from jobs import udfs

SCHEMA = {"lat": "double", "lon": "double", "r": "double"}
TEXTS = [
    "distance_km(lat, lon, 52.52, 13.405) > 300",
    "distance_km(lat, lon, 52.52, 13.405) < 400 or r > 10",  # the same call again, and a NULL-tolerant OR
    "inside_radius(lat, lon, 48.85, 2.35, distance_km(lat, lon, 0, 0) / 10)",  # a call inside a call
    "distance_km(lat, lon, null, 0) is null",
]
ROWS = [
    (0, 52.52, 13.405, 1.0),
    (1, 48.85, 2.35, None),
    (2, None, 13.4, 20.0),
    (3, 50.0, None, 5.0),
    (4, None, None, None),
    (5, -33.87, 151.21, 0.0),
]


@pytest.fixture
def strict_udfs(spark: SparkSession) -> Iterator[None]:
    """The geo UDFs, failing on a NULL argument: a guarded call must never get one."""

    def strict(name: str) -> Any:
        real = udfs.python_function(name)

        def call(*args: Any) -> Any:
            if any(a is None for a in args):
                msg = f"{name} called with a NULL argument: {args}"
                raise AssertionError(msg)
            return real(*args)

        return call

    spark.udf.register(UDF_NAMES["distance_km"], strict("distance_km"), DoubleType())
    spark.udf.register(UDF_NAMES["inside_radius"], strict("inside_radius"), BooleanType())
    try:
        yield
    finally:
        udfs.register(spark)


def test_guarded_calls_give_the_unguarded_values(spark: SparkSession) -> None:
    df = spark.createDataFrame(ROWS, "id int, lat double, lon double, r double")
    exprs = [to_spark_sql(t, SCHEMA) for t in TEXTS]
    plain = {r["id"]: tuple(r)[1:] for r in df.select("id", *(F.expr(e.sql) for e in exprs)).collect()}
    guarded, sqls = udfs.guarded(df, [e.sql for e in exprs], [c for e in exprs for c in e.calls])
    assert all(name not in s for s in sqls for name in UDF_NAMES.values())  # columns, not calls
    got = {r["id"]: tuple(r)[1:] for r in guarded.select("id", *(F.expr(s) for s in sqls)).collect()}
    assert got == plain
    assert plain[0][:2] == (False, True) and plain[2][:2] == (None, True)
    assert plain[4] == (None, None, None, True)


def test_no_guarded_call_gets_a_null_argument(spark: SparkSession, strict_udfs: None) -> None:
    del strict_udfs
    df = spark.createDataFrame(ROWS, "id int, lat double, lon double, r double")
    one = to_spark_sql(TEXTS[0], SCHEMA)
    with pytest.raises(Exception, match="NULL argument"):  # unguarded, Spark calls it on every row
        df.select(F.expr(one.sql)).collect()
    guarded, (sql,) = udfs.guarded(df, [one.sql], one.calls)
    assert sorted(r[0] for r in guarded.where(F.expr(sql).isNull()).select("id").collect()) == [2, 3, 4]
