"""The new ``python -m ingest`` commands as operators run them: subprocesses, signals, exit codes."""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from app import topics
from app.events import parse_ts
from app.kafka.broker import KafkaBroker, free_port
from app.runtime.settings import PROJECT_ROOT
from ingest.cli import main
from ingest.sim.fleet import FleetConfig, fleet_events
from tests.conftest import child_env
from tests.ingest.conftest import udp_port
from tests.kafka_helpers import consume, consume_json

START = "2024-01-01T00:00:00Z"


def _ingest(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ingest", *args],
        cwd=PROJECT_ROOT,
        env=env or child_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )


def _env(broker: KafkaBroker, **extra: str) -> dict[str, str]:
    return child_env(KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, **extra)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(90)
def test_simulate_fleet_publishes_the_seeded_events(broker: KafkaBroker) -> None:
    args = ["simulate", "fleet", "--seed", "42", "--sensors", "3", "--vehicles", "2", "--start", START]
    result = _ingest(*args, "--count", "300", "--fast", env=_env(broker))
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout.splitlines()[-1]) == {
        "published": 300,
        "dlq": 0,
        "topic": topics.SENSORS,
    }
    expected = list(itertools.islice(fleet_events(FleetConfig(42, parse_ts(START), 3, 2)), 300))
    records = consume(broker.bootstrap, topics.SENSORS, min_count=300)
    got = sorted((orjson.loads(r.value) for r in records), key=lambda e: (e["ts"], e["device_id"]))
    assert [{k: v for k, v in e.items() if v is not None} for e in got] == sorted(
        expected, key=lambda e: (e["ts"], e["device_id"])
    )
    assert all(r.key == orjson.loads(r.value)["device_id"].encode() for r in records)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(90)
def test_simulate_ticks_for_a_bounded_event_time(broker: KafkaBroker) -> None:
    args = ["simulate", "ticks", "--seed", "7", "--symbols", "AAPL,IBM", "--start", START, "--duration", "60"]
    result = _ingest(*args, "--fast", env=_env(broker))
    assert result.returncode == 0, result.stderr
    published = orjson.loads(result.stdout.splitlines()[-1])["published"]
    assert 80 < published < 160  # two symbols, one trade per second each on average
    trades = consume_json(broker.bootstrap, topics.FINANCE, min_count=published)
    assert {t["symbol"] for t in trades} == {"AAPL", "IBM"}
    assert max(parse_ts(t["ts"]) for t in trades) < parse_ts(START) + 60_000


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(90)
def test_syslog_sigterm_flushes_and_prints_the_summary(broker: KafkaBroker) -> None:
    port, metrics = udp_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ingest", "syslog", "--udp", f"127.0.0.1:{port}"],
        cwd=PROJECT_ROOT,
        env=_env(broker, APP_METRICS_PORT=str(metrics)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        body = b""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while b'ingest_syslog_received_total{transport="udp"}' not in body:
                assert time.monotonic() < deadline, "the receiver did not count a datagram within 30 s"
                s.sendto(b"<13>1 2024-01-01T00:00:00Z web-1 app - - - ping", ("127.0.0.1", port))
                time.sleep(0.2)
                try:
                    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=2).read()
                except OSError:
                    continue
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    summary = orjson.loads(stdout.splitlines()[-1])
    assert (summary["adapter"], summary["topic"], summary["failed"]) == ("syslog", topics.LOGS, 0)
    assert summary["published"] == summary["udp"] >= 1
    assert len(consume(broker.bootstrap, topics.LOGS, min_count=summary["published"])) == summary["published"]


CLOCK = "1764432000@2013-12-10T12:00:00Z"
GATE = ["--clock-gate", "g.json", "--clock-party", "replay"]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_usage_errors_exit_2_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "devices.csv"
    bad.write_text("device_id,colour\nd1,red\n")
    cases = [
        (
            ["registry", "devices", str(bad), "--dry-run"],
            f"{bad}:1: unknown column 'colour' (column 2 of the header)",
        ),
        (["tail", "x.log", "--format", "applog", "--state", "s.json"], "KAFKA_BOOTSTRAP_SERVERS is not set"),
        (["mqtt", "--map", "a/#/b=temperature"], "'#' may only be the last level"),
        (["syslog", "--udp", "nope"], "expected HOST:PORT or PORT"),
        (["replay", "x.jsonl", "--topic", "events.sensors", "--clock", CLOCK], "give --speedup too"),
        (["simulate", "fleet", "--seed", "1", "--fast", "--clock", CLOCK], "cannot be used with --fast"),
        (["simulate", "ticks", "--seed", "1", "--clock", "noon"], "--clock: expected WALL@TIME"),
        (["simulate", "ticks", "--seed", "1", "--clock", "1@noon"], "'--clock' is not an RFC 3339 timestamp"),
        (
            ["simulate", "ticks", "--seed", "1", "--clock-gate", "g.json"],
            "--clock-gate and --clock-party go together",
        ),
        (
            ["simulate", "ticks", "--clock", CLOCK, "--clock-gate", "g.json"],
            "not allowed with argument --clock",
        ),
        (
            ["replay", "x.jsonl", "--topic", "events.sensors", "--clock-gate", "g", "--clock-party", "r"],
            "--speedup too",
        ),
    ]
    for args, message in cases:
        result = _ingest(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert message.encode() in result.stderr, (args, result.stderr)


def test_registry_dry_run_and_convert_log_need_no_kafka(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text("- device_id: d1\n  max_temp: 30\n")
    assert main(["registry", "devices", str(devices), "--delete", "d9", "--dry-run"]) == 0
    lines = [orjson.loads(x) for x in capsysbinary.readouterr().out.splitlines()]
    assert lines == [
        {"key": "d1", "value": {"device_id": "d1", "max_temp": 30.0}},
        {"key": "d9", "value": None},
    ]
    log = tmp_path / "error.log"
    log.write_text("[Sun Mar 07 16:02:00 2004] [error] [client 1.2.3.4] denied\nnonsense\n")
    assert main(["convert", "log", str(log), "--format", "apache-error", "--host", "w1"]) == 1
    out = capsysbinary.readouterr()
    assert orjson.loads(out.out)["client_ip"] == "1.2.3.4"
    assert f"{log}:2: expected '[Www Mmm dd".encode() in out.err
