"""``python -m ingest`` as a subprocess, as the supervisor and operators run it."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from app import topics
from app.kafka.broker import KafkaBroker, free_port
from app.kafka.clients import end_offsets
from app.runtime.settings import PROJECT_ROOT
from tests.conftest import APACHE_LOG, NAB_MACHINE_TEMP, child_env, require_dataset
from tests.kafka_helpers import consume

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _ingest(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ingest", *args],
        cwd=PROJECT_ROOT,
        env=env or child_env(),
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def _broker_env(broker: KafkaBroker, **extra: str) -> dict[str, str]:
    return child_env(KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, **extra)


@pytest.mark.timeout(90)
def test_convert_nab_writes_one_event_per_row(tmp_path: Path) -> None:
    path = require_dataset(NAB_MACHINE_TEMP)
    out = tmp_path / "nab.jsonl"
    result = _ingest(
        "convert", "nab", str(path), "--device", "m1", "--field", "temperature", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    lines = out.read_bytes().splitlines()
    assert len(lines) == 22_695
    assert orjson.loads(lines[0]) == {
        "device_id": "m1",
        "ts": "2013-12-02T21:15:00.000Z",
        "temperature": 73.96732207,
    }


@pytest.mark.timeout(90)
def test_convert_apache_reports_bad_lines_and_exits_1() -> None:
    path = require_dataset(APACHE_LOG)
    result = _ingest("convert", "apache", str(path), "--host", "www")
    assert result.returncode == 1
    assert len(result.stdout.splitlines()) == 9_999
    assert f"{path}:8899: user agent is not a quoted string".encode() in result.stderr


@pytest.mark.timeout(30)
def test_bad_field_and_missing_bootstrap_are_usage_errors(tmp_path: Path) -> None:
    result = _ingest("convert", "nab", "x.csv", "--device", "d", "--field", "status")
    assert result.returncode == 2
    assert b"not a numeric field of the sensors schema" in result.stderr
    result = _ingest("replay", str(tmp_path / "x.jsonl"), "--topic", topics.SENSORS)
    assert result.returncode == 2
    assert b"KAFKA_BOOTSTRAP_SERVERS is not set; start the system with `make run`" in result.stderr


@pytest.mark.timeout(30)
def test_shift_to_needs_from_and_excludes_live(tmp_path: Path) -> None:
    """``--shift-to T`` moves ``--from``'s time to T: without ``--from`` there is no offset a
    resumed run could keep, and ``--live`` is another shift."""
    args = ("replay", str(tmp_path / "x.csv"), "--topic", topics.SENSORS, "--format", "nab")
    result = _ingest(*args, "--shift-to", "2013-12-10T12:00:00Z")
    assert result.returncode == 2
    assert b"--shift-to T moves --from's time to T: give --from too" in result.stderr
    result = _ingest(*args, "--shift-to", "2013-12-10T12:00:00Z", "--from", "2014-01-01T00:00:00Z", "--live")
    assert result.returncode == 2
    assert b"not allowed with argument --shift-to" in result.stderr
    result = _ingest(*args, "--shift-to", "yesterday", "--from", "2014-01-01T00:00:00Z")
    assert result.returncode == 2
    assert b"argument --shift-to: the time is not an RFC 3339 timestamp: 'yesterday'" in result.stderr


@pytest.mark.timeout(90)
def test_replay_cli_prints_the_summary(broker: KafkaBroker) -> None:
    path = require_dataset(NAB_MACHINE_TEMP)
    args = ["replay", str(path), "--topic", topics.SENSORS, "--format", "nab"]
    result = _ingest(
        *args, "--device", "m1", "--field", "temperature", "--limit", "500", env=_broker_env(broker)
    )

    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout.splitlines()[-1]) == {
        "published": 500,
        "dlq": 0,
        "topic": "events.sensors",
    }
    assert len(consume(broker.bootstrap, topics.SENSORS, min_count=500)) == 500


@pytest.mark.timeout(90)
def test_sigterm_stops_cleanly_and_what_was_reported_is_on_the_topic(broker: KafkaBroker) -> None:
    path = require_dataset(NAB_MACHINE_TEMP)
    port = free_port()
    args = ["replay", str(path), "--topic", topics.SENSORS, "--format", "nab", "--device", "m1"]
    # 5-minute gaps at speed-up 3000: one event per 0.1 s, the whole file would take 38 min
    proc = subprocess.Popen(
        [sys.executable, "-m", "ingest", *args, "--field", "value", "--speedup", "3000"],
        cwd=PROJECT_ROOT,
        env=_broker_env(broker, APP_METRICS_PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while asyncio.run(end_offsets(broker.bootstrap, [topics.SENSORS]))[topics.SENSORS] < 5:
            assert time.monotonic() < deadline, "replay published nothing within 30 s"
            time.sleep(0.1)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b'ingest_accepted_total{adapter="nab",source="sensors"}' in metrics
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    summary = orjson.loads(stdout.splitlines()[-1])
    assert summary["topic"] == topics.SENSORS
    assert 5 <= summary["published"] < 22_695
    records = consume(broker.bootstrap, topics.SENSORS, min_count=summary["published"])
    assert len(records) == summary["published"]
