"""Sliding windows under a burst: one client IP sending 403s, every one a change point.

Run: ``.venv/bin/python bench/bench_sliding.py [--seconds S] [--rates R,R]``. For each
rate, S seconds of event time of one IP at R events/s go through a 1-minute sliding
rule with every aggregate kind (count, count distinct, sum, max) in batches of 500,
as the worker evaluates them; prints events/s (CPU time) and the alert count. The
window holds R x 60 events, so an evaluator that re-aggregated it at each change
point would slow down with the square of the rate (it ran ~115 events/s at 50/s).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.events import SCHEMAS, format_ts  # noqa: E402
from app.rules.evaluator import Engine  # noqa: E402
from app.rules.loader import load_rules  # noqa: E402

RULE = """rules:
  - id: forbidden-burst
    source: logs
    where: status = 403
    group_by: [client_ip]
    window: {type: sliding, size: 1m}
    allowed_lateness: 1m
    aggregate: {n: count(*), paths: count(distinct path), b: sum(bytes), mx: max(bytes)}
    having: n >= 5
"""
T0 = 1_700_000_000_000
BATCH = 500


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=180, help="event-time seconds of burst per rate")
    ap.add_argument("--rates", default="50,200,1000", help="events/s of event time, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "burst.yaml").write_text(RULE)
        ruleset = load_rules([Path(tmp) / "burst.yaml"])
    for rate in (int(r) for r in args.rates.split(",")):
        events = [
            SCHEMAS["logs"].validate(
                {
                    "ts": format_ts(T0 + i * 1000 // rate),
                    "host": "www",
                    "client_ip": "6.6.6.6",
                    "path": f"/p{i % 50}",
                    "status": 403,
                    "bytes": i % 1000,
                }
            )
            for i in range(rate * args.seconds)
        ]
        eng = Engine(ruleset)
        started = time.process_time()
        alerts = 0
        for i in range(0, len(events), BATCH):
            alerts += len(eng.process_batch([("logs", e) for e in events[i : i + BATCH]]).alerts)
        rate_out = len(events) / (time.process_time() - started)
        print(
            f"sliding 1m window, one IP at {rate:,}/s ({rate * 60:,} events in the window): "
            f"{rate_out:,.0f} events/s, {alerts} alerts"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
