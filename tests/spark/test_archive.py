"""The archive query (``jobs.archive``): every event topic to Parquet by source and event
date, each offset exactly once across restarts, and ``backtest --engine spark --archive``
giving the topic backtest's alerts on the same range."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
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


def backtest(tmp_path: Path, name: str, *args: str) -> list[str]:
    out = tmp_path / f"{name}.jsonl"
    lo, hi = (
        format_ts(int((T0 - timedelta(hours=1)).timestamp() * 1000)),
        format_ts(int(T0.timestamp() * 1000) + DAY_MS),
    )
    argv = [
        "backtest",
        "--engine",
        "spark",
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
    return out.read_text().splitlines()


def test_archive_writes_each_offset_once_and_backtests_like_the_topic(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = [orjson.dumps(e) for e in crafted()]
    later = [orjson.dumps(next_day(e)) for e in crafted()]
    keyed = [(orjson.loads(v)["device_id"].encode(), v) for v in first]
    produce(broker.bootstrap, "events.sensors", [*keyed, (b"crafted-1", b"{broken")])
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "APP_DATA_DIR": str(tmp_path)})
    path = tmp_path / "archive"

    archive_once(spark, settings, path)
    archive_once(spark, settings, path)  # a restart with nothing new writes nothing again
    produce(broker.bootstrap, "events.sensors", [(orjson.loads(v)["device_id"].encode(), v) for v in later])
    archive_once(spark, settings, path)  # a restart resumes after the last committed batch

    rows = spark.read.parquet(str(path)).collect()
    offsets = Counter((r["topic"], r["partition"], r["offset"]) for r in rows)
    assert len(rows) == len(first) + 1 + len(later)
    assert max(offsets.values()) == 1, "an offset was archived twice"
    assert {r["value"] for r in rows} == {*first, b"{broken", *later}
    dates = {(r["source"], str(r["date"])) for r in rows if r["value"] != b"{broken"}
    assert dates == {("sensors", "2024-01-01"), ("sensors", "2024-01-02")}
    broken = next(r for r in rows if r["value"] == b"{broken")
    assert broken["date"] == broken["timestamp"].date(), "no ts: the record's date"
    assert (path / "source=sensors" / "date=2024-01-02").is_dir()

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
    from_archive = backtest(tmp_path, "archive", "--archive", str(path))
    from_topic = backtest(tmp_path, "topic", "--topic", "events.sensors")
    assert len(from_archive) >= 4
    assert from_archive == from_topic
    assert not any("-d2" in line for line in from_archive), "the range ends before the second day"
