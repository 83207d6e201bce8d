"""Replay through the Python API against the real embedded broker."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from app import topics
from app.events import parse_ts
from app.runtime.settings import Settings
from ingest.adapters import apache_events, jsonl_lines, nab_events
from ingest.model import IngestArgError
from ingest.replay import ReplayOptions, ReplaySummary, open_input, replay, source_for_topic
from tests.conftest import APACHE_LOG, NAB_MACHINE_TEMP, require_dataset
from tests.kafka_helpers import consume

MALFORMED = b'{"device_id": "d9", "ts": "2014-01-01T00:00:00Z", "temperature": '
WRONG_TYPE = b'{"device_id": "d9", "ts": "2014-01-01T00:00:00Z", "temperature": "warm"}'


def _jsonl(path: Path, events: list[dict[str, object]], bad: tuple[bytes, ...] = ()) -> str:
    """Write ``events`` as JSON lines, with the ``bad`` lines interleaved after the third."""
    lines = [orjson.dumps(e) for e in events]
    for i, raw in enumerate(bad):
        lines.insert(3 + 2 * i, raw)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def _readings(n: int, step_s: int = 300) -> list[dict[str, object]]:
    start = datetime(2014, 1, 1, tzinfo=UTC).timestamp()
    return [
        {
            "device_id": f"dev-{i % 4}",
            "ts": datetime.fromtimestamp(start + i * step_s, tz=UTC).isoformat(),
            "temperature": float(i),
        }
        for i in range(n)
    ]


def _run(settings: Settings, items: object, topic: str, adapter: str, **options: object) -> ReplaySummary:
    opts = ReplayOptions(**options)  # type: ignore[arg-type]
    return asyncio.run(replay(settings, items, topic=topic, adapter=adapter, options=opts))  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_jsonl_replay_keys_events_and_dead_letters_bad_lines(settings: Settings, tmp_path: Path) -> None:
    events = _readings(40)
    path = _jsonl(tmp_path / "in.jsonl", events, (MALFORMED, WRONG_TYPE))

    summary = _run(settings, jsonl_lines(path), topics.SENSORS, "jsonl")

    assert (summary.published, summary.dlq, summary.failed) == (40, 2, 0)
    records = consume(settings.bootstrap_servers, topics.SENSORS, min_count=40)
    assert len(records) == 40
    assert all(r.key == orjson.loads(r.value)["device_id"].encode() for r in records)
    assert sorted(orjson.loads(r.value)["temperature"] for r in records) == [float(i) for i in range(40)]
    dlq = [orjson.loads(r.value) for r in consume(settings.bootstrap_servers, topics.DLQ, min_count=2)]
    assert [d["raw"].encode() for d in dlq] == [MALFORMED, WRONG_TYPE]
    assert "not valid JSON" in dlq[0]["reason"]
    assert dlq[1]["field"] == "temperature"
    assert all(d["source"] == "sensors" and d["adapter"] == "jsonl" for d in dlq)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(120)
def test_real_apache_log_unparseable_line_reaches_the_dlq(settings: Settings) -> None:
    path = require_dataset(APACHE_LOG)
    summary = _run(settings, apache_events(str(path), host="www"), topics.LOGS, "apache")

    assert (summary.published, summary.dlq) == (9_999, 1)
    (dead,) = [orjson.loads(r.value) for r in consume(settings.bootstrap_servers, topics.DLQ, min_count=1)]
    assert dead["reason"].startswith("line 8899: user agent")
    assert dead["raw"].startswith("46.118.127.106 - - [20/May/2015:12:05:17 +0000]")
    assert len(consume(settings.bootstrap_servers, topics.LOGS, min_count=9_999)) == 9_999


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_limit_bounds_the_events_published(settings: Settings) -> None:
    path = require_dataset(NAB_MACHINE_TEMP)
    items = nab_events(str(path), device="machine-1", field="temperature")
    summary = _run(settings, items, topics.SENSORS, "nab", limit=250)

    assert (summary.published, summary.dlq, summary.interrupted) == (250, 0, False)
    records = consume(settings.bootstrap_servers, topics.SENSORS, min_count=250)
    assert len(records) == 250
    assert {r.key for r in records} == {b"machine-1"}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_speedup_waits_for_scaled_event_time_gaps(settings: Settings, tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "slow.jsonl", _readings(4, step_s=10))

    started = time.monotonic()
    summary = _run(settings, jsonl_lines(path), topics.SENSORS, "jsonl", speedup=100.0)
    elapsed = time.monotonic() - started

    assert summary.published == 4
    assert elapsed >= 0.25  # three 10 s gaps / 100


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_live_rebases_the_first_event_to_now(settings: Settings, tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "live.jsonl", _readings(3, step_s=300))
    before = time.time_ns() // 1_000_000
    summary = _run(settings, jsonl_lines(path), topics.SENSORS, "jsonl", live=True)

    assert summary.published == 3
    values = [orjson.loads(r.value) for r in consume(settings.bootstrap_servers, topics.SENSORS, min_count=3)]
    stamps = sorted(parse_ts(v["ts"]) for v in values)
    assert before - 1000 <= stamps[0] <= time.time_ns() // 1_000_000
    assert [b - a for a, b in itertools.pairwise(stamps)] == [300_000, 300_000]


def test_topic_decides_the_source_and_format_must_match() -> None:
    assert source_for_topic(topics.LOGS) == "logs"
    with pytest.raises(IngestArgError, match=r"events\.sensors"):
        source_for_topic("alerts")
    with pytest.raises(IngestArgError, match="produces sensors events"):
        open_input("x.csv", "nab", "logs", device="d", field="value", host=None)
    with pytest.raises(IngestArgError, match="needs --host"):
        open_input("x.log", "apache", "logs", device=None, field=None, host=None)
    with pytest.raises(IngestArgError, match="--host does not apply"):
        open_input("x.jsonl", "jsonl", "logs", device=None, field=None, host="h")
    with pytest.raises(IngestArgError, match="--kind does not apply"):
        open_input("x.jsonl", "jsonl", "sensors", device=None, field=None, host=None, kind="temperature")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_rate_caps_events_per_second(settings: Settings, tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "rate.jsonl", _readings(40, step_s=1))

    started = time.monotonic()
    summary = _run(settings, jsonl_lines(path), topics.SENSORS, "jsonl", rate=200.0)
    elapsed = time.monotonic() - started

    assert summary.published == 40
    assert elapsed >= 39 / 200
