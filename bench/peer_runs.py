"""The Quix Streams peer (``quix_peer.py``) beside the rule worker: its environment, its run
and its alerts' agreement with the worker's.

Used by ``bench_rules.py``. The peer runs in its own virtual environment,
``.cache/bench-quix``, created on first use from ``bench/requirements-quix.txt`` (quixstreams
pins its own confluent-kafka, pydantic and orjson, so it stays out of the project's
requirements) and reused while that file is unchanged. Without network access or a wheel for
this platform the bench says so and goes on without the peer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import orjson
from worker_runs import ROOT, create_topics, log_tail, read_all, worker_process

from app.events import parse_ts
from app.topics import ALERTS, LOGS, SENSORS

logger = logging.getLogger(__name__)

VENV = ROOT / ".cache" / "bench-quix"
REQUIREMENTS = ROOT / "bench" / "requirements-quix.txt"
PEER = ROOT / "bench" / "quix_peer.py"
OUT_TOPIC = "bench.quix.alerts"
#: the pack's rules the peer implements, and the label that keys each
RULE_KEYS = {"t-0": "device_id", "machine-hourly-heat": "device_id", "not-found-scan": "client_ip"}
RULE_KINDS = {
    "t-0": "threshold",
    "machine-hourly-heat": "tumbling 1 h avg",
    "not-found-scan": "sliding 1 min count",
}
INSTALL_TIMEOUT_S = 600.0


def keep_peer_topics(bootstrap: str, partitions: int) -> None:
    """Create the topics the peer reads and writes with no time-based retention, before
    ``ensure_topics``. Quix stamps what it produces (its output, its repartition topic) with
    the event time, here 2013-2015, and Kafka's retention (7 days by default, checked 30 s after
    start and every 5 min) would delete those records within minutes. A repartition topic takes
    its source topic's retention; the worker stamps its records with the time of sending."""
    forever = {"retention.ms": "-1"}
    topics = {SENSORS: (partitions, forever), LOGS: (partitions, forever), OUT_TOPIC: (1, forever)}
    asyncio.run(create_topics(bootstrap, topics))


def quix_python() -> Path | None:
    """The peer environment's interpreter, installed from ``REQUIREMENTS`` when missing or stale;
    None (with the reason printed) when it cannot be installed."""
    stamp = VENV / f".installed-{hashlib.sha1(REQUIREMENTS.read_bytes()).hexdigest()[:12]}"  # noqa: S324
    python = VENV / "bin" / "python"
    if stamp.exists() and python.exists():
        return python
    print(f"creating the Quix Streams peer's environment in {VENV} (once; about 20 s)", flush=True)
    try:
        if not python.exists():
            subprocess.run(
                [sys.executable, "-m", "venv", str(VENV)], check=True, timeout=120, capture_output=True
            )
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run(
            [*pip, "-r", str(REQUIREMENTS)], check=True, timeout=INSTALL_TIMEOUT_S, capture_output=True
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        print(f"the Quix Streams peer is skipped: its environment could not be installed ({exc}) "
              f"{detail.decode(errors='replace')[-500:]}")  # fmt: skip
        return None
    for old in VENV.glob(".installed-*"):
        old.unlink()
    stamp.touch()
    return python


@dataclass
class PeerRun:
    """The peer's events/s: its source events over the time from its first handled message to
    its last (of any topic, its repartition topic included)."""

    events: int
    seconds: float
    startup_s: float  # from the start of the process to its first message
    done: bool

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def describe(self, expect: int) -> str:
        started = f"first message {self.startup_s:.1f} s after start"
        if self.done:
            return f"{self.rate:,.0f} events/s ({self.events:,} events; {started})"
        return f"{self.rate:,.0f} events/s (INCOMPLETE: {self.events:,} of {expect:,} events; {started})"


def run_peer(
    python: Path, bootstrap: str, tmp: Path, name: str, expect: int, timeout_s: float = 150.0
) -> PeerRun:
    """Run the peer over the topics' current contents until it has been idle 3 s (at most ``timeout_s``)."""
    result = tmp / f"{name}-result.json"
    cmd = [
        str(python), str(PEER), "--bootstrap", bootstrap, "--group", f"bench-quix-{name}", "--out", OUT_TOPIC,
        "--state-dir", str(tmp / f"{name}-state"), "--result", str(result),
    ]  # fmt: skip
    log = tmp / f"{name}.log"
    began = time.perf_counter()
    with worker_process(cmd, dict(os.environ), log) as proc:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"the Quix peer did not finish within {timeout_s:.0f} s")
    if not result.exists():
        print(f"the Quix peer wrote no result; its log ends:\n{log_tail(log)}")
        return PeerRun(0, 0.0, float("nan"), False)
    progress = json.loads(result.read_text())
    # perf_counter is CLOCK_MONOTONIC on Linux, one clock for both processes
    seconds = progress["last"] - progress["first"]
    return PeerRun(progress["events"], seconds, progress["first"] - began, progress["events"] >= expect)


def firings(bootstrap: str) -> tuple[Counter[tuple[str, str, int]], Counter[tuple[str, str, int]]]:
    """The firing transitions of the three rules, as (rule, key, time) with their multiplicity:
    the worker's from ``alerts`` (time: ``starts_at``) and the peer's from its output topic."""
    ours: Counter[tuple[str, str, int]] = Counter()
    for raw in asyncio.run(read_all(bootstrap, ALERTS)):
        alert = orjson.loads(raw)
        rule = alert["rule_id"]
        if rule in RULE_KEYS and alert["status"] == "firing":
            ours[(rule, str(alert["labels"].get(RULE_KEYS[rule])), parse_ts(alert["starts_at"]))] += 1
    theirs: Counter[tuple[str, str, int]] = Counter()
    for raw in asyncio.run(read_all(bootstrap, OUT_TOPIC)):
        fired = orjson.loads(raw)
        theirs[(fired["rule"], str(fired["key"]), int(fired["at"]))] += 1
    return ours, theirs


def report_agreement(bootstrap: str) -> None:
    """Per rule: firings found by both, by the worker only, by the peer only."""
    ours, theirs = firings(bootstrap)
    for rule, kind in RULE_KINDS.items():
        mine = Counter({k: n for k, n in ours.items() if k[0] == rule})
        peer = Counter({k: n for k, n in theirs.items() if k[0] == rule})
        matched, only_ours, only_quix = (sum(c.values()) for c in (mine & peer, mine - peer, peer - mine))
        print(
            f"  agreement, {rule} ({kind}): {matched:,} firings matched, {only_ours:,} only ours, "
            f"{only_quix:,} only Quix (of {sum(mine.values()):,} ours, {sum(peer.values()):,} Quix's)"
        )
        for label, extra in (("only ours", mine - peer), ("only Quix", peer - mine)):
            shown = sorted(extra)[:3]
            if shown:
                print(f"    {label}, first ones: " + ", ".join(f"{k[1]} at {k[2]}" for k in shown))


SEMANTICS = """\
  how the peer's rules differ from the worker's (by design, not by mistake):
    - every Quix window closes by event time per key, except a tumbling window with
      closing_strategy="partition"; the sliding window supports only "key": a client IP's
      last window closes only when that IP sends again 2 min later, where the worker's
      per-partition watermark (its regroup topic's) closes it as other IPs' events come;
    - Quix's sliding window is [t - 1 min, t], inclusive at both ends; the worker's is
      (t - 1 min, t]. The peer counts over the worker's span from the window's event times;
    - an event is late for Quix when it is older than its key's newest minus the grace (and
      the window size for a sliding window); for the worker, when it is behind its partition's
      watermark (threshold: behind its group's newest event);
    - the peer keeps its state in RocksDB with a changelog topic per store, the worker in a
      Faust table with its changelog; both commit at least once (Quix every 5 s, the worker
      every 1 s)."""
