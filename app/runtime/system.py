"""`python -m app run`: the whole system on one machine, under one supervisor.

Starts the embedded Apache Kafka broker (:class:`app.kafka.broker.KafkaBroker`, its log dir
under ``APP_DATA_DIR/kafka``) unless ``KAFKA_BOOTSTRAP_SERVERS`` is set, creates the
topics, and runs these roles as child processes (stop order in
brackets, producers first):

- [1] ``replay-sensors``, ``replay-cpu``, ``replay-latency``: real NAB series (a machine's
  temperature, a database's CPU, an API's latency) on one event-time axis -> events.sensors
- [1] ``replay-logs``: the real Apache access log -> events.logs
- [1] ``sim-fleet``: a seeded fleet (sensors, vehicles) -> MQTT (mosquitto)
- [2] ``mqtt-bridge``: MQTT -> events.sensors
- [1] ``registry``: the fleet's device registry -> tables.devices
- [1] ``sim-ticks``: seeded trades -> events.finance
- [2] ``worker``: the Faust rule worker
- [2] ``spark``: the Spark engine (rules marked ``engine: spark|both``)
- [2] ``archive``: every event topic -> Parquet by source and date (``APP_ARCHIVE_PATH``)
- [3] ``dispatch``: alerts + commands -> routing, grouping, silences, inhibition,
  acks -> durable outbox -> signed webhooks
- [3] ``store-sync``: alerts -> the SQLite alert store
- [4] ``receiver``: the local demo webhook receiver
- [4] ``dashboard``: Streamlit, reading the alert store

At the end it prints one JSON line of counters (see :func:`counters`).

A second run on the same data dir resumes: the broker keeps its topics, offsets and
groups, the consumers continue from their committed offsets, the replays and simulators
continue after what they published before (their progress files under
``APP_DATA_DIR/ingest``), and the dispatcher's memory matches the broker's topics.
``--fresh`` (:func:`wipe`) starts from nothing. A data dir whose broker state is gone
while the rest remains is refused (:func:`check_consistent`): a fresh broker would replay
alert ids the dispatcher remembers as delivered.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import getpass
import hashlib
import logging
import os
import re
import secrets
import shutil
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from app.console.catalog import files_key
from app.console.health import ROLE_STATES_FILE
from app.console.launch import prepare as prepare_console
from app.errors import AppError, ConfigError
from app.events import parse_ts
from app.kafka.acls import ENGINES, apply_acls, branch_grants, rule_branch_topics
from app.kafka.admin import ensure_topics
from app.kafka.auth import KafkaAuth
from app.kafka.broker import KafkaBroker, claim_port, free_port, kafka_version
from app.kafka.clients import Endpoint, Target, end_offsets
from app.runtime import runlock
from app.runtime.clockgate import GateSpec, write_gate
from app.runtime.credentials import (
    CONSOLE,
    embedded_users,
    role_auth,
    role_kafka_env,
    write_client_env,
)
from app.runtime.settings import PROJECT_ROOT, Settings
from app.runtime.statefile import read_json
from app.runtime.supervisor import Role, Supervisor, stop_on_signals
from app.topics import ALERTS, DLQ, NOTIFICATIONS, SOURCE_TOPICS

logger = logging.getLogger(__name__)

NAB_FILE = "nab/data/realKnownCause/machine_temperature_system_failure.csv"
# The demo starts the machine-temperature replay the day before its first labelled failure,
# and the simulated fleet and trades on the same event-time axis (one clock per partition).
NAB_START = "2013-12-10T12:00:00Z"


@dataclass(frozen=True)
class NabSeries:
    """A real NAB series the demo replays onto ``events.sensors`` (``role``), as ``device``'s
    ``field``, and as ``value`` with its ``kind``, which the anomaly pack reads
    (``rules/anomaly.yaml``). ``start`` is its first event in its own time, at ``NAB_START``
    on the demo's axis (``--from`` and ``--shift-to``): the series' first labelled anomaly
    comes a minute or two into a fresh run, once the baseline is warm."""

    role: str
    file: str  # under the datasets dir
    device: str
    field: str
    kind: str
    start: str


#: One series per anomaly kind the demo shows: each one's rule fires, first in one of the
#: series' labelled anomaly windows (``tests/runtime/test_system_state.py``). The CPU and
#: latency series joined on 2026-11-30; until then ``anomaly-cpu`` and ``anomaly-latency``
#: never fired under ``make run``. Their devices share the machine's partition (of the default
#: 4): a replay is punctual and drives its partition's clock, and at the demo's speed-up a fleet
#: reading held back 0.9 s on a busy CPU comes 45 minutes of event time late, past the rule's
#: lateness, and ``device-silent`` fires for its device. Spread over three partitions (as first
#: written), they had 8 of the fleet's 9 devices judged by a replay's clock; the machine has 4.
NAB_SERIES = (
    NabSeries("replay-sensors", NAB_FILE, "machine-temp-1", "temperature", "temperature", NAB_START),
    NabSeries(
        "replay-cpu", "nab/data/realAWSCloudwatch/rds_cpu_utilization_cc0c53.csv",
        "db-cpu-1", "value", "cpu", "2014-02-22T12:00:00Z",
    ),
    NabSeries(
        "replay-latency", "nab/data/realKnownCause/ec2_request_latency_system_failure.csv",
        "web-api-1", "value", "latency", "2014-03-12T12:00:00Z",
    ),
)  # fmt: skip
#: the producers on that axis share one clock (``--clock-gate``, ``app.runtime.clockgate``), kept
#: in the data dir so a second run goes on where the first had got (``demo_clock``)
ON_THE_NAB_AXIS = (*(series.role for series in NAB_SERIES), "sim-fleet", "sim-ticks")
DEMO_CLOCK_FILE = "demo-clock.json"
#: their first events are due this long after the last of them is ready (connected to its
#: sink; the fleet's MQTT bridge subscribed)
CLOCK_LEAD_S = 0.5
#: a producer not ready this long after the first is not waited for
CLOCK_TIMEOUT_S = 30.0
#: the Spark roles' niceness (their JVMs inherit it): on one busy machine the producers and
#: the worker come first. Two JVMs starting beside the demo's producers held the fleet's MQTT
#: path back: its readings came up to 39 and 49 minutes of event time behind the partition
#: clock under twice make run's load (two system tests at once), up to 22, 17 and 9 with it
SPARK_NICE = 10
#: the archive's JVM starts this long after the others: history can wait, and started beside
#: the rules' query it held that query's start and first micro-batch back. From the spark
#: role's start on this 2-core host, its first alert came at 44.6 to 69.5 s in nine runs with the
#: archive starting at once (at niceness 10 or 15 alike), 28.8 and 33.3 s in two without it
ARCHIVE_DELAY_S = 45.0
MOSQUITTO = Path("/usr/sbin/mosquitto")
APACHE_FILE = "apache_logs/apache_logs"


@dataclass(frozen=True)
class RunOptions:
    duration_s: float | None = None
    dashboard: bool = True
    quiet: bool = False
    fresh: bool = False
    #: the embedded broker with SASL/SCRAM and ACLs, one principal per role (``--no-auth``: off)
    auth: bool = True


def _py(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def local_secrets(data_dir: Path) -> dict[str, str]:
    """This data dir's own webhook and command secrets (``secrets.json``, mode 0600), made on
    first use; each variable the environment sets itself is left out, so the operator's wins."""
    path = data_dir / "secrets.json"
    try:
        kept: dict[str, str] = orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        kept = {}
    if not {"APP_WEBHOOK_SECRET", "APP_COMMAND_SECRET"} <= kept.keys():
        kept = {
            "APP_WEBHOOK_SECRET": "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode(),
            "APP_COMMAND_SECRET": secrets.token_urlsafe(32),
        }
        data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_bytes(orjson.dumps(kept))
    return {k: v for k, v in kept.items() if k not in os.environ}


def build_roles(
    settings: Settings, bootstrap: str, opts: RunOptions, users: dict[str, str] | None = None
) -> list[Role]:
    """The product's roles with their commands, environments and URLs.

    On the embedded broker each role's environment carries its own principal's Kafka
    credentials (``users`` from :func:`app.runtime.credentials.embedded_users`; plaintext when
    None), in its environment only; with an external cluster (``KAFKA_BOOTSTRAP_SERVERS``)
    the roles inherit the operator's ``KAFKA_*`` settings unchanged."""
    base_env = {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
        **local_secrets(settings.data_dir),
    }
    receiver_port = settings.receiver_port or free_port()
    receiver_url = f"http://127.0.0.1:{receiver_port}"
    webhook_url = settings.webhook_url or f"{receiver_url}/webhook"
    speed, limit = str(settings.replay_speedup), str(settings.replay_limit)
    roles: list[Role] = []

    def progress(role: str) -> list[str]:
        return ["--progress", str(progress_path(settings, role))]

    apache = settings.datasets_dir / APACHE_FILE
    missing = {series.role for series in NAB_SERIES if not (settings.datasets_dir / series.file).exists()}
    gate = demo_clock(settings, [r for r in ON_THE_NAB_AXIS if r not in missing])

    def clock(role: str) -> list[str]:
        return ["--clock-gate", str(gate), "--clock-party", role]

    for series in NAB_SERIES:
        if series.role in missing:
            logger.warning("no %s: %s is missing", series.role, settings.datasets_dir / series.file)
            continue
        # on the demo's axis: a series recorded on other dates is shifted there as a whole
        shift = [] if series.start == NAB_START else ["--shift-to", NAB_START]
        replay = [
            "ingest",
            "replay",
            str(settings.datasets_dir / series.file),
            *("--format", "nab", "--device", series.device, "--field", series.field),
            *("--kind", series.kind, "--from", series.start, *shift),
            *("--topic", SOURCE_TOPICS["sensors"], "--speedup", speed, *clock(series.role)),
            *("--limit", limit, *progress(series.role)),
        ]
        roles.append(Role(series.role, _py(*replay), one_shot=True, stage=1))
    if apache.exists():
        roles.append(
            Role(
                "replay-logs",
                _py(
                    "ingest",
                    "replay",
                    str(apache),
                    "--format",
                    "apache",
                    "--host",
                    "www-1",
                    "--topic",
                    SOURCE_TOPICS["logs"],
                    "--speedup",
                    speed,
                    "--limit",
                    limit,
                    *progress("replay-logs"),
                ),
                one_shot=True,
                stage=1,
            )
        )
    else:
        logger.warning("no log replay: %s is missing", apache)
    roles += _fleet_roles(settings, speed, clock("sim-fleet"))
    roles.append(
        Role(
            "sim-ticks",
            _py(
                "ingest",
                "simulate",
                "ticks",
                "--seed",
                "7",
                "--symbols",
                "AAPL,MSFT",
                "--start",
                NAB_START,
                "--mean-gap",
                "300",
                "--speedup",
                speed,
                *clock("sim-ticks"),
                *progress("sim-ticks"),
            ),
            stage=1,
        )
    )
    roles.append(
        Role(
            "worker",
            _py("agents", "worker", "--loglevel", settings.log_level.lower()),
            env={"APP_WORKER_INSTANCE_ID": worker_member_id(settings)},
            stage=2,
        )
    )
    # the Spark engine runs the rules marked engine: spark|both; with none it idles without a JVM
    roles.append(_spark_role("spark", _py("app", "spark", "--master", "local[2]", "--trigger", "2 seconds")))
    # every event topic to Parquet (APP_ARCHIVE_PATH, default $APP_DATA_DIR/archive): jobs/archive.py
    roles.append(_spark_role("archive", _py("app", "archive", "--master", "local[1]"), ARCHIVE_DELAY_S))
    deliver_env = {"APP_WEBHOOK_URL": webhook_url}
    if not settings.webhook_url:  # our own demo receiver on loopback: allow exactly that address
        deliver_env["APP_WEBHOOK_ALLOW_PRIVATE"] = ",".join(
            (*settings.webhook_allow_private, f"127.0.0.1:{receiver_port}")
        )
    roles.append(Role("dispatch", _py("app", "dispatch"), env=deliver_env, stage=3))
    roles.append(Role("store-sync", _py("app", "store-sync"), stage=3))
    roles.append(
        Role(
            "receiver",
            _py("app", "receiver"),
            env={"APP_RECEIVER_PORT": str(receiver_port)},
            stage=4,
            url=f"{receiver_url}/webhook (stats: {receiver_url}/stats)",
        )
    )
    if opts.dashboard:
        dash_port = (
            settings.dashboard_port
            if settings.dashboard_port and claim_port(settings.dashboard_port)
            else free_port()
        )
        dash_url = f"http://127.0.0.1:{dash_port}"
        roles.append(
            Role(
                "dashboard",
                _py(
                    "streamlit",
                    "run",
                    str(PROJECT_ROOT / "dashboard" / "streamlit_app.py"),
                    "--server.port",
                    str(dash_port),
                    "--server.address",
                    "127.0.0.1",
                    "--server.headless",
                    "true",
                    "--browser.gatherUsageStats",
                    "false",
                    "--client.toolbarMode",
                    "viewer",
                ),
                stage=4,
                url=dash_url,
                metrics=False,  # Streamlit's process: the console in it is what shows it is up
            )
        )
        if not settings.external_url:
            deliver_env["APP_EXTERNAL_URL"] = dash_url
    for role in roles:
        kafka_env = role_kafka_env(role.name, users) if settings.embedded else {}
        metrics = {"APP_METRICS_PORT": str(free_port())} if role.metrics else {}
        role.env = {**base_env, **kafka_env, **role.env, **metrics}
    return roles


def worker_member_id(settings: Settings) -> str:
    """The rule worker's static member id in its consumer group under ``make run``: the
    operator's ``APP_WORKER_INSTANCE_ID``, or one made of this host and the data directory,
    the same at every start of the same system and distinct between two systems on one
    cluster. The supervisor's restart of a crashed worker then takes its partitions back at
    once, instead of waiting for the dead one's session to end (docs/worker.md)."""
    if settings.worker_instance_id:
        return settings.worker_instance_id
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:200] or "host"
    place = hashlib.sha256(str(settings.data_dir.resolve()).encode()).hexdigest()[:12]
    return f"{host}-{place}-worker"


def _spark_role(name: str, argv: list[str], delay_s: float = 0.0) -> Role:
    """A role that runs a Spark driver: its web UI on a port of its own (two drivers would
    race for 4040), it stops its own JVM on SIGTERM (``Role.stops_children``), and it runs at
    ``SPARK_NICE``, ``delay_s`` after the supervisor's start."""
    port = free_port()
    return Role(
        name, argv, env={"APP_SPARK_UI_PORT": str(port)}, stage=2, stops_children=True,
        url=f"http://127.0.0.1:{port} (Spark UI, while its query runs)", nice=SPARK_NICE, delay_s=delay_s,
    )  # fmt: skip


def progress_path(settings: Settings, role: str) -> Path:
    """Where a producer role records how far it got (``--progress``), so a second run resumes."""
    return settings.data_dir / "ingest" / f"{role}.json"


def demo_clock(settings: Settings, parties: Sequence[str]) -> Path:
    """The clock gate (``--clock-gate``, :mod:`app.runtime.clockgate`) the demo's producers on
    the NAB axis (``parties``) share: its file's path.

    Paced each from its own first event, they ran as far apart as their first events went;
    on a schedule fixed 5 s ahead, as far as the slowest start overran it. The fleet waits for
    its MQTT bridge, which took 5 s on 2 busy cores: its readings came 85 minutes of event
    time (1.7 s at speed-up 3000) behind the NAB replay's on the partition they share, the
    replay's readings drove the partition clock, and the fleet devices there looked silent
    (18 false ``device-silent`` alerts in two short runs). On the gate the clock starts once
    every producer is ready. A fresh data dir starts it at ``NAB_START``; a later run goes on
    from the event time it had reached when its producers last recorded their progress (at
    their stop, or their last checkpoint), or from where it was when it never started.
    """
    path = settings.data_dir / "ingest" / DEMO_CLOCK_FILE
    remedy = "remove it to restart the demo's clock at its start, or run with --fresh"
    event_ms = parse_ts(NAB_START)
    # not read_spec: a data dir from before the gate holds {wall_s, event_ms, speedup}, and
    # the next event time needs those three alone
    prev = read_json(path, "the demo's clock", remedy, ConfigError)
    reached = _progress_written(settings)
    if prev is not None and reached is not None:
        try:
            prev_ms, speedup = int(prev["event_ms"]), float(prev["speedup"])
            wall_s = None if prev.get("wall_s") is None else float(prev["wall_s"])
        except (AttributeError, KeyError, TypeError, ValueError):
            msg = f"{path}: expected event_ms, speedup and, once started, wall_s; got {prev!r}; {remedy}"
            raise ConfigError(msg) from None
        event_ms = prev_ms + (0 if wall_s is None else max(0, int((reached - wall_s) * 1000 * speedup)))
    others = {"speedup": settings.replay_speedup}
    write_gate(path, GateSpec(event_ms, tuple(parties), CLOCK_LEAD_S, CLOCK_TIMEOUT_S, others=others))
    return path


def _progress_written(settings: Settings) -> float | None:
    """When a producer on the NAB axis last recorded its progress (Unix seconds); None when
    none has (a fresh data dir, or one whose producers never sent)."""
    times = []
    for role in ON_THE_NAB_AXIS:
        try:
            record = orjson.loads(progress_path(settings, role).read_bytes())
            times.append(parse_ts(record["updated_at"], "updated_at") / 1000)
        except (OSError, ValueError, KeyError, TypeError, AppError):
            continue  # none, or unreadable: the producer itself says so when it starts
    return max(times, default=None)


def _fleet_roles(settings: Settings, speed: str, clock: list[str]) -> list[Role]:
    """The simulated fleet, its registry, and the MQTT path it reports through.

    The simulator publishes to a local mosquitto (when installed) and the MQTT
    bridge forwards to ``events.sensors``; without mosquitto it publishes to
    Kafka directly. It runs at the NAB replay's speed-up on their clock (``clock``: its
    options, see :func:`demo_clock`), so both share one event-time axis
    (9 devices, one reading every 5 minutes of event time each). The simulator writes the registry CSV (the
    same rows on every run, atomically); the registry role waits for it and
    skips the load when its progress file says these rows were loaded before.
    """
    registry = settings.data_dir / "fleet-devices.csv"
    registry.unlink(missing_ok=True)  # the registry role waits for this run's simulator to write it
    registry_progress = progress_path(settings, "registry")
    sim = [
        "ingest",
        "simulate",
        "fleet",
        "--seed",
        "42",
        "--sensors",
        "6",
        "--vehicles",
        "3",
        "--interval",
        "300",
        "--start",
        NAB_START,
        "--speedup",
        speed,
        *clock,
        "--write-registry",
        str(registry),
        "--progress",
        str(progress_path(settings, "sim-fleet")),
    ]
    roles = [
        Role(
            "registry",
            _py("ingest", "registry", "devices", str(registry), "--progress", str(registry_progress)),
            one_shot=True,
            stage=1,
            requires_file=registry,
        )
    ]
    if not MOSQUITTO.exists():
        logger.warning("mosquitto is not installed: the fleet publishes to Kafka directly (no MQTT bridge)")
        return [*roles, Role("sim-fleet", _py(*sim), stage=1)]
    port = free_port()
    conf = settings.data_dir / "mosquitto.conf"
    store = settings.data_dir / "mosquitto"
    store.mkdir(parents=True, exist_ok=True)
    conf.write_text(mosquitto_conf(port, store))
    broker = f"127.0.0.1:{port}"
    ready = settings.data_dir / "mqtt-bridge.ready"
    ready.unlink(missing_ok=True)  # the simulator waits for this run's bridge to subscribe
    bridge = ["ingest", "mqtt", "--broker", broker, "--map", "fleet/+device_id/state"]
    bridge += ["--ready-file", str(ready)]
    return [
        *roles,
        Role("mosquitto", [str(MOSQUITTO), "-c", str(conf)], stage=4, url=f"mqtt://{broker}", metrics=False),
        Role("mqtt-bridge", _py(*bridge), stage=2),
        Role("sim-fleet", _py(*sim, "--mqtt", broker), stage=1, requires_file=ready),
    ]


def mosquitto_conf(port: int, store: Path) -> str:
    """mosquitto's config for ``make run``: loopback only, and persistent in ``store``, so the
    bridge's session (its subscription and the messages queued for it when a run stops)
    survives into the next run; saved at a clean stop and every 10 s. The queue holds what a
    lagging bridge has not taken yet (mosquitto drops beyond it). ``user``: mosquitto started
    by root would switch to the ``mosquitto`` user and could not write ``store`` (the option
    is ignored when it is not started by root). ``log_type``: errors, warnings and notices;
    its information lines said "Saving in-memory database" at every save, six a minute, in
    ``make run``'s output (the bridge logs its own connection)."""
    return (
        f"listener {port} 127.0.0.1\nallow_anonymous true\nuser {getpass.getuser()}\n"
        f"persistence true\npersistence_location {store}/\nautosave_interval 10\n"
        "max_queued_messages 1000000\nlog_type error\nlog_type warning\nlog_type notice\n"
    )


def _http_json(url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own loopback URL
            data: dict[str, Any] = orjson.loads(resp.read())
            return data
    except (OSError, ValueError):
        return None


def counters(bootstrap: Target, receiver_stats: dict[str, Any] | None, started: float) -> dict[str, Any]:
    """Events per topic, DLQ, alerts (records ever written) and webhooks the receiver got."""
    topics = [*SOURCE_TOPICS.values(), DLQ, ALERTS, NOTIFICATIONS]
    try:
        ends = asyncio.run(end_offsets(bootstrap, topics))
    except Exception as exc:  # the counters are a report; a failure must not hide the exit
        logger.warning("could not read topic offsets: %s", exc)
        ends = {}
    return {
        "events": {t: ends.get(t) for t in SOURCE_TOPICS.values()},
        "dlq": ends.get(DLQ),
        "alerts": ends.get(ALERTS),
        "notification_log": ends.get(NOTIFICATIONS),
        "webhooks_delivered": None if receiver_stats is None else receiver_stats.get("unique_alerts"),
        "webhook_requests": None if receiver_stats is None else receiver_stats.get("received"),
        "duration_s": round(time.monotonic() - started, 1),
    }


def _print_urls(
    bootstrap: str,
    roles: list[Role],
    broker: KafkaBroker | None,
    console_lines: Sequence[str] = (),
    client_env: Path | None = None,
) -> None:
    kafka = bootstrap
    if broker is not None:
        how = "SASL/SCRAM + ACLs" if broker.acls else "plaintext, no ACLs (--no-auth)"
        kafka += f" (embedded Apache Kafka {kafka_version()}, {how}, ready in {broker.ready_s or 0:.1f} s)"
    lines = [f"  kafka       {kafka}"]
    if client_env is not None:
        lines.append(f"  operator    python -m app alerts ... (as User:{CONSOLE}: {client_env})")
    for r in roles:
        if r.url:
            lines.append(f"  {r.name:<11} {r.url}")
    for r in roles:
        if r.metrics:
            lines.append(f"  metrics     http://127.0.0.1:{r.env['APP_METRICS_PORT']}/metrics ({r.name})")
    lines += list(console_lines)
    print("streamalert is starting:\n" + "\n".join(lines), flush=True)


#: What a data dir holds that remembers broker data (offsets, alert ids, progress).
STATEFUL = ("dispatch.sqlite3", "alerts.sqlite3", "ingest", "faust", "spark", "archive", "mosquitto")


#: how often ``make run`` looks for rule files that branch to a topic its engines may not write
BRANCH_CHECK_S = 2.0


class BranchAcls:
    """Grants the engines each branch topic the rule files name, as they change while the run
    goes on. ``make run`` writes its ACLs at the start, with the branch topics of the rules then;
    a rule file added later that branched to a new topic had its reload postponed for as long as
    the run lasted (the worker may not create the topic, and keeps its last good rules), where
    every other rule file is taken within about 2 s. Needs the embedded broker's administrator."""

    def __init__(self, admin: Target, rules_dir: Path, granted: Sequence[str]) -> None:
        self.admin = admin
        self.rules_dir = rules_dir
        self.granted = set(granted)
        self._key = files_key(rules_dir)
        self._next = 0.0

    def poll(self, now: float) -> list[str]:
        """At most every ``BRANCH_CHECK_S`` (``now``: ``time.monotonic()``), when a rule file
        changed: grant the branch topics not granted yet; the topics granted now."""
        if now < self._next:
            return []
        self._next = now + BRANCH_CHECK_S
        key = files_key(self.rules_dir)
        if key == self._key:
            return []
        new = sorted(set(rule_branch_topics(self.rules_dir)) - self.granted)
        if new:
            try:
                asyncio.run(apply_acls(self.admin, ENGINES, extra=branch_grants(new)))
            except (AppError, OSError) as exc:  # the next check tries again
                logger.warning("could not grant the engines the branch topic(s) %s: %s", ", ".join(new), exc)
                return []
            self.granted.update(new)
            logger.info("granted the engines the branch topic(s) %s of the edited rules", ", ".join(new))
        self._key = key
        return new


def wipe(data_dir: Path) -> None:
    """Remove everything ``make run`` keeps in ``data_dir`` (``--fresh``), but the run's lock,
    which the run that wipes holds (``app.runtime.runlock``): the folder too when none is there."""
    if not data_dir.is_dir():
        return
    for entry in data_dir.iterdir():
        if entry.name == runlock.LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        data_dir.rmdir()  # empty: no lock was there


def check_consistent(settings: Settings) -> None:
    """Refuse a data dir whose embedded broker state is gone while state derived from it stays.

    The dispatcher remembers the alert ids it delivered, the replays how far they got, and
    Spark its offsets; on an empty broker those would silence or skip the new run's data.
    """
    if not settings.embedded or (settings.data_dir / "kafka" / "log" / "meta.properties").exists():
        return
    left = [name for name in STATEFUL if (settings.data_dir / name).exists()]
    if left:
        msg = (
            f"{settings.data_dir} holds state from an earlier run ({', '.join(left)}) but not its "
            "Kafka log dir (kafka/log): run `python -m app run --fresh` (or `make clean`) to start "
            "from nothing"
        )
        raise ConfigError(msg)


def restart_broker(broker: KafkaBroker) -> None:
    """Start the embedded broker again on its log dir after it died; the roles ride out the
    gap (their clients reconnect to the same address: the broker keeps its ports)."""
    logger.error(
        "the embedded Kafka broker exited (see %s); restarting it on %s", broker.output, broker.log_dir
    )
    broker.start()


def run(settings: Settings, opts: RunOptions) -> int:
    """Run until Ctrl-C, SIGTERM or the end of ``opts.duration_s``; return the exit code.
    Raises ConfigError when another run, or the roles of a dead one, hold the data dir."""
    started = time.monotonic()
    force = threading.Event()  # a second Ctrl-C: kill what is left, now
    stop = stop_on_signals("everything", force)
    lock = runlock.hold(settings.data_dir, stop)
    try:
        return _run(settings, opts, started, stop, force, lock)
    finally:
        os.close(lock)


def _run(
    settings: Settings,
    opts: RunOptions,
    started: float,
    stop: threading.Event,
    force: threading.Event,
    lock: int,
) -> int:
    if opts.fresh:
        wipe(settings.data_dir)
    check_consistent(settings)
    users = embedded_users(settings.data_dir) if settings.embedded and opts.auth else None
    broker = (
        KafkaBroker(settings.data_dir / "kafka", sasl_users=users, acls=users is not None)
        if settings.embedded
        else None
    )
    (settings.data_dir / "logs").mkdir(parents=True, exist_ok=True)
    if broker is not None:
        broker.start(stop=stop)
    bootstrap = broker.bootstrap if broker else settings.bootstrap_servers
    # topics, ACLs and counters: as the embedded broker's own user, or with the operator's settings
    admin: Target = Endpoint(broker.bootstrap, broker.admin_auth) if broker else settings
    client_env: Path | None = None
    sup: Supervisor | None = None

    def stopped_while_starting() -> bool:  # Ctrl-C while the broker, topics or ACLs started
        stopped = stop.is_set()
        if stopped:
            logger.info("stopped while starting: no role was started")
        return stopped

    try:
        if stopped_while_starting():
            return 0
        asyncio.run(ensure_topics(admin, settings.partitions, settings.replication_factor))
        branches: BranchAcls | None = None
        if users is not None:
            topics = rule_branch_topics(settings.rules_dir)
            asyncio.run(apply_acls(admin, extra=branch_grants(topics)))
            branches = BranchAcls(admin, settings.rules_dir, topics)
        roles = build_roles(settings, bootstrap, opts, users)
        if stopped_while_starting():
            return 0
        if broker is not None:
            console = role_auth(users, CONSOLE) if users is not None else KafkaAuth()
            secret = (
                local_secrets(settings.data_dir).get("APP_COMMAND_SECRET")
                or settings.command_secret.get_secret_value()
            )
            client_env = write_client_env(settings.data_dir, bootstrap, console, secret)
        console_lines = prepare_console(settings.data_dir, roles)
        sup = Supervisor(settings, roles, settings.data_dir / "logs", quiet=opts.quiet,
                         state_file=settings.data_dir / ROLE_STATES_FILE, hold_fds=(lock,))  # fmt: skip
        sup.start()
        _print_urls(bootstrap, roles, broker, console_lines, client_env)
        deadline = None if opts.duration_s is None else started + opts.duration_s
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            sup.poll()
            if broker is not None and not broker.running():
                restart_broker(broker)
            if branches is not None:
                branches.poll(time.monotonic())
            stop.wait(0.2)
        receiver = next((r for r in roles if r.name == "receiver"), None)
        stats: dict[str, Any] | None = None

        def after_stage(stage: int) -> None:
            nonlocal stats
            if stage == 3 and receiver is not None:  # deliveries are done; the receiver still runs
                port = receiver.env["APP_RECEIVER_PORT"]
                stats = _http_json(f"http://127.0.0.1:{port}/stats")

        sup.stop(after_stage, force=force)
        sup = None
        print(orjson.dumps(counters(admin, stats, started)).decode(), flush=True)
        return 0
    finally:
        if sup is not None:
            sup.stop(force=force)
        if client_env is not None:
            client_env.unlink(missing_ok=True)
        if broker is not None:
            broker.stop(force=force)
