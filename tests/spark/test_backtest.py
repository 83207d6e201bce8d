"""``jobs.backtest``'s raw records: numbered in the JVM, in file order, across splits; and the
task rows it leaves to the evaluator."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from pyspark.sql import SparkSession

from app.backtest import BacktestReport
from app.events import dlq_record
from app.rules.loader import load_rules
from jobs.backtest import (
    file_records,
    in_output_order,
    lifecycle_tasks,
    ordered_records,
    record_places,
    report_rows,
)
from jobs.compile import DLQ_KEY, plan_rules
from jobs.decode import DECODED_SCHEMA
from jobs.streams import stream_key
from jobs.transitions import AT_EVENT

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
    # every line but the blank one, which is skipped (as by the Faust backtest) and keeps its number
    assert got == [(i, line) for i, line in enumerate(lines) if line]
    assert len(got) == len(lines) - 1
    assert {(r["topic"], r["partition"]) for r in rows} == {(None, 0)}


WINDOW_RULE = """\
rules:
  - id: hourly-avg
    source: sensors
    where: temperature > 0
    group_by: [device_id]
    window: {type: tumbling, size: 1h}
    aggregate: {avg_t: avg(temperature)}
    having: avg_t > 90
"""


def test_the_evaluator_gets_no_task_on_an_idle_stream_key_and_every_invalid_record(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A stream key is idle where every rule of its stream runs natively. Its tasks are left
    out; when every key is idle only the invalid records' tasks remain (their dead-letter
    rows)."""
    path = tmp_path / "rules.yaml"
    path.write_text(WINDOW_RULE)
    plan = plan_rules(load_rules([path]), keyed_path=False, every_rule=True)
    keys = [stream_key(s.name, p) for s in plan.streams for p in range(2)]
    assert len(keys) == 2
    event = '{"device_id":"%s","ts":"2026-01-01T00:00:0%d.000Z","temperature":1.5}'
    rows = [
        ("sensors", 0, 0, 1_000, event % ("a", 1), None, [keys[0]], None),
        ("sensors", 1, 0, 2_000, event % ("b", 2), None, [keys[1]], None),
        ("sensors", 0, 1, None, None, '{"reason": "bad ts"}', None, None),
    ]  # a file's lines: no arrival
    decoded = spark.createDataFrame(rows, DECODED_SCHEMA)

    def left(idle: set[str]) -> list[tuple[str, int, int]]:
        got = lifecycle_tasks(decoded, plan, idle, 2).collect()
        return sorted((r["__key"], r["__part"], r["__offset"]) for r in got)

    assert left(set()) == sorted([(keys[0], 0, 0), (keys[1], 1, 0), (DLQ_KEY, 0, 1)])
    assert left({keys[0]}) == sorted([(keys[1], 1, 0), (DLQ_KEY, 0, 1)])
    assert left(set(keys)) == [(DLQ_KEY, 0, 1)]


def test_the_output_rows_are_sorted_on_the_driver_as_sparks_order_by_sorts_them(spark: SparkSession) -> None:
    """``in_output_order`` replaces a global ``orderBy`` (whose sampling job ran the whole plan a
    second time): NULL first in every column, strings by code point, past the ASCII range too."""
    schema = "part int, offset bigint, __r int, __ph int, __due bigint, __key string, __seq int, n int"
    values = [
        (0, 5, 1, 2, 0, "b", 0),
        (0, 5, 1, 2, 0, "a", 1),
        (0, 5, 1, 2, 0, "a", 0),
        (0, 5, 1, 1, 9, "z", 0),
        (0, 5, 0, 2, 0, "z", 0),
        (0, 4, 3, 0, 0, "é", 0),
        (0, 4, 3, 0, 0, "z", 0),
        (0, 4, 3, 0, 0, "\U0001f600", 0),
        (0, 4, 3, 0, 0, "\uffff", 0),
        (None, None, None, None, None, None, None),
        (1, 0, 0, 0, 0, "", 0),
        (0, None, 0, 0, 0, "", 0),
        (0, 4, 3, 0, None, "a", 0),
    ]
    df = spark.createDataFrame([(*v, i) for i, v in enumerate(values)], schema)
    by_spark = [r["n"] for r in df.orderBy("part", "offset", *AT_EVENT).collect()]
    assert [r["n"] for r in in_output_order(df.collect())] == by_spark
    assert by_spark[0] == 9 and by_spark[-1] == 10


def test_a_ranges_invalid_records_are_named_where_a_consumer_finds_them_before_its_refusals(
    spark: SparkSession,
) -> None:
    """A topic or archive range's dead letter is named by topic, partition and offset (its
    position in the range's order is no place an operator can look up), as by the Faust
    engine, and the range's dead letters come before its refusals, as the Faust engine lists
    them; a file's keep ``FILE:LINE`` in line order."""
    records = spark.createDataFrame(
        [
            (datetime(2024, 1, 1, 0, 0, 1, tzinfo=UTC), "events.sensors", 1, 7, b"x"),
            (datetime(2024, 1, 1, 0, 0, 0, tzinfo=UTC), "events.logs", 0, 3, b"y"),
            (datetime(2024, 1, 1, 0, 0, 1, tzinfo=UTC), "events.logs", 2, 9, b"z"),
        ],
        "timestamp timestamp, topic string, partition int, offset bigint, value binary",
    )
    # the order: record time, then topic, partition, offset
    ordered = ordered_records(spark, records).collect()
    assert sorted((r["offset"], bytes(r["value"])) for r in ordered) == [(0, b"y"), (1, b"z"), (2, b"x")]
    assert record_places(records, [2, 0]) == {
        0: ("events.logs partition 0 offset 3", b"y"),
        2: ("events.sensors partition 1 offset 7", b"x"),
    }

    def letter(reason: str, raw: bytes) -> bytes:  # a dead-letter record of the payload raw
        return dlq_record("sensors", reason, raw, adapter="spark-engine")

    refused = {
        "raw": orjson.dumps({"device_id": "d1", "ts": "2030-01-01T00:00:00Z"}).decode(),
        "reason": "too far",
    }
    rows = [
        {"kind": "dlq", "offset": 0, "value": letter("bad", b"y")},
        {"kind": "refused", "offset": 1, "value": orjson.dumps(refused)},
        {"kind": "dlq", "offset": 2, "value": letter("worse", b"x")},
    ]
    ranged = BacktestReport()
    report_rows(rows, io.StringIO(), ranged, "r", lines=False, places=lambda pos: record_places(records, pos))
    assert ranged.problems == [
        "events.logs partition 0 offset 3: bad",
        "events.sensors partition 1 offset 7: worse",
        "refused d1 at 2030-01-01T00:00:00Z: too far",
    ]
    assert (ranged.skipped, ranged.refused) == (2, 1)
    # a record that is not the dead letter at its place (the topic grew with an earlier stamp
    # between the two reads) is named by its place in the range, never by another's offset
    moved = BacktestReport()
    stale = [{**rows[0], "value": letter("bad", b"not y")}, rows[2]]
    report_rows(stale, io.StringIO(), moved, "r", lines=False, places=lambda pos: record_places(records, pos))
    assert moved.problems == ["r record 1: bad", "events.sensors partition 1 offset 7: worse"]
    # a payload kept in part (a dead letter larger than a record may be) is matched by its start
    cut = dlq_record("sensors", "big", b"x" * 5000, adapter="spark-engine", max_bytes=1000)
    assert orjson.loads(cut)["truncated"]
    big = spark.createDataFrame(
        [(datetime(2024, 1, 1, tzinfo=UTC), "events.sensors", 0, 42, b"x" * 5000)],
        "timestamp timestamp, topic string, partition int, offset bigint, value binary",
    )
    whole = BacktestReport()
    big_rows = [{"kind": "dlq", "offset": 0, "value": cut}]
    report_rows(big_rows, io.StringIO(), whole, "r", lines=False, places=lambda pos: record_places(big, pos))
    assert whole.problems == ["events.sensors partition 0 offset 42: big"]
    filed = BacktestReport()
    report_rows(rows, io.StringIO(), filed, "in.jsonl")
    assert filed.problems == [
        "in.jsonl:1: bad",
        "refused d1 at 2030-01-01T00:00:00Z: too far",
        "in.jsonl:3: worse",
    ]
