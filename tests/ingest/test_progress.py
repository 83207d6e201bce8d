"""Resumable replays and simulators: the progress file, skip-exactly-N, limits over runs."""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import orjson
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from app import topics
from app.events import parse_ts
from app.kafka.broker import KafkaBroker
from app.kafka.clients import end_offsets
from app.runtime.settings import PROJECT_ROOT, Settings
from ingest.progress import OtherInputError, Progress, ProgressError, ProgressFile
from ingest.replay import Line, ReplayInput, ReplayOptions, ReplaySummary, open_input, replay
from ingest.sim.fleet import FleetConfig, fleet_events
from ingest.sim.ticks import TickConfig, tick_events
from tests.conftest import NAB_MACHINE_TEMP, child_env, make_settings, require_dataset
from tests.ingest.conftest import Mosquitto
from tests.kafka_helpers import consume, consume_json

IDENTITY = {"command": "replay", "file": "in.jsonl"}
START = "2024-01-01T00:00:00Z"


def _readings(n: int) -> list[bytes]:
    start = datetime(2014, 1, 1, tzinfo=UTC).timestamp()
    return [
        orjson.dumps(
            {
                "device_id": "dev-1",
                "ts": datetime.fromtimestamp(start + 300 * i, tz=UTC).isoformat(),
                "temperature": float(i),
            }
        )
        for i in range(n)
    ]


def _replay(settings: Settings, items: object, file: ProgressFile, **options: object) -> ReplaySummary:
    opts = ReplayOptions(progress=file, checkpoint_s=0.0, **options)  # type: ignore[arg-type]
    return asyncio.run(replay(settings, items, topic=topics.SENSORS, adapter="jsonl", options=opts))  # type: ignore[arg-type]


def _temperatures(bootstrap: str, n: int) -> list[float]:
    return sorted(
        e["temperature"] for e in consume_json(bootstrap, topics.SENSORS, min_count=n, timeout_s=10)
    )


def test_progress_round_trips_and_a_missing_file_is_the_start(tmp_path: Path) -> None:
    file = ProgressFile(tmp_path / "ingest" / "replay.json", IDENTITY)
    assert file.load() == Progress(0, 0, False)

    file.save(Progress(12, 10, False))

    assert file.load() == Progress(12, 10, False)
    assert ProgressFile.stored_input(file.path) == IDENTITY
    assert not list(file.path.parent.glob(".*.tmp"))  # the temporary file was renamed
    assert Progress(12, 10).done(limit=10) and not Progress(12, 10).done(limit=11)
    assert Progress(12, 10, finished=True).done(limit=None)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "cannot read the progress file"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"version": 2, "input": {}, "consumed": 1, "sent": 1, "finished": false}', "version 2"),
        (b'{"version": 1, "input": {}, "consumed": -1, "sent": 0, "finished": false}', "'consumed' must be"),
        (b'{"version": 1, "input": {}, "consumed": 1, "sent": "1", "finished": false}', "'sent' must be"),
        (b'{"version": 1, "input": {}, "consumed": 1, "sent": 2, "finished": false}', "exceeds 'consumed'"),
        (b'{"version": 1, "input": {}, "consumed": 1, "sent": 1, "finished": 0}', "'finished' must be"),
    ],
)
def test_a_corrupt_progress_file_is_an_error_naming_the_file(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "replay-sensors.json"
    path.write_bytes(content)

    with pytest.raises(ProgressError, match=problem) as caught:
        ProgressFile(path, IDENTITY).load()

    assert str(caught.value).startswith(f"{path}: ")
    assert "--fresh" in str(caught.value)


def test_a_progress_file_of_another_input_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    ProgressFile(path, {"command": "replay", "file": "a.csv"}).save(Progress(5, 5))

    with pytest.raises(OtherInputError, match=r"p\.json: the progress file was written for another input"):
        ProgressFile(path, {"command": "replay", "file": "b.csv"}).load()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_resume_skips_exactly_what_was_sent_and_the_limit_counts_over_runs(
    settings: Settings, tmp_path: Path
) -> None:
    lines = _readings(30)
    file = ProgressFile(tmp_path / "p.json", IDENTITY)

    first = _replay(settings, lines, file, limit=10)
    second = _replay(settings, lines, file, limit=25)

    assert (first.published, first.skipped) == (10, 0)
    assert (second.published, second.skipped) == (15, 10)
    assert file.load() == Progress(25, 25, finished=False)
    assert _temperatures(settings.bootstrap_servers, 25) == [float(i) for i in range(25)]

    third = _replay(settings, lines, file)  # no limit: the rest of the input, then finished

    assert (third.published, third.skipped) == (5, 25)
    assert file.load() == Progress(30, 30, finished=True)
    assert (
        third.to_json()
        == b'{"published":5,"dlq":0,"topic":"events.sensors","skipped":25,"sent_total":30,"finished":true}'
    )
    assert _temperatures(settings.bootstrap_servers, 30) == [float(i) for i in range(30)]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_shifted_replay_resumes_on_its_axis_and_dead_letters_a_time_shifted_past_2100(
    settings: Settings, tmp_path: Path
) -> None:
    """``--shift-to`` (a fixed ``shift_ms``): the run that resumes after the first 10 readings
    moves them by the same offset, not by one taken from its own first event; the last reading,
    moved to 2100, goes to the dead-letter topic with its reason, and nothing is lost."""
    lines = _readings(30)
    stamps = [parse_ts(orjson.loads(line)["ts"]) for line in lines]
    shift_ms = parse_ts("2099-12-31T23:55:00Z") + 300_000 - stamps[-1]  # the last to 2100-01-01
    file = ProgressFile(tmp_path / "p.json", IDENTITY)

    first = _replay(settings, lines, file, limit=10, shift_ms=shift_ms)
    second = _replay(settings, lines, file, shift_ms=shift_ms)

    assert (first.published, second.published, second.skipped, second.dlq) == (10, 19, 10, 1)
    assert file.load() == Progress(30, 29, finished=True)
    sent = consume_json(settings.bootstrap_servers, topics.SENSORS, min_count=29, timeout_s=10)
    assert sorted(parse_ts(e["ts"]) for e in sent) == [t + shift_ms for t in stamps[:29]]
    (dead,) = consume_json(settings.bootstrap_servers, topics.DLQ, min_count=1, timeout_s=10)
    assert dead["field"] == "ts"
    assert "moved to 2100-01-01T00:00:00.000Z is outside 1970..2100" in dead["reason"]
    assert orjson.loads(dead["raw"]) == orjson.loads(lines[-1])


@pytest.mark.timeout(10)
def test_a_finished_replay_returns_at_once_without_a_broker(tmp_path: Path) -> None:
    file = ProgressFile(tmp_path / "p.json", IDENTITY)
    file.save(Progress(30, 28, finished=True))
    nowhere = make_settings(tmp_path, KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:9")  # nothing listens there

    started = time.monotonic()
    summary = _replay(nowhere, _readings(30), file)

    assert time.monotonic() - started < 1.0
    assert (summary.published, summary.skipped, summary.progress) == (0, 30, Progress(30, 28, True))
    limited = ProgressFile(tmp_path / "q.json", IDENTITY)
    limited.save(Progress(10, 10))
    assert _replay(nowhere, _readings(30), limited, limit=10).published == 0  # its limit was reached


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_stop_records_what_was_acknowledged_so_the_next_run_republishes_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    lines: list[ReplayInput] = [*_readings(40)]
    lines.insert(5, b'{"device_id": "dev-1", "ts": "2014-01-01T00:00:00Z", "temperature": "warm"}')
    stop = asyncio.Event()

    def stopping_after(n: int) -> Iterator[ReplayInput]:
        for i, item in enumerate(lines):
            if i == n:
                stop.set()  # as a SIGTERM would, between two items
            yield item

    file = ProgressFile(tmp_path / "p.json", IDENTITY)
    opts = ReplayOptions(progress=file, checkpoint_s=3600.0)  # only the final write at the stop
    first = asyncio.run(
        replay(settings, stopping_after(17), topic=topics.SENSORS, adapter="jsonl", options=opts, stop=stop)
    )
    second = _replay(settings, lines, file)

    assert (first.published, first.dlq, first.interrupted) == (16, 1, True)
    assert (second.published, second.dlq, second.skipped) == (24, 0, 17)
    assert file.load() == Progress(41, 40, finished=True)
    assert _temperatures(settings.bootstrap_servers, 40) == [float(i) for i in range(40)]
    assert len(consume(settings.bootstrap_servers, topics.DLQ, min_count=1)) == 1


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_every_replay_dead_letter_names_its_file_and_line(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    good = _readings(3)
    path.write_bytes(b"\n".join([good[0], b"{broken", b"", good[1], b'{"device_id": "d", "ts": 5}', good[2]]))
    nab = tmp_path / "nab.csv"
    nab.write_text("timestamp,value\n2014-01-01 00:00:00,1.5\n2014-01-01 00:05:00,hot\n")

    items: list[ReplayInput] = [
        *open_input(str(path), "jsonl", "sensors", device=None, field=None, host=None)
    ]
    rows = [*open_input(str(nab), "nab", "sensors", device="m1", field="temperature", host=None)]
    asyncio.run(replay(settings, items, topic=topics.SENSORS, adapter="jsonl", origin=str(path)))
    asyncio.run(replay(settings, rows, topic=topics.SENSORS, adapter="nab", origin=str(nab)))

    assert [e.number for e in items if isinstance(e, Line)] == [1, 2, 4, 5, 6]
    reasons = [d["reason"] for d in consume_json(settings.bootstrap_servers, topics.DLQ, min_count=3)]
    assert len(reasons) == 3
    assert reasons[0].startswith(f"{path}:2: ") and "JSON" in reasons[0]
    assert reasons[1].startswith(f"{path}:5: ")
    assert reasons[2].startswith(f"{nab}:3: value 'hot'")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(120)
def test_replay_cli_resumes_after_sigterm_and_then_exits_at_once(broker: KafkaBroker, tmp_path: Path) -> None:
    path = require_dataset(NAB_MACHINE_TEMP)
    progress = tmp_path / "ingest" / "replay-sensors.json"
    args = [sys.executable, "-m", "ingest", "replay", str(path), "--topic", topics.SENSORS, "--format", "nab"]
    args += ["--device", "m1", "--field", "temperature", "--limit", "300", "--progress", str(progress)]
    env = child_env(KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap)
    # 5-minute gaps at speed-up 3000: one event per 0.1 s, so the limit is far when the SIGTERM comes
    proc = subprocess.Popen([*args, "--speedup", "3000"], cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while asyncio.run(end_offsets(broker.bootstrap, [topics.SENSORS]))[topics.SENSORS] < 5:
            assert time.monotonic() < deadline, "replay published nothing within 30 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    first = orjson.loads(out.splitlines()[-1])
    rest = subprocess.run(args, cwd=PROJECT_ROOT, env=env, capture_output=True, timeout=60, check=False)
    again = subprocess.run(args, cwd=PROJECT_ROOT, env=env, capture_output=True, timeout=60, check=False)

    assert proc.returncode == 0 and rest.returncode == 0 and again.returncode == 0, rest.stderr
    assert 5 <= first["published"] < 300 and first["sent_total"] == first["published"]
    second = orjson.loads(rest.stdout.splitlines()[-1])
    assert (second["skipped"], second["published"], second["sent_total"]) == (
        first["published"],
        300 - first["published"],
        300,
    )
    assert orjson.loads(again.stdout.splitlines()[-1])["published"] == 0
    assert b"already done" in again.stderr
    stamps = [parse_ts(e["ts"]) for e in consume_json(broker.bootstrap, topics.SENSORS, min_count=300)]
    rows = open_input(str(path), "nab", "sensors", device="m1", field="temperature", host=None)
    expected = [parse_ts(r.item["ts"]) for r in itertools.islice(rows, 300) if isinstance(r.item, dict)]
    assert sorted(stamps) == sorted(expected)  # every row once: nothing skipped, nothing twice


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(90)
def test_simulate_resumes_its_sequence_and_takes_its_start_from_the_progress_file(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    progress = tmp_path / "sim-ticks.json"
    base = [
        "simulate",
        "ticks",
        "--seed",
        "7",
        "--symbols",
        "AAPL,IBM",
        "--fast",
        "--progress",
        str(progress),
    ]
    env = child_env(KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap)

    def simulate(*extra: str) -> dict[str, object]:
        cmd = [sys.executable, "-m", "ingest", *base, *extra]
        done = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        summary: dict[str, object] = orjson.loads(done.stdout.splitlines()[-1])
        return summary

    first = simulate("--start", START, "--count", "50")
    second = simulate("--count", "120")  # no --start: the first run's, from the progress file

    assert (first["published"], second["published"], second["skipped"]) == (50, 70, 50)
    trades = consume_json(broker.bootstrap, topics.FINANCE, min_count=120)
    expected = itertools.islice(tick_events(TickConfig(7, ("AAPL", "IBM"), parse_ts(START))), 120)
    assert sorted(t["trade_id"] for t in trades) == sorted(t["trade_id"] for t in expected)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(90)
def test_registry_load_is_skipped_when_the_same_rows_were_loaded(broker: KafkaBroker, tmp_path: Path) -> None:
    devices = tmp_path / "devices.csv"
    devices.write_text("device_id,site\nd1,s1\n")
    progress = tmp_path / "registry.json"
    cmd = [sys.executable, "-m", "ingest", "registry", "devices", str(devices), "--progress", str(progress)]

    def load(bootstrap: str) -> dict[str, object]:
        env = child_env(KAFKA_BOOTSTRAP_SERVERS=bootstrap)
        done = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        summary: dict[str, object] = orjson.loads(done.stdout.splitlines()[-1])
        return summary

    first = load(broker.bootstrap)
    again = load("127.0.0.1:9")  # nothing listens there: a skipped load must not need Kafka
    devices.write_text("device_id,site\nd1,s1\nd2,s2\n")
    changed = load(broker.bootstrap)

    assert (first["upserted"], "skipped" in first) == (1, False)
    assert (again["upserted"], again["skipped"]) == (0, True)
    assert (changed["upserted"], "skipped" in changed) == (2, False)
    assert len(consume(broker.bootstrap, topics.DEVICES_TABLE, min_count=3)) == 3


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(90)
def test_the_mqtt_simulator_resumes_after_what_the_mqtt_broker_acknowledged(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    got: list[dict[str, object]] = []
    subscribed = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="test-subscriber")
    client.on_message = lambda _c, _u, msg: got.append(orjson.loads(msg.payload))
    client.on_subscribe = lambda *_a: subscribed.set()
    client.connect(mosquitto.host, mosquitto.port)
    client.subscribe("fleet/+/state", qos=1)
    client.loop_start()
    progress = tmp_path / "sim-fleet.json"
    cmd = [sys.executable, "-m", "ingest", "simulate", "fleet", "--seed", "42", "--sensors", "3"]
    cmd += ["--vehicles", "1", "--start", START, "--fast", "--progress", str(progress)]
    cmd += ["--mqtt", f"{mosquitto.host}:{mosquitto.port}"]
    try:
        assert subscribed.wait(10)
        runs = []
        for count in ("30", "50", "50"):
            done = subprocess.run(
                [*cmd, "--count", count], cwd=PROJECT_ROOT, env=child_env(), capture_output=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            runs.append(orjson.loads(done.stdout.splitlines()[-1]))
        deadline = time.monotonic() + 10
        while len(got) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # anything republished would arrive by now
    finally:
        client.loop_stop()
        client.disconnect()

    assert [(r["published"], r["skipped"], r["sent_total"]) for r in runs] == [
        (30, 0, 30),
        (20, 30, 50),
        (0, 50, 50),
    ]
    expected = list(itertools.islice(fleet_events(FleetConfig(42, parse_ts(START), 3, 1)), 50))
    assert sorted(got, key=_order) == sorted(expected, key=_order)


def _order(event: dict[str, object]) -> tuple[str, str]:
    return str(event["ts"]), str(event["device_id"])
