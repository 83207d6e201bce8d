"""End-to-end: `python -m app run` as a newcomer runs it, against the embedded broker.

Checks the final counters of a headless run and that it keeps its secrets, that alerts
reach the webhook receiver, that SIGTERM stops everything within 10 s, that a second run
on the same data dir resumes (new alerts delivered, nothing published twice) and
``--fresh`` starts from nothing, and that no process is left behind (every child inherits
the test's unique APP_DATA_DIR, which we look for in /proc/*/environ afterwards).
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.console.health import probe_roles
from app.events import parse_ts
from app.kafka.auth import KafkaAuth
from app.kafka.clients import Endpoint
from app.runtime.credentials import read_client_env, role_auth
from app.runtime.settings import PROJECT_ROOT
from app.runtime.system import NAB_SERIES
from app.topics import ALERTS, COMMANDS, SENSORS
from tests.browser.cdp import chromium_path, visit
from tests.conftest import NAB_MACHINE_TEMP, child_env, own_broker, require_dataset
from tests.kafka_helpers import can_write, consume
from tests.procs import http_ok, http_text, processes_with_env, stop, wait_for

#: the devices of the NAB replays; every other sensors reading is the simulated fleet's
REPLAYED = {series.device for series in NAB_SERIES}
#: the alertname of each of the Overview's rows for the replayed machine (its labels, sorted)
FIRING_FOR_THE_MACHINE = (
    r"alertname=([a-z0-9-]+)(?:, (?!device_id=)[a-z_]+=[^,\n]*)*, device_id=machine-temp-1"
)

Done = Callable[[str], bool]

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def run_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return child_env(
        APP_DATA_DIR=str(tmp_path / "data"),
        APP_REPLAY_SPEEDUP="20000",
        APP_REPLAY_LIMIT="2000",
        APP_DASHBOARD_PORT="0",
        **extra,
    )


def _run(
    env: dict[str, str], seconds: int, *extra: str, output: list[str] | None = None, until: Done | None = None
) -> dict[str, Any]:
    """``python -m app run`` headless; its final counters (its output appended to ``output``). It
    is stopped by SIGTERM as soon as ``until`` holds (given its output so far), or runs for
    ``seconds``."""
    data = Path(env["APP_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)
    out_path = data.parent / f"run-{time.monotonic_ns()}.log"
    cmd = [
        sys.executable,
        "-m",
        "app",
        "run",
        "--duration",
        str(seconds),
        "--no-dashboard",
        "--quiet",
        *extra,
    ]
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, cwd=PROJECT_ROOT, stdout=out, stderr=out, start_new_session=True
        )
        try:
            deadline = time.monotonic() + seconds + 60
            while proc.poll() is None and time.monotonic() < deadline:
                if until is not None and until(out_path.read_text()):
                    _sigterm(proc, 30)
                    break
                time.sleep(1)
            code = proc.wait(max(1.0, deadline - time.monotonic()))
        finally:
            stop(proc)
    text = out_path.read_text()
    assert code == 0, text[-6000:]
    assert processes_with_env(env["APP_DATA_DIR"]) == []
    if output is not None:
        output.append(text)
    last = next(line for line in reversed(text.splitlines()) if line.startswith('{"events"'))
    counters: dict[str, Any] = orjson.loads(last)
    return counters


def _delivered(output: str) -> bool:
    """The run's receiver (its URL in the banner of ``output``) got at least one webhook."""
    m = re.search(r"receiver +(http://\S+)/webhook", output)
    return m is not None and (_stats(m[1]).get("unique_alerts") or 0) > 0


def _progress(data: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: orjson.loads(p.read_bytes()) for p in (data / "ingest").glob("*.json")}


def _summaries(data: Path, role: str) -> list[dict[str, Any]]:
    """The JSON summary line of each run of a producer role, from its log (appended per run)."""
    lines = (data / "logs" / f"{role}.log").read_text().splitlines()
    return [orjson.loads(line) for line in lines if line.startswith('{"published"')]


def _headless_run_counted_and_kept_secrets(counters: dict[str, Any], output: list[str], data: Path) -> None:
    """What a headless run prints and leaves: its counters, one principal per role (SASL/SCRAM
    and ACLs on the embedded broker: make run's default), no password in any log or output."""
    assert counters["events"]["events.sensors"] > 1000  # NAB readings plus the fleet over MQTT
    assert counters["events"]["events.finance"] > 0  # the trade simulator
    assert counters["alerts"] > 0
    # the dispatcher groups transitions (Alertmanager semantics): an alert that fired and
    # resolved within one group interval is notified in its latest state only
    assert 0 < counters["webhooks_delivered"] <= counters["alerts"]
    assert counters["notification_log"] > 0
    assert counters["dlq"] == 0  # the first 1000 log lines are all well-formed
    assert (data / "alerts.sqlite3").exists()
    assert "SASL/SCRAM + ACLs" in output[0]
    passwords = orjson.loads((data / "kafka" / "users.json").read_bytes())
    logs = [*output, *(f.read_text(errors="replace") for f in (data / "logs").glob("*.log"))]
    assert {u for u, p in passwords.items() if any(p in text for text in logs)} == set()
    assert "Authenticated as worker via SCRAM-SHA-512" in (data / "logs" / "worker.log").read_text()
    assert "Authenticated as dispatch via SCRAM-SHA-512" in (data / "logs" / "dispatch.log").read_text()
    assert not (data / "client.env").exists()  # make run removes it when it stops


def test_a_second_run_resumes_and_delivers_new_alerts_and_fresh_starts_from_nothing(tmp_path: Path) -> None:
    require_dataset(NAB_MACHINE_TEMP)
    data = tmp_path / "data"
    # the demo's speed-up; a limit the log replay reaches in the first run, the NAB replay in neither
    env = child_env(APP_DATA_DIR=str(data), APP_REPLAY_SPEEDUP="3000", APP_REPLAY_LIMIT="1000")

    output: list[str] = []
    # each run stops once a webhook was delivered and every producer has sent (more), or at 60 s
    first = _run(env, 60, output=output, until=lambda out: _delivered(out) and _moved(data, {}, logs=1000))
    after_first = _progress(data)
    _headless_run_counted_and_kept_secrets(first, output, data)
    second = _run(env, 60, until=lambda out: _delivered(out) and _moved(data, after_first))
    after_second = _progress(data)

    assert first["webhooks_delivered"] > 0
    assert second["webhooks_delivered"] > 0, second  # the issue: 0 here, the ids of run 1 replayed
    assert second["alerts"] > first["alerts"]
    for topic in ("events.sensors", "events.finance"):
        assert second["events"][topic] > first["events"][topic]
    # the log replay reached its limit in run 1: run 2 said so and published nothing
    assert first["events"]["events.logs"] == second["events"]["events.logs"] == 1000
    assert after_second["replay-logs"]["sent"] == 1000
    done = {"published": 0, "dlq": 0, "topic": "events.logs", "skipped": 1000, "sent_total": 1000}
    assert _summaries(data, "replay-logs")[-1] == {**done, "finished": False}
    # the NAB replay went on where run 1 stopped
    nab_runs = _summaries(data, "replay-sensors")
    assert len(nab_runs) == 2
    assert nab_runs[1]["skipped"] == nab_runs[0]["sent_total"] == after_first["replay-sensors"]["sent"] > 0
    assert nab_runs[1]["published"] > 0
    nab_sent = after_second["replay-sensors"]["sent"]
    assert nab_sent == nab_runs[0]["published"] + nab_runs[1]["published"]
    assert after_second["sim-fleet"]["sent"] > after_first["sim-fleet"]["sent"]
    assert after_second["sim-ticks"]["sent"] == second["events"]["events.finance"]

    with own_broker(data / "kafka", topics=False) as broker:  # what the two runs left on the topics
        readings = consume(
            broker.bootstrap, "events.sensors", min_count=second["events"]["events.sensors"], timeout_s=20
        )
        sensors = [orjson.loads(r.value) for r in readings]
        trades = _records(broker.bootstrap, "events.finance", second["events"]["events.finance"])
        alert_records = consume(broker.bootstrap, "alerts", min_count=second["alerts"], timeout_s=20)
    assert len(sensors) == second["events"]["events.sensors"]
    assert _repeated((e["device_id"], e["ts"]) for e in sensors) == []  # no reading published twice
    assert sum(e["device_id"] == "machine-temp-1" for e in sensors) == nab_sent
    # each NAB series exactly as far as its progress says, across the two runs
    sent = collections.Counter(e["device_id"] for e in sensors)
    assert {s.device: sent[s.device] for s in NAB_SERIES} == {
        s.device: after_second[s.role]["sent"] for s in NAB_SERIES
    }
    # the fleet: what mosquitto acknowledged in run 1 reached Kafka by the end of run 2 (its queue
    # for the bridge persists), and nothing more than the simulator sent
    fleet = sum(e["device_id"] not in REPLAYED for e in sensors)
    assert after_first["sim-fleet"]["sent"] <= fleet <= after_second["sim-fleet"]["sent"]
    assert _repeated(t["trade_id"] for t in trades) == []
    # the worker went on from its committed offsets: a rerun from the start would repeat run 1's ids.
    # Each engine on its own: the rules with `engine: both` give Spark's copies the same ids (its
    # records say `engine: spark` in a header), whenever its JVM is up in time to write them
    assert len(alert_records) == second["alerts"]
    by_engine: dict[bytes, list[str]] = {}
    for r in alert_records:
        engine = dict(r.headers or ()).get("engine", b"faust")
        by_engine.setdefault(engine, []).append(orjson.loads(r.value)["alert_id"])
    assert by_engine[b"faust"]
    repeated = {e: _repeated(ids) for e, ids in by_engine.items()}
    assert not any(repeated.values()), repeated
    # the NAB replay, the fleet and the trades publish on one clock, across the two runs: each
    # from its own start, the fleet ran an hour of event time behind the replay on the partitions
    # they share, and its devices fired `device-silent` every 30 minutes while reporting every 5;
    # on a clock fixed 5 s ahead, the fleet's bridge was not always up in time
    # A silence with a reading in it is the engine's error only when that reading reached the
    # worker within the rule's lateness (15 minutes behind its partition's clock). One that came
    # later was late on the wire: at the demo's speed-up a fleet reading held back 0.9 s on a busy
    # host is 45 minutes late, and the rule rightly counts it out. With another make run beside
    # it, that happened in 5 of 16 runs (1 of 3 on the code before 2026-11-30); each run prints
    # how late the readings came and the silences they made.
    lags = _arrival_lags(readings)
    behind = _behind_partition_clock({k: lag for k, lag in lags.items() if k[0] not in REPLAYED})
    silences = [orjson.loads(r.value) for r in alert_records]
    late = _false_silences(sensors, silences, lags, within_ms=None)
    print(f"fleet readings behind their partition's clock, in minutes of event time: {behind}; late: {late}")
    assert _false_silences(sensors, silences, lags, within_ms=15 * 60_000) == [], behind
    assert behind["p50"] == 0.0  # the fleet publishes on the replays' clock (see above)

    # a fresh start waits for every producer on the demo's clock (five since 2026-11-30) before any
    # sends: beside another such test on 2 cores, none had sent within 25 s, twice
    fresh = _run(env, 45, "--fresh", until=_delivered)

    # nothing of the two runs is left: the log topic held their 1,000 lines and holds the fresh
    # run's alone (it sends from its start, off the demo's clock), and the NAB replay started its
    # file over. Not "fewer than the two runs": beside another such test the fresh run, stopped at
    # its first webhook, once made 42 alerts where the two runs had made 21
    assert 0 < fresh["events"]["events.logs"] <= 1000
    (nab_fresh,) = _summaries(data, "replay-sensors")  # the logs were wiped with the rest
    assert nab_fresh["skipped"] == 0


def _false_silences(
    readings: list[dict[str, Any]],
    alerts: list[dict[str, Any]],
    lags: dict[tuple[str, int], int],
    within_ms: int | None,
) -> list[tuple[str, str]]:
    """The ``device-silent`` alerts (device, start) of a device that sent a reading during the
    silence they tell of (after ``silent_since``, before ``starts_at``) that reached the worker
    at most ``within_ms`` behind its partition's clock (``lags``; None: however late)."""
    seen: dict[str, list[int]] = collections.defaultdict(list)
    for e in readings:
        t = parse_ts(e["ts"])
        if within_ms is None or lags.get((e["device_id"], t), 0) <= within_ms:
            seen[e["device_id"]].append(t)
    return [
        (a["labels"]["device_id"], a["starts_at"])
        for a in alerts
        if a["rule_id"] == "device-silent" and a["status"] == "firing"
        for since, start in [(a["values"]["silent_since"], parse_ts(a["starts_at"]))]
        if any(since < t < start for t in seen[a["labels"]["device_id"]])
    ]


def _arrival_lags(records: list[Any]) -> dict[tuple[str, int], int]:
    """How far each reading (device, event time) came behind its partition's clock (the newest
    event time on it so far, in offset order: the worker's), in ms. The replayed series too: a
    replay held back 1.4 s on a busy host is 70 minutes late at the demo's speed-up (a gate
    of 2026-12-01 found machine-temp-1's readings 21 to 71 minutes behind, and the silences
    they did not end were right)."""
    newest: dict[int, int] = {}
    lags: dict[tuple[str, int], int] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        e = orjson.loads(r.value)
        ts = parse_ts(e["ts"])
        lags[(e["device_id"], ts)] = max(0, newest.get(r.partition, ts) - ts)
        newest[r.partition] = max(ts, newest.get(r.partition, ts))
    return lags


def _behind_partition_clock(by_reading: dict[tuple[str, int], int]) -> dict[str, float]:
    """The fleet's readings' lags (:func:`_arrival_lags`): median, 99th percentile and most,
    and how many were more than the 15 minutes ``device-silent`` allows, in minutes."""
    lags = sorted(by_reading.values()) or [0]

    def at(q: float) -> float:
        return round(lags[min(len(lags) - 1, int(q * len(lags)))] / 60_000, 1)

    over = sum(lag > 15 * 60_000 for lag in lags)
    return {"p50": at(0.5), "p99": at(0.99), "max": at(1.0), "over_15": over}


def _moved(data: Path, before: dict[str, dict[str, Any]], logs: int | None = None) -> bool:
    """Every producer of make run sent more than in ``before`` (the log replay ``logs`` lines in
    all, when given), and the sensors' two more than a thousand readings in all."""
    now = _progress(data)
    sent = {role: now.get(role, {}).get("sent", 0) for role in ("replay-sensors", "sim-fleet", "sim-ticks")}
    return (
        all(n > before.get(role, {}).get("sent", 0) for role, n in sent.items())
        and sent["replay-sensors"] + sent["sim-fleet"] > 1000 + 100
        and (logs is None or now.get("replay-logs", {}).get("sent") == logs)
    )


def _records(bootstrap: str, topic: str, n: int) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in consume(bootstrap, topic, min_count=n, timeout_s=20)]


def _repeated(keys: Any) -> list[Any]:
    return [k for k, n in collections.Counter(keys).items() if n > 1]


def _stats(receiver: str) -> dict[str, Any]:
    """The receiver's counters (empty while it does not answer)."""
    stats: dict[str, Any] = orjson.loads(http_text(f"{receiver}/stats") or "{}")
    return stats


def _silences(env: dict[str, str]) -> str:
    """What ``python -m app alerts silences`` lists."""
    cmd = [sys.executable, "-m", "app", "alerts", "silences"]
    done = subprocess.run(cmd, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _sigterm(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, float]:
    """SIGTERM ``proc``; its exit code and how long it took to exit."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout_s)
    return code, time.monotonic() - started


def test_dashboard_shows_real_alerts_then_sigterm_stops_everything_within_10s(tmp_path: Path) -> None:
    require_dataset(NAB_MACHINE_TEMP)
    env = run_env(tmp_path)
    log = (tmp_path / "run.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "run"],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        text = wait_for(
            lambda: "dashboard   http" in (t := (tmp_path / "run.log").read_text()) and t,
            timeout_s=90,  # broker, topics, ACLs, then the banner: 33 s at a load average of 20 on 2 cores
            what="the URL banner",
        )
        url = text.split("dashboard   ")[1].split()[0]
        wait_for(lambda: http_ok(f"{url}/_stcore/health"), timeout_s=60, what="streamlit health")
        if chromium_path() is not None:  # what an operator sees: real alerts on the page
            shot = tmp_path / "dashboard.png"
            # generous: on a loaded 2-CPU host the first overheat can take a minute to reach the page.
            # The Overview lists what fires now: the replayed machine's overheat while the replay
            # is in its hot spell (it resolves within seconds), its hourly heat, its silence once
            # the replay is over;
            # and its pipeline health, read as the console's principal (SASL under make run), shows
            # the consumer lag once a sample succeeded (without credentials: "Kafka unreachable")
            wanted = ("device_id=machine-temp-1", "consumer lag")
            page = visit(url, wanted, timeout_s=120, screenshot=shot)
            said = (tmp_path / "run.log").read_text().splitlines()
            crashes = [line for line in said if " exited with " in line]
            assert all(w in page for w in wanted), (crashes, page[-3000:])
            # rules of the IoT or anomaly packs fire for it (the fleet's false silences used to
            # fill the page)
            packs = [(PROJECT_ROOT / "rules" / f"{p}.yaml").read_text() for p in ("iot", "anomaly")]
            shipped = {r for text in packs for r in re.findall(r"^  - id: (\S+)", text, re.M)}
            # (a row's labels are sorted: anomaly-temperature's own label comes between those two)
            firing = re.findall(FIRING_FOR_THE_MACHINE, page)
            assert firing and set(firing) <= shipped, (firing, shipped, page[-3000:])
            assert shot.stat().st_size > 10_000
        else:
            time.sleep(3)  # no browser here: at least let alerts start flowing
        # the console's pipeline health shows every role up: each serves the /metrics the banner
        # gives (the fleet over MQTT, the archive and the dashboard served none, and showed
        # "starting" for good)
        data, deadline = Path(env["APP_DATA_DIR"]), time.monotonic() + 60
        while (not_up := _not_up(data)) and time.monotonic() < deadline:
            time.sleep(1)
        assert not_up == []
        code, elapsed = _sigterm(proc, 15)
    finally:
        stop(proc)
        log.close()
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert elapsed < 10, f"took {elapsed:.1f}s to stop"
    assert processes_with_env(env["APP_DATA_DIR"]) == []
    last = (tmp_path / "run.log").read_text().strip().splitlines()
    assert any(line.startswith('{"events"') for line in last[-3:])
    # a first start: every topic existed before a client looked for it (the worker's consumer
    # once joined its group before Faust had declared its own, tests/agents/test_startup.py)
    assert not [line for line in last if "not found in cluster metadata" in line]
    # nor a group coordinator before the broker had one (the embedded broker waits for it)
    assert not [line for line in last if "GroupCoordinatorNotAvailable" in line]
    # the Spark roles stopped their queries themselves: no query taken for failed at the stop
    assert not [line for line in last if "StackOverflowError" in line or "terminated with error" in line]


def _not_up(data: Path) -> list[str]:
    """The roles the console's pipeline health does not show up, each with what it shows."""
    roles = probe_roles(data)
    return [f"{r.name}: {r.label}" for r in roles if not r.up] if roles else ["no roles.json yet"]


def test_a_sigterm_while_the_broker_starts_starts_no_role_and_stops_it(tmp_path: Path) -> None:
    env = run_env(tmp_path)
    out = tmp_path / "run.log"
    with out.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "run", "--no-dashboard"], env=env, cwd=PROJECT_ROOT,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            # the log dir is formatted before the broker starts: it is starting now
            formatted = lambda: "formatted the Kafka log dir" in out.read_text()  # noqa: E731
            wait_for(formatted, timeout_s=60, what="the log dir formatted")
            code, elapsed = _sigterm(proc, 30)
        finally:
            stop(proc)
    text = out.read_text()
    assert code == 0, text[-3000:]
    assert "stopped while starting: no role was started" in text
    assert "Kafka broker on" in text and " stopped" in text.split("no role was started")[1]
    assert not list((tmp_path / "data" / "logs").glob("*.log"))  # no role ever started
    assert elapsed < 10, f"took {elapsed:.1f}s to stop"
    assert processes_with_env(env["APP_DATA_DIR"]) == []


def test_each_data_dir_gets_its_own_secrets_and_keeps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.runtime.system import local_secrets

    monkeypatch.delenv("APP_WEBHOOK_SECRET", raising=False)
    monkeypatch.delenv("APP_COMMAND_SECRET", raising=False)
    first, other = local_secrets(tmp_path / "a"), local_secrets(tmp_path / "b")
    assert first == local_secrets(tmp_path / "a") and first != other
    assert first["APP_WEBHOOK_SECRET"].startswith("whsec_") and len(first["APP_COMMAND_SECRET"]) >= 32
    assert (tmp_path / "a" / "secrets.json").stat().st_mode & 0o077 == 0
    monkeypatch.setenv("APP_COMMAND_SECRET", "the operator's own")
    assert "APP_COMMAND_SECRET" not in local_secrets(tmp_path / "a")


FORGED = b'{"alert_id": "forged-by-the-probe", "rule_id": "probe", "status": "firing"}'


def test_under_make_run_strangers_cannot_write_alerts_or_commands_and_the_operator_can(
    tmp_path: Path,
) -> None:
    """The issue's probe against make run's own broker: a client without credentials, an ingest
    principal (what a device's path holds) and the worker's cannot write a forged alert or
    silence; the forged alert is never on `alerts` nor delivered; the operator's CLI, with no
    variable set, still silences through the running make run as its console."""
    require_dataset(NAB_MACHINE_TEMP)
    env = run_env(tmp_path)
    data = tmp_path / "data"
    log_path = tmp_path / "run.log"
    log = log_path.open("wb")
    # stopped by SIGTERM once everything it checks has happened (the duration is a backstop)
    cmd = [sys.executable, "-m", "app", "run", "--duration", "150", "--no-dashboard", "--quiet"]
    proc = subprocess.Popen(
        cmd, env=env, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        client = wait_for(lambda: read_client_env(data), timeout_s=90, what="make run's client.env")
        bootstrap = client["KAFKA_BOOTSTRAP_SERVERS"]
        users = orjson.loads((data / "kafka" / "users.json").read_bytes())
        as_ = {r: Endpoint(bootstrap, role_auth(users, r)) for r in ("ingest", "worker", "console")}
        assert can_write(as_["ingest"], SENSORS, b"{}")  # the principal works, for what it may write
        refused = {
            "nobody -> alerts": can_write(bootstrap, ALERTS, FORGED),
            "nobody -> commands": can_write(bootstrap, COMMANDS, FORGED),
            "ingest -> alerts": can_write(as_["ingest"], ALERTS, FORGED),
            "ingest -> commands": can_write(as_["ingest"], COMMANDS, FORGED),
            "worker -> commands": can_write(as_["worker"], COMMANDS, FORGED),
            "console -> alerts": can_write(as_["console"], ALERTS, FORGED),
        }
        assert refused == dict.fromkeys(refused, False)
        alerts = [sys.executable, "-m", "app", "alerts"]
        cli = subprocess.run(
            [*alerts, "silence", 'device_id="probe-device"', "--duration", "1h", "--comment", "by the probe"],
            env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr[-2000:]
        admin = Endpoint(bootstrap, KafkaAuth("SASL_PLAINTEXT", "SCRAM-SHA-256", "admin", users["admin"]))
        # the topic as it stands once the engines wrote to it (a forged record would be there already)
        on_alerts = [r.value for r in consume(admin, ALERTS, min_count=1, timeout_s=45)]
        # the silence reached the store, and the receiver got a signed webhook
        wait_for(
            lambda: "probe-device" in _silences(env), timeout_s=60, interval_s=1, what="the silence listed"
        )
        wait_for(
            lambda: _delivered(log_path.read_text()), timeout_s=90, interval_s=1, what="a delivered webhook"
        )
        # the dispatcher applied it: signed with make run's command secret, not counted as forged
        metrics = re.search(r"metrics +(http://\S+/metrics) \(dispatch\)", log_path.read_text())
        assert metrics, log_path.read_text()[-3000:]
        applied = 'dispatch_records_total{outcome="applied",topic="commands"} 1.0'
        dispatch = metrics[1]
        wait_for(lambda: applied in (http_text(dispatch) or ""), timeout_s=30, interval_s=1,
                 what="the silence applied")  # fmt: skip
        code, _ = _sigterm(proc, 30)
    finally:
        stop(proc)
        log.close()
    output = log_path.read_text()
    assert code == 0, output[-3000:]
    assert processes_with_env(env["APP_DATA_DIR"]) == []
    assert FORGED not in on_alerts and len(on_alerts) > 0
    counters = orjson.loads(next(ln for ln in reversed(output.splitlines()) if ln.startswith('{"events"')))
    assert counters["webhooks_delivered"] > 0
    assert b"forged-by-the-probe" not in (data / "logs" / "receiver.log").read_bytes()
    assert "forged" not in (data / "logs" / "dispatch.log").read_text().lower()
    assert "probe-device" in _silences(env)
