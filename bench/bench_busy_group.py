"""One busy group: state that grows with a group's event rate must not cost time in
proportion to its size at every event.

Run: ``.venv/bin/python bench/bench_busy_group.py [--seconds S] [--rates R,R]``. For each
rate R, in batches of 500 (the figures in docs/performance.md are taken so), prints events/s
(CPU time):

* **sliding burst**: S seconds of event time of one client IP sending 403s at R/s
  through a 1-minute sliding rule (count, count distinct, sum, max). The window holds
  R x 60 events; an event must not cost in proportion to them.
* **pct_change ticks**: S x 20 seconds of one symbol ticking at R/s through
  ``pct_change(price, 1h)``, whose history holds an hour of ticks; an event must not
  cost in proportion to it.

Then, once: **cardinality**, one host whose hour-long tumbling window sees 30,000
distinct client IPs through ``count(distinct client_ip)``; adding a value must not cost in proportion to the
values seen.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads

from app.events import SCHEMAS, Event, format_ts  # noqa: E402
from app.rules.evaluator import Engine  # noqa: E402
from app.rules.loader import RuleSet, load_rules  # noqa: E402

PCT_RULE = """rules:
  - id: tick-jump
    source: finance
    group_by: [symbol]
    where: pct_change(price, 1h) >= 5
"""
CARDINALITY_RULE = """rules:
  - id: many-clients
    source: logs
    group_by: [host]
    window: {type: tumbling, size: 1h}
    aggregate: {ips: count(distinct client_ip)}
    having: ips > 20000
"""
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


def rate_of(ruleset: RuleSet, source: str, events: list[Event]) -> tuple[float, int]:
    """Events/s (CPU time) and alerts through a fresh engine, in batches of ``BATCH``."""
    eng = Engine(ruleset)
    started = time.process_time()
    alerts = 0
    for i in range(0, len(events), BATCH):
        alerts += len(eng.process_batch([(source, e) for e in events[i : i + BATCH]]).alerts)
    return len(events) / (time.process_time() - started), alerts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=180, help="event-time seconds of burst per rate")
    ap.add_argument("--rates", default="2,50,200", help="events/s of event time, comma-separated")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "burst.yaml").write_text(RULE)
        (Path(tmp) / "ticks.yaml").write_text(PCT_RULE)
        (Path(tmp) / "cardinality.yaml").write_text(CARDINALITY_RULE)
        cardinality_rules = load_rules([Path(tmp) / "cardinality.yaml"])
        burst_rules = load_rules([Path(tmp) / "burst.yaml"])
        tick_rules = load_rules([Path(tmp) / "ticks.yaml"])
    for rate in (int(r) for r in args.rates.split(",")):
        burst = [
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
        per_s, alerts = rate_of(burst_rules, "logs", burst)
        print(
            f"sliding 1m window, one IP at {rate:,}/s ({rate * 60:,} events in the window): "
            f"{per_s:,.0f} events/s, {alerts} alerts"
        )
        ticks = [
            SCHEMAS["finance"].validate(
                {"ts": format_ts(T0 + i * 1000 // rate), "symbol": "AAPL", "price": 100 + i % 1000 / 100}
            )
            for i in range(rate * args.seconds * 20)
        ]
        per_s, alerts = rate_of(tick_rules, "finance", ticks)
        print(
            f"pct_change(price, 1h), one symbol at {rate:,}/s ({rate * 3600:,} ticks in the lookback): "
            f"{per_s:,.0f} events/s, {alerts} alerts"
        )
    ips = [
        SCHEMAS["logs"].validate(
            {
                "ts": format_ts(T0 + i * 100),
                "host": "www",
                "client_ip": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
                "status": 200,
            }
        )
        for i in range(30_000)
    ]
    per_s, alerts = rate_of(cardinality_rules, "logs", ips)
    print(
        f"count(distinct client_ip), one host-hour of 30,000 distinct IPs: {per_s:,.0f} events/s, "
        f"{alerts} alerts"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
