"""Pipeline health for the console: roles up or down, events/s per topic, consumer lag, DLQ
rate and the age of the newest event.

A :class:`HealthSampler` thread takes a :class:`HealthSample` every ``interval_s`` and keeps
the latest two; a console refresh only reads them (no I/O on the refresh path). A sample:

- **roles**: ``APP_DATA_DIR/roles.json`` (written by ``python -m app run``: each role's name
  and ``/metrics`` URL) and ``roles-state.json`` (the supervisor's view of each process:
  running, waiting, restarting, done, failed); a running role is *up* when its
  ``/metrics`` answers within 0.5 s (or it serves none, as mosquitto), *starting* until
  then; without the supervisor's file, *up* is the ``/metrics`` answer alone;
- **topics** (with ``KAFKA_BOOTSTRAP_SERVERS``): each source topic's, the DLQ's and the
  alerts topic's end offsets (ListOffsets, no records read); rates are the difference
  between two samples;
- **lag**: the committed offsets of the worker (``streamalert-rules``), dispatcher and store
  groups against the end offsets; the Spark query's from its checkpoint's latest offsets
  file (Spark keeps its offsets there, not in a group);
- **newest event**: the timestamp of the last record of each source partition (one record
  fetched per partition).

Kafka's client is imported inside the sampler only, so the console page loads without it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from app.kafka.clients import Target

logger = logging.getLogger(__name__)

ROLES_FILE = "roles.json"
#: the supervisor's process state of each role (:meth:`app.runtime.supervisor.Supervisor.states`)
ROLE_STATES_FILE = "roles-state.json"
GROUPS = {"worker": "streamalert-rules", "dispatcher": "dispatcher", "store-sync": "alert-store"}
PROBE_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class RoleState:
    """One role as the console shows it: ``up`` (working), and ``status``: ``up``,
    ``starting`` (running, its /metrics not answering yet), ``waiting`` (not started: it
    waits for another role), ``done`` (a one-shot role finished), ``restarting (N crashes)``,
    ``failed`` (given up after crashes), ``stopped``, or ``DOWN`` (no supervisor's view and
    no /metrics answer)."""

    name: str
    up: bool
    metrics_url: str | None
    one_shot: bool = False
    status: str = ""

    @property
    def label(self) -> str:
        if self.status:
            return self.status
        return "up" if self.up else ("done/down" if self.one_shot else "DOWN")


@dataclass(frozen=True)
class HealthSample:
    """One reading. ``ends`` and ``lag`` are {} without a broker; ``error`` says why."""

    at: float
    roles: tuple[RoleState, ...] = ()
    ends: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int | None] = field(default_factory=dict)
    newest_event_ms: int | None = None
    error: str = ""


def write_roles_file(data_dir: Path, roles: list[dict[str, Any]]) -> Path:
    """Write ``roles.json`` (name, metrics URL, one_shot per role) for the console."""
    path = data_dir / ROLES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps({"roles": roles}))
    tmp.replace(path)
    return path


def read_roles(data_dir: Path) -> list[dict[str, Any]]:
    try:
        roles: list[dict[str, Any]] = orjson.loads((data_dir / ROLES_FILE).read_bytes())["roles"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return roles


def read_role_states(data_dir: Path) -> dict[str, dict[str, Any]]:
    """The supervisor's process state per role name ({} without the file)."""
    try:
        states: list[dict[str, Any]] = orjson.loads((data_dir / ROLE_STATES_FILE).read_bytes())["roles"]
        return {str(s["name"]): s for s in states}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def role_status(process: dict[str, Any] | None, answers: bool | None) -> tuple[bool, str]:
    """``(up, status)`` of a role from the supervisor's ``process`` state (None: unknown) and
    whether its /metrics answered (None: it serves none)."""
    if process is None:
        return bool(answers), ""
    state = str(process.get("state", ""))
    crashes = int(process.get("crashes") or 0)
    why = f": {process['last_error']}" if process.get("last_error") else ""
    if state == "running":
        if answers is None or answers:
            return True, "up" if not crashes else f"up ({crashes} recent crash{'es' if crashes > 1 else ''})"
        return False, "starting"
    if state in ("restarting", "crash-looping"):
        retry_at = process.get("retry_at")
        soon = f"; next try in {max(0, round(float(retry_at) - time.time()))} s" if retry_at else ""
        many = f"{crashes} crash{'es' if crashes > 1 else ''}"
        if state == "crash-looping":
            many += " in a row"
        return False, f"{state} ({many}, exit {process.get('exit_code')}{soon}){why}"
    return state == "done", state or "unknown"


def _probe(url: str | None) -> bool | None:
    if url is None:
        return None
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as resp:  # noqa: S310 - our loopback URL
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


def probe_roles(data_dir: Path) -> tuple[RoleState, ...]:
    roles = read_roles(data_dir)
    if not roles:
        return ()
    processes = read_role_states(data_dir)
    with ThreadPoolExecutor(max_workers=min(8, len(roles))) as pool:
        answers = list(pool.map(lambda r: _probe(r.get("metrics")), roles))
    out = []
    for r, answer in zip(roles, answers, strict=True):
        up, status = role_status(processes.get(r["name"]) if processes else None, answer)
        out.append(RoleState(r["name"], up, r.get("metrics"), bool(r.get("one_shot")), status))
    return tuple(out)


def spark_lag(data_dir: Path, ends: dict[tuple[str, int], int]) -> int | None:
    """The Spark query's lag: end offsets minus its checkpoint's latest planned offsets."""
    offsets_dir = data_dir / "spark" / "checkpoints"
    try:
        files = [p for p in offsets_dir.glob("*/offsets/*") if p.name.isdigit()]
    except OSError:
        return None
    if not files:
        return None
    latest = max(files, key=lambda p: int(p.name))
    try:
        line = latest.read_text().strip().splitlines()[-1]
        planned: dict[str, dict[str, int]] = orjson.loads(line)
    except (OSError, ValueError, IndexError):
        return None
    lag = 0
    for topic, parts in planned.items():
        if not isinstance(parts, dict):
            return None
        for part, off in parts.items():
            lag += max(0, ends.get((topic, int(part)), off) - off)
    return lag


async def _kafka(target: Target, topics: list[str], sources: list[str], timeout_s: float) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient

    from app.kafka.clients import connection, partitions_of, stop_consumer

    tps = await partitions_of(target, topics, timeout_s)
    consumer = AIOKafkaConsumer(**connection(target), enable_auto_commit=False)
    admin = AIOKafkaAdminClient(**connection(target), request_timeout_ms=int(timeout_s * 1000))
    await asyncio.wait_for(consumer.start(), timeout_s)
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        ends = {(tp.topic, tp.partition): n for tp, n in (await consumer.end_offsets(tps)).items()}
        lag: dict[str, int | None] = {}
        for role, group in GROUPS.items():
            try:
                committed = await asyncio.wait_for(admin.list_consumer_group_offsets(group), timeout_s)
            except Exception as exc:  # a group that does not exist yet: no lag to show
                logger.debug("offsets of group %s: %r", group, exc)
                lag[role] = None
                continue
            if not committed:
                lag[role] = None
                continue
            lag[role] = sum(
                max(0, ends.get((tp.topic, tp.partition), 0) - meta.offset)
                for tp, meta in committed.items()
                if (tp.topic, tp.partition) in ends and meta.offset >= 0
            )
        newest: int | None = None
        last = [tp for tp in tps if tp.topic in sources and ends.get((tp.topic, tp.partition), 0) > 0]
        if last:
            consumer.assign(last)
            for tp in last:
                consumer.seek(tp, ends[(tp.topic, tp.partition)] - 1)
            got = await consumer.getmany(*last, timeout_ms=int(timeout_s * 1000 / 2))
            stamps = [rec.timestamp for recs in got.values() for rec in recs]
            newest = max(stamps) if stamps else None
        return {"ends": ends, "lag": lag, "newest": newest}
    finally:
        await stop_consumer(consumer)
        await admin.close()


def take_sample(data_dir: Path, target: Target, timeout_s: float = 3.0) -> HealthSample:
    """One reading of every source (see the module docstring); never raises. ``target``: the
    cluster, with the console's credentials when it has them (``Settings`` or an ``Endpoint``;
    a bare ``host:port`` connects without)."""
    from app.kafka.clients import bootstrap_of
    from app.topics import ALERTS, DLQ, SOURCE_TOPICS

    roles = probe_roles(data_dir)
    if not bootstrap_of(target):
        return HealthSample(time.time(), roles, error="KAFKA_BOOTSTRAP_SERVERS is not set")
    sources = list(SOURCE_TOPICS.values())
    try:
        got = asyncio.run(
            asyncio.wait_for(_kafka(target, [*sources, DLQ, ALERTS], sources, timeout_s), timeout_s * 3)
        )
    except Exception as exc:  # the broker is down or slow: say so on the page
        return HealthSample(time.time(), roles, error=f"Kafka unreachable: {exc!r}")
    per_tp: dict[tuple[str, int], int] = got["ends"]
    ends: dict[str, int] = {}
    for (topic, _p), n in per_tp.items():
        ends[topic] = ends.get(topic, 0) + n
    lag = dict(got["lag"])
    lag["spark"] = spark_lag(data_dir, per_tp)
    return HealthSample(time.time(), roles, ends, lag, got["newest"])


def rates(prev: HealthSample | None, cur: HealthSample) -> dict[str, float]:
    """Records/s per topic between two samples ({} without two samples with offsets)."""
    if prev is None or not prev.ends or not cur.ends or cur.at <= prev.at:
        return {}
    dt = cur.at - prev.at
    return {t: max(0, n - prev.ends.get(t, n)) / dt for t, n in cur.ends.items()}


class HealthSampler:
    """A daemon thread sampling every ``interval_s``; :meth:`latest` gives (previous, latest).

    A sample that raises is logged and skipped: the thread died with it before, and the
    console's health panel then froze on its last sample for good."""

    def __init__(
        self,
        sample: Callable[[], HealthSample],
        interval_s: float = 5.0,
    ) -> None:
        self._sample = sample
        self._interval = interval_s
        self._lock = threading.Lock()
        self._prev: HealthSample | None = None
        self._cur: HealthSample | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-health", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                s = self._sample()
            except Exception as exc:  # one failed sample must not end the sampling
                if not threading.main_thread().is_alive():
                    return  # the console's process is exiting: its thread pools refuse work
                logger.warning("console health: a sample failed, showing the previous one: %r", exc)
            else:
                with self._lock:
                    self._prev, self._cur = self._cur, s
            self._stop.wait(self._interval)

    def latest(self) -> tuple[HealthSample | None, HealthSample | None]:
        with self._lock:
            return self._prev, self._cur

    def stop(self) -> None:
        self._stop.set()


def scrape(url: str, prefix: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of ``url``'s /metrics whose name starts with ``prefix`` ([] when it does
    not answer)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as resp:  # noqa: S310 - our loopback URL
            text = resp.read().decode()
    except (OSError, ValueError):
        return []
    return [
        (s.name, dict(s.labels), float(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith(prefix)
    ]


def worker_stats(data_dir: Path) -> dict[str, Any]:
    """From the worker's /metrics: alerts per rule, events per source, events each rule
    evaluated (``rule_events``) and matched (``rule_matched``), reloads per outcome; {} when
    the worker is not running (or not under ``python -m app run``)."""
    role = next((r for r in read_roles(data_dir) if r["name"] == "worker"), None)
    if role is None:
        return {}
    samples = scrape(role["metrics"], "worker_")
    if not samples:
        return {}
    alerts: dict[str, float] = {}
    events: dict[str, float] = {}
    reloads: dict[str, float] = {}
    per_rule: dict[str, dict[str, float]] = {"worker_rule_events_total": {}, "worker_rule_matched_total": {}}
    for name, labels, value in samples:
        if name == "worker_alerts_total":
            alerts[labels["rule"]] = alerts.get(labels["rule"], 0) + value
        elif name == "worker_events_total":
            events[labels["source"]] = value
        elif name in per_rule:
            per_rule[name][labels["rule"]] = value
        elif name == "worker_rule_reloads_total":
            reloads[labels["outcome"]] = value
    return {"alerts": alerts, "events": events, "reloads": reloads,
            "rule_events": per_rule["worker_rule_events_total"],
            "rule_matched": per_rule["worker_rule_matched_total"]}  # fmt: skip
