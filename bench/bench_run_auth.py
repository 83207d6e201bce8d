"""`make run` with and without authentication on its embedded broker: what SASL/SCRAM and
ACLs cost at start.

Run: ``.venv/bin/python bench/bench_run_auth.py [--seconds S] [--speedup X]``. It runs
``python -m app run --no-dashboard --quiet --duration S`` (90) on a new temporary data dir,
once with authentication (the default) and once with ``--no-auth``, one after the other, and
prints per run, each from the command's start:

* **broker ready**: the broker's own figure on the ``kafka`` line (JVM start to the first
  answered metadata request; with auth it includes writing the SCRAM credentials);
* **roles started**: when the banner appears (topics created, ACLs written, roles spawned);
* **first alert**: the first alert transition in the alert store (written by store-sync);
* **first webhook**: the first alert the demo receiver got (``/stats``).

One run each, on whatever else the host runs: the figures move by seconds between runs on
the shared 2-core host; compare the two lines of one invocation only.
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent


def _first_alert(store: Path) -> bool:
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=0.5) as db:
            return db.execute("SELECT 1 FROM transitions LIMIT 1").fetchone() is not None
    except sqlite3.Error:
        return False


def _webhooks(stats_url: str) -> int:
    try:
        with urllib.request.urlopen(stats_url, timeout=1) as resp:  # noqa: S310 - our loopback receiver
            return int(orjson.loads(resp.read()).get("unique_alerts") or 0)
    except (OSError, ValueError):
        return 0


def one_run(auth: bool, seconds: float, speedup: str) -> dict[str, float | None]:
    with tempfile.TemporaryDirectory(prefix="bench-run-auth-") as tmp:
        data = Path(tmp) / "data"
        out = Path(tmp) / "run.log"
        env = {
            **os.environ,
            "APP_DATA_DIR": str(data),
            "APP_REPLAY_SPEEDUP": speedup,
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
        cmd = [sys.executable, "-m", "app", "run", "--no-dashboard", "--quiet", "--duration", str(seconds)]
        began = time.monotonic()
        marks: dict[str, float | None] = {"broker_ready_s": None, "roles_started_s": None,
                                          "first_alert_s": None, "first_webhook_s": None}  # fmt: skip
        with out.open("wb") as log:
            proc = subprocess.Popen([*cmd, *([] if auth else ["--no-auth"])], env=env, cwd=ROOT,
                                    stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            stats_url = ""
            try:
                while proc.poll() is None:
                    now = time.monotonic() - began
                    text = out.read_text(errors="replace")
                    if marks["roles_started_s"] is None and "streamalert is starting" in text:
                        marks["roles_started_s"] = now
                        ready = re.search(r"ready in ([0-9.]+) s\)", text)
                        marks["broker_ready_s"] = float(ready.group(1)) if ready else None
                        found = re.search(r"\(stats: (http://[^)]+/stats)\)", text)
                        stats_url = found.group(1) if found else ""
                    if marks["first_alert_s"] is None and _first_alert(data / "alerts.sqlite3"):
                        marks["first_alert_s"] = now
                    if marks["first_webhook_s"] is None and stats_url and _webhooks(stats_url) > 0:
                        marks["first_webhook_s"] = now
                    time.sleep(0.25)
            finally:
                if proc.poll() is None:
                    proc.terminate()
                proc.wait(60)
    return marks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=90.0, help="each run's --duration")
    ap.add_argument("--speedup", default="20000", help="APP_REPLAY_SPEEDUP of both runs")
    args = ap.parse_args()
    runs = {"auth (SASL/SCRAM + ACLs)": one_run(True, args.seconds, args.speedup)}
    runs["--no-auth (plaintext)"] = one_run(False, args.seconds, args.speedup)
    head = ("broker ready", "roles started", "first alert", "first webhook")
    print(f"{'make run':<26} {head[0]:>13} {head[1]:>14} {head[2]:>12} {head[3]:>14}")
    for name, m in runs.items():
        cells = [f"{m[k]:.1f} s" if m[k] is not None else "-" for k in
                 ("broker_ready_s", "roles_started_s", "first_alert_s", "first_webhook_s")]  # fmt: skip
        print(f"{name:<26} {cells[0]:>13} {cells[1]:>14} {cells[2]:>12} {cells[3]:>14}")
    on, off = runs.values()
    for key in ("broker_ready_s", "first_alert_s"):
        if on[key] and off[key]:
            print(f"{key}: auth / no-auth = {on[key] / off[key]:.2f}")  # type: ignore[operator]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
