"""The streaming plan does its per-record work once per record.

Spark's optimizer copies an expression wherever it substitutes a column by its definition:
a filter it infers and pushes below a projection, a projection merged into the next. Each
copy then runs for every record. These tests read the physical plan of the decode and of
the task rows over the windowed bench pack's conditions and count the expensive calls."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from app.events import SCHEMAS
from app.rules.loader import load_rules
from app.topics import SOURCE_OF_TOPIC
from jobs.compile import SparkPlan, plan_rules, tasks
from jobs.decode import Decoder
from jobs.fastdecode import decode
from jobs.streams import router

pytestmark = [pytest.mark.integration]  # a real Spark

#: three native conditions on one field of one source, as in ``bench/bench_spark.py``'s pack
RULES = """
engine: spark
rules:
  - id: minute-avg
    source: sensors
    group_by: [device_id]
    window: {type: tumbling, size: 1m}
    aggregate: {avg_t: avg(temperature)}
    having: avg_t > 105
  - id: hot-share
    source: sensors
    where: temperature > 90
    group_by: [device_id]
    window: {type: hopping, size: 2m, advance: 1m}
    aggregate: {n: count(*)}
    having: n >= 60
  - id: busy-session
    source: sensors
    where: temperature > 100
    group_by: [device_id]
    window: {type: session, gap: 5s}
    aggregate: {n: count(*)}
    having: n >= 30
  - {id: overheat, source: sensors, where: temperature > 99, for: 10m, group_by: [device_id]}
"""

RECORDS = [
    '{"device_id":"d-1","ts":"2024-01-01T00:00:00.000Z","temperature":101.5}',
    '{"device_id":"d-2","ts":"2024-01-01T00:00:01.000Z","temperature":20.25,"status":"ok"}',
    '{"device_id":"d-1", "ts":"2024-01-01T00:00:02Z","temperature":95}',  # the Python decoder's
    "{not json",
]


def pack(tmp_path: Path) -> SparkPlan:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return plan_rules(load_rules([path]))


def decoded(spark: SparkSession, plan: SparkPlan, *, native: bool = True) -> DataFrame:
    """The live query's decode of ``RECORDS`` (topic given, each record's own partition); in
    the JVM where it can be (``APP_SPARK_DECODE=jvm``), else by the Python decoder alone."""
    rows = [("events.sensors", i % 2, i, r.encode()) for i, r in enumerate(RECORDS)]
    raw = spark.createDataFrame(rows, "topic string, partition int, offset long, value binary")
    routes = router(plan.streams, 2, record_partitions=True)
    return decode(raw, Decoder(topics=SOURCE_OF_TOPIC, router=routes), native=native)


def physical(df: DataFrame, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    df.explain()
    return capsys.readouterr().out


@pytest.mark.parametrize("native", [False, True], ids=["python-decode", "jvm-decode"])
def test_the_conditions_parse_each_record_once(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], native: bool
) -> None:
    """With ``explode`` Spark inferred ``size(tasks) > 0``, pushed it below the projection that
    parses the record, and parsed it again for each condition there: four ``from_json`` here."""
    plan = pack(tmp_path)
    out = tasks(decoded(spark, plan, native=native), plan)
    assert physical(out, capsys).count("from_json(") == 1
    rows = out.collect()
    # one stream task per valid record (the topic-key stream), one DLQ task for the bad one
    assert sorted((r["__offset"], r["__key"] is not None, r["__dlq"] is None) for r in rows) == [
        (0, True, True), (1, True, True), (2, True, True), (3, True, False),
    ]  # fmt: skip
    # the conditions in the pack's order: temperature > 90, > 100, > 99
    conds = {r["__offset"]: r["__conds"] for r in rows}
    assert (conds[0], conds[1], conds[2]) == ([True, True, True], [False, False, False], [True, False, False])


def test_the_decode_matches_each_pattern_and_extracts_the_names_once(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each source's pattern is in the plan twice: to infer a record's source without a topic,
    and to recognise a record of that source. Inlined in the three columns that read whether a
    record was recognised, the recognition ran two or three times per record."""
    plan = pack(tmp_path)
    text = physical(decoded(spark, plan), capsys)
    assert text.count("RLIKE(") == 2 * len(SCHEMAS)
    assert text.count("regexp_extract_all(") == 1
