"""The archive query (``jobs.archive``): every event topic to Parquet by source and event
date, each offset exactly once across restarts, and ``backtest --engine spark --archive``
giving the topic backtest's alerts on the same range."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import SparkSession

from app.cli.main import main
from app.events import format_ts, parse_ts
from app.kafka.broker import KafkaBroker
from app.runtime.settings import Settings
from jobs.archive import ArchiveOptions, start
from tests.conformance.threshold_cases import RULES, T0, crafted
from tests.kafka_helpers import produce
from tests.spark.conftest import await_query

pytestmark = [pytest.mark.slow, pytest.mark.integration]

DAY_MS = 86_400_000


def next_day(e: dict[str, Any]) -> dict[str, Any]:
    """The same event a day later from another device: a second date partition."""
    return {**e, "device_id": f"{e['device_id']}-d2", "ts": format_ts(parse_ts(e["ts"]) + DAY_MS)}


def archive_once(spark: SparkSession, settings: Settings, path: Path) -> None:
    await_query(start(spark, settings, ArchiveOptions(once=True, path=str(path))))


T0_MS = int(T0.timestamp() * 1000)
HOUR_MS = 3_600_000
#: invalid records (a string temperature) and where the range [T0 - 1 h, T0 + 1 day) places them
#: before the range, on a day the archive backtest reads
BEFORE_RANGE = {"device_id": "bad-a", "ts": format_ts(T0_MS - 2 * HOUR_MS), "temperature": "hot"}
IN_RANGE = {"device_id": "bad-b", "ts": format_ts(T0_MS + HOUR_MS), "temperature": "hot"}
#: a time with no offset: the decoder refuses it, so its stamp (now) places it; Spark's own
#: try_to_timestamp reads it, and the archive once filed it under 2024-01-01
NO_OFFSET = {"device_id": "bad-d", "ts": "2024-01-01T12:00:00", "temperature": "hot"}
#: an invalid record of another topic in the range: the topic backtests read both topics
LOG_IN_RANGE = {"host": "www-1", "ts": format_ts(T0_MS + 2 * HOUR_MS), "status": "teapot"}


def backtest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, *args: str, engine: str = "spark"
) -> tuple[list[str], str, list[str]]:
    """The output lines, the summary line and the problems (the invalid records named) of one
    backtest of the range."""
    out = tmp_path / f"{name}.jsonl"
    lo, hi = format_ts(T0_MS - HOUR_MS), format_ts(T0_MS + DAY_MS)
    capsys.readouterr()
    argv = [
        "backtest",
        "--engine",
        engine,
        "--rules",
        str(RULES),
        "--from",
        lo,
        "--to",
        hi,
        "--out",
        str(out),
    ]
    assert main([*argv, *args]) == 0
    err = capsys.readouterr().err.splitlines()
    summary = [x.split(": ", 1)[1] for x in err if x.startswith("backtest") and "alert transitions" in x]
    problems = [x for x in err if x.startswith("events.")]
    return out.read_text().splitlines(), summary[-1], problems


def test_archive_writes_each_offset_once_and_backtests_like_the_topic(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    first = [orjson.dumps(e) for e in crafted()]
    later = [orjson.dumps(next_day(e)) for e in crafted()]
    keyed = [(orjson.loads(v)["device_id"].encode(), v) for v in first]
    invalid = [orjson.dumps(e) for e in (BEFORE_RANGE, IN_RANGE, NO_OFFSET)]
    bad = [(b"crafted-1", b"{broken"), *((b"bad", v) for v in invalid)]
    produce(broker.bootstrap, "events.sensors", [*keyed, *bad])
    invalid.append(b"{broken")
    invalid.append(orjson.dumps(LOG_IN_RANGE))
    produce(broker.bootstrap, "events.logs", [(b"www-1", invalid[-1])])
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "APP_DATA_DIR": str(tmp_path)})
    path = tmp_path / "archive"

    archive_once(spark, settings, path)
    archive_once(spark, settings, path)  # a restart with nothing new writes nothing again
    produce(broker.bootstrap, "events.sensors", [(orjson.loads(v)["device_id"].encode(), v) for v in later])
    archive_once(spark, settings, path)  # a restart resumes after the last committed batch

    rows = spark.read.parquet(str(path)).collect()
    offsets = Counter((r["topic"], r["partition"], r["offset"]) for r in rows)
    assert len(rows) == len(first) + len(invalid) + len(later)
    assert max(offsets.values()) == 1, "an offset was archived twice"
    assert {r["value"] for r in rows} == {*first, *invalid, *later}
    dates = {(r["source"], str(r["date"])) for r in rows if r["value"] not in invalid}
    assert dates == {("sensors", "2024-01-01"), ("sensors", "2024-01-02")}
    assert {(r["source"], str(r["date"])) for r in rows if r["value"] == invalid[-1]} == {
        ("logs", "2024-01-01")
    }
    for value in (b"{broken", invalid[2]):  # no ts, or one the decoder refuses: the record's date
        row = next(r for r in rows if r["value"] == value)
        assert row["date"] == row["timestamp"].date(), value
    assert {str(r["date"]) for r in rows if r["value"] in invalid[:2]} == {"2023-12-31", "2024-01-01"}
    assert (path / "source=sensors" / "date=2024-01-02").is_dir()

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
    topics = ("--topic", "events.sensors", "--topic", "events.logs")
    from_archive, archive_summary, archive_problems = backtest(
        tmp_path, capsys, "archive", "--archive", str(path)
    )
    from_topic, topic_summary, topic_problems = backtest(tmp_path, capsys, "topic", *topics)
    faust, faust_summary, faust_problems = backtest(tmp_path, capsys, "faust", *topics, engine="faust")
    assert len(from_archive) >= 4
    assert from_archive == from_topic == faust
    assert not any("-d2" in line for line in from_archive), "the range ends before the second day"
    # the same invalid records in the range, whatever read them: the two whose ts is in it,
    # each named where a consumer finds it, in the same order on both engines
    assert archive_summary == topic_summary == faust_summary
    assert archive_summary.endswith(", 2 invalid lines skipped"), archive_summary
    assert archive_problems == topic_problems == faust_problems
    expected = {
        f"{r['topic']} partition {r['partition']} offset {r['offset']}"
        for r in rows
        if r["value"] in (invalid[1], invalid[-1])
    }
    assert {p.split(": ", 1)[0] for p in faust_problems} == expected, faust_problems
