"""What `python -m app run` keeps in its data dir between runs, without running the system."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import orjson
import paho.mqtt.client as mqtt
import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient
from paho.mqtt.enums import CallbackAPIVersion

from app.cli.main import main
from app.errors import ConfigError
from app.events import format_ts, parse_ts
from app.kafka.broker import KafkaBroker, free_port
from app.kafka.wait import listening
from app.placement import partition_for
from app.runtime.clockgate import read_spec
from app.runtime.settings import PROJECT_ROOT, Settings
from app.runtime.system import (
    ARCHIVE_DELAY_S,
    CLOCK_LEAD_S,
    CLOCK_TIMEOUT_S,
    MOSQUITTO,
    NAB_SERIES,
    NAB_START,
    ON_THE_NAB_AXIS,
    SPARK_NICE,
    NabSeries,
    RunOptions,
    build_roles,
    check_consistent,
    demo_clock,
    mosquitto_conf,
    restart_broker,
    wipe,
)
from ingest.adapters import nab_events
from tests.conftest import APACHE_LOG, DATASETS, NAB_MACHINE_TEMP, make_settings, require_dataset

PRODUCERS = (*(series.role for series in NAB_SERIES), "replay-logs", "sim-fleet", "sim-ticks", "registry")


def test_a_data_dir_whose_broker_log_is_gone_is_refused_while_its_state_remains(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    data = settings.data_dir
    check_consistent(settings)  # nothing there yet: a first run
    (data / "ingest").mkdir(parents=True)
    (data / "mosquitto").mkdir()
    (data / "dispatch.sqlite3").write_bytes(b"")

    with pytest.raises(ConfigError, match=r"dispatch\.sqlite3, ingest, mosquitto") as caught:
        check_consistent(settings)

    assert str(data) in str(caught.value) and "--fresh" in str(caught.value)
    (data / "kafka" / "log").mkdir(parents=True)
    (data / "kafka" / "log" / "meta.properties").write_text("node.id=1\n")
    check_consistent(settings)  # the broker's log is there: the state matches it
    wipe(data)
    assert not data.exists()


#: what runs each of make run's roles against Kafka in docker-compose.yml (its image's entry
#: point is `python -m app`; a service that sets tini as its entry point gives the whole command)
COMPOSED = {
    "worker": ["python", "-m", "agents", "worker"],
    "spark": ["spark"],
    "archive": ["archive"],
    "dispatch": ["deliver"],  # its alias
    "store-sync": ["store-sync"],
    "dashboard": ["streamlit", "run", "dashboard/streamlit_app.py"],
}
#: make run's own sources and sinks: the demo's data, and the receiver standing in for responders
DEMO_ONLY = {*PRODUCERS, "mosquitto", "mqtt-bridge", "receiver"}


def test_the_compose_file_runs_every_role_of_make_run_but_the_demos_own(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    names = {r.name for r in build_roles(settings, "127.0.0.1:9092", RunOptions(dashboard=True))}
    assert names - DEMO_ONLY == set(COMPOSED)  # a new role: say where it runs in production
    services = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())["services"]
    commands = [svc.get("command", []) for svc in services.values()]
    missing = [name for name, run in COMPOSED.items() if not any(c[: len(run)] == run for c in commands)]
    assert missing == []  # until 2026-11-30: spark and archive, so `engine: spark` rules never ran


def test_every_producer_role_gets_its_progress_file_under_the_data_dir(tmp_path: Path) -> None:
    require_dataset(NAB_MACHINE_TEMP)
    require_dataset(APACHE_LOG)
    settings = make_settings(tmp_path)
    settings.data_dir.mkdir(parents=True)
    (settings.data_dir / "fleet-devices.csv").write_text("stale\n")

    roles = {r.name: r for r in build_roles(settings, "127.0.0.1:9092", RunOptions(dashboard=False))}

    for name in PRODUCERS:
        argv = roles[name].argv
        assert argv[argv.index("--progress") + 1] == str(settings.data_dir / "ingest" / f"{name}.json"), name
    assert "--progress" not in roles["worker"].argv
    assert not (settings.data_dir / "fleet-devices.csv").exists()  # the registry waits for this run's
    if MOSQUITTO.exists():  # the fleet waits until the bridge subscribed, so nothing is dropped
        bridge = roles["mqtt-bridge"].argv
        assert roles["sim-fleet"].requires_file == Path(bridge[bridge.index("--ready-file") + 1])
    # the producers on the NAB axis publish on one clock, each a party of its gate under its
    # role's name; the log replay has its own axis
    gates = {name: _option(roles[name].argv, "--clock-gate") for name in ON_THE_NAB_AXIS}
    assert set(gates.values()) == {str(settings.data_dir / "ingest" / "demo-clock.json")}, gates
    assert {name: _option(roles[name].argv, "--clock-party") for name in ON_THE_NAB_AXIS} == {
        name: name for name in ON_THE_NAB_AXIS
    }
    assert read_spec(Path(gates["sim-fleet"])).parties == ON_THE_NAB_AXIS
    assert "--clock-gate" not in roles["replay-logs"].argv
    # on a busy machine the Spark drivers and their JVMs yield to the producers and the worker
    assert {name for name, role in roles.items() if role.nice} == {"spark", "archive"}
    assert roles["spark"].nice == roles["archive"].nice == SPARK_NICE > 0
    # the archive's JVM starts after the others, so the rules' query has the cores for its start
    assert {name: role.delay_s for name, role in roles.items() if role.delay_s} == {
        "archive": ARCHIVE_DELAY_S
    }


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("series", NAB_SERIES, ids=lambda series: series.role)
def test_each_demo_series_fires_its_kinds_anomaly_rule_in_its_labelled_failures_only(
    tmp_path: Path, series: NabSeries
) -> None:
    """make run's NAB replays carry the reading as `value` with its `kind` too, so the anomaly
    pack learns each series' normal (until 2026-11-30 only the machine's temperature was
    replayed, and the CPU and latency rules never fired under make run). The events as each
    replay role sends them (its options, shifted onto the demo's axis), backtested with the
    rules as shipped: its kind's anomaly rule fires (and no other kind's), its first alert falls
    in one of the series' labelled anomaly windows, and it comes within a few minutes of a
    fresh demo at its default speed-up."""
    path = require_dataset(DATASETS / series.file)
    settings = make_settings(tmp_path, APP_REPLAY_SPEEDUP="3000")
    settings.data_dir.mkdir(parents=True)
    argv = {r.name: r.argv for r in build_roles(settings, "127.0.0.1:9092", RunOptions(dashboard=False))}
    replay = argv[series.role]
    opt = {name: _option(replay, name) for name in ("--device", "--field", "--kind", "--from")}
    assert (opt["--device"], opt["--kind"]) == (series.device, series.kind)
    assert _option(replay, "replay") == str(path)
    shifted_to = _option(replay, "--shift-to") if "--shift-to" in replay else opt["--from"]
    shift_ms = parse_ts(shifted_to) - parse_ts(opt["--from"])
    events = tmp_path / "series.jsonl"
    with events.open("wb") as out:
        for e in nab_events(str(path), device=opt["--device"], field=opt["--field"], kind=opt["--kind"]):
            if isinstance(e, dict) and parse_ts(e["ts"]) >= parse_ts(opt["--from"]):
                out.write(orjson.dumps({**e, "ts": format_ts(parse_ts(e["ts"]) + shift_ms)}) + b"\n")
    alerts = tmp_path / "alerts.jsonl"
    rules = str(PROJECT_ROOT / "rules")
    assert main(["backtest", "--rules", rules, "--input", str(events), "--out", str(alerts)]) == 0
    every = [a for a in map(orjson.loads, alerts.read_bytes().splitlines()) if a["status"] == "firing"]
    firing = [a for a in every if a["rule_id"].startswith("anomaly-")]  # the machine's heat rules too
    assert firing and {a["rule_id"] for a in firing} == {f"anomaly-{series.kind}"}
    labels = orjson.loads((DATASETS / "nab" / "labels" / "combined_windows.json").read_bytes())
    windows = [
        [parse_ts(t.replace(" ", "T") + "Z") for t in w]
        for w in labels[series.file.removeprefix("nab/data/")]
    ]
    first = parse_ts(firing[0]["starts_at"]) - shift_ms  # in the series' own time
    assert any(lo <= first <= hi for lo, hi in windows), (firing[0]["starts_at"], shift_ms, windows)
    # on the machine's partition, so the fleet's other partitions keep the fleet's own clock
    assert partition_for(series.device.encode(), settings.partitions) == partition_for(
        b"machine-temp-1", settings.partitions
    )
    first_s = (parse_ts(firing[0]["starts_at"]) - parse_ts(NAB_START)) / 1000 / settings.replay_speedup
    print(f"{series.role}: the first alert {first_s:.0f} s into a fresh demo")
    assert 0 < first_s < 180, first_s


def _progress_at(settings: Settings, role: str, updated_at: str) -> None:
    path = settings.data_dir / "ingest" / f"{role}.json"
    path.write_text(f'{{"version":1,"consumed":5,"sent":5,"updated_at":"{updated_at}"}}')


def _gate_started(settings: Settings, wall_s: float) -> None:
    """The demo's gate as its producers leave it once its clock started at ``wall_s``."""
    path = settings.data_dir / "ingest" / "demo-clock.json"
    path.write_bytes(orjson.dumps({**orjson.loads(path.read_bytes()), "wall_s": wall_s}))


def test_the_demo_clock_starts_at_the_nab_start_and_a_second_run_goes_on_where_the_first_got(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, APP_REPLAY_SPEEDUP="3000")
    parties = ("replay-sensors", "sim-fleet")
    gate = demo_clock(settings, parties)
    spec = read_spec(gate)
    assert (spec.event_ms, spec.parties, spec.wall_s) == (parse_ts("2013-12-10T12:00:00Z"), parties, None)
    assert (spec.lead_s, spec.timeout_s) == (CLOCK_LEAD_S, CLOCK_TIMEOUT_S)
    # its producers were ready and started it; the run stopped 10 s after that
    _gate_started(settings, 1_800_000_005.0)
    (gate.parent / "demo-clock.json.sim-fleet.ready").write_text('{"ready_s": 1800000004.5}')
    _progress_at(settings, "sim-fleet", "2027-01-15T08:00:13.000Z")  # Unix 1800000013
    _progress_at(settings, "replay-sensors", "2027-01-15T08:00:15.000Z")  # the last: 10 s in
    _progress_at(settings, "replay-logs", "2027-01-15T09:00:00.000Z")  # not on the NAB axis
    spec = read_spec(demo_clock(settings, parties))
    assert format_ts(spec.event_ms) == "2013-12-10T20:20:00.000Z"  # 10 s x 3000 = 8 h 20 min on
    assert spec.wall_s is None and not list(gate.parent.glob("*.ready"))  # a new gate: nobody ready
    # a run that stopped before its producers were all ready leaves the clock where it was
    _progress_at(settings, "sim-ticks", "2027-01-15T09:30:00.000Z")
    assert format_ts(read_spec(demo_clock(settings, parties)).event_ms) == "2013-12-10T20:20:00.000Z"


def test_a_demo_clock_from_before_the_gate_goes_on_where_its_run_got(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, APP_REPLAY_SPEEDUP="3000")
    path = settings.data_dir / "ingest" / "demo-clock.json"
    path.parent.mkdir(parents=True)
    # the file `--clock WALL@TIME` left (2026-11-29): no parties, no lead, no timeout
    start = parse_ts("2013-12-10T12:00:00Z")
    path.write_text(f'{{"wall_s": 1800000005.0, "event_ms": {start}, "speedup": 3000}}')
    _progress_at(settings, "replay-sensors", "2027-01-15T08:00:15.000Z")  # 10 s after wall_s
    spec = read_spec(demo_clock(settings, ON_THE_NAB_AXIS))
    assert format_ts(spec.event_ms) == "2013-12-10T20:20:00.000Z"
    assert (spec.parties, spec.wall_s) == (tuple(ON_THE_NAB_AXIS), None)


def test_a_demo_clock_without_the_producers_progress_starts_over_and_a_broken_one_is_refused(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    demo_clock(settings, ON_THE_NAB_AXIS)
    _gate_started(settings, 1_800_000_000.0)
    # the progress files gone (the producers start from their first events): so does the clock
    assert format_ts(read_spec(demo_clock(settings, ON_THE_NAB_AXIS)).event_ms) == "2013-12-10T12:00:00.000Z"
    path = settings.data_dir / "ingest" / "demo-clock.json"
    _progress_at(settings, "sim-ticks", "2027-01-15T08:00:15.000Z")
    for broken in ("{not json", '{"wall_s": 1}', '{"event_ms": 1, "speedup": 3000, "wall_s": "noon"}'):
        path.write_text(broken)
        with pytest.raises(ConfigError, match=f"{path}: .*remove it to restart the demo's clock"):
            demo_clock(settings, ON_THE_NAB_AXIS)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_mosquitto_keeps_the_bridge_session_and_its_queue_across_a_restart(tmp_path: Path) -> None:
    if not os.access(MOSQUITTO, os.X_OK):
        pytest.skip(f"mosquitto not installed at {MOSQUITTO} (`make test` installs it)")
    store = tmp_path / "mosquitto"
    store.mkdir()
    got: list[bytes] = []

    def client(client_id: str, port: int) -> mqtt.Client:
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
        c.on_message = lambda _c, _u, msg: got.append(msg.payload)
        c.connect("127.0.0.1", port)
        c.loop_start()
        return c

    with _Mosquitto(tmp_path, store) as port:
        bridge = client("bridge", port)
        subscribed = threading.Event()
        bridge.on_subscribe = lambda *_a: subscribed.set()
        bridge.subscribe("fleet/+/state", qos=1)
        assert subscribed.wait(10)
        bridge.disconnect()
        bridge.loop_stop()
        sender = client("sender", port)
        for i in range(20):  # while the bridge is away: queued for its session
            sender.publish(f"fleet/d{i}/state", str(i).encode(), qos=1).wait_for_publish(5)
        sender.disconnect()
        sender.loop_stop()
    with _Mosquitto(tmp_path, store) as port:  # a new run: another process, another port
        bridge = client("bridge", port)
        deadline = time.monotonic() + 10
        while len(got) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        bridge.disconnect()
        bridge.loop_stop()

    assert sorted(int(p) for p in got) == list(range(20))


class _Mosquitto:
    """mosquitto with ``make run``'s config on a free port; SIGTERM (it saves its store) at exit."""

    def __init__(self, tmp_path: Path, store: Path) -> None:
        self.port = free_port()
        self.conf = tmp_path / f"mosquitto-{self.port}.conf"
        self.conf.write_text(mosquitto_conf(self.port, store))
        self.log = tmp_path / f"mosquitto-{self.port}.log"

    def __enter__(self) -> int:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(MOSQUITTO), "-c", str(self.conf)], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while not listening(f"127.0.0.1:{self.port}"):  # its "running" line is information, not logged
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)
        return self.port

    def __exit__(self, *_exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        said = self.log.read_bytes()
        assert b"Error" not in said, said
        assert b"Saving in-memory database" not in said, said  # it saved at the stop, quietly


def groups_answer_at_once(bootstrap: str, times: int = 10) -> None:
    """The list of consumer groups answers ``times`` in a row: none meets "load in progress"
    (what every role met at a fresh start, and the test session's topic reset once)."""

    async def ask() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            for _ in range(times):
                await admin.list_consumer_groups()
        finally:
            await admin.close()

    asyncio.run(ask())


@pytest.mark.slow
@pytest.mark.integration
def test_a_dead_embedded_broker_is_restarted_on_its_log_dir_and_address(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = KafkaBroker(tmp_path / "kafka", heap="256m").start()
    try:
        groups_answer_at_once(broker.bootstrap)  # ready: its offsets topic is loaded
        address, pid = broker.bootstrap, broker.pid
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)  # as an OOM kill would
        deadline = time.monotonic() + 10
        while broker.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not broker.running()
        restart_broker(broker)
        assert broker.running() and broker.bootstrap == address and broker.pid != pid
        groups_answer_at_once(broker.bootstrap)  # its offsets topic loaded again from its log
        # a second Ctrl-C while make run stops: the broker is killed, not waited for
        pid, force = broker.pid, threading.Event()
        assert pid is not None
        force.set()
        with caplog.at_level(logging.WARNING, logger="app.kafka.broker"):
            broker.stop(force=force)
        assert "killing it on a second signal" in caplog.text
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    finally:
        broker.stop()
