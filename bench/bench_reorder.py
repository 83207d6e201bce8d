"""What ``order: event_time`` costs: the real access log (out of order by up to 59 s)
through one threshold rule (``status >= 400`` by host), in arrival order and in event-time
order with a minute of lateness.

Run: ``.venv/bin/python bench/bench_reorder.py``. Prints, for each, events/s (CPU time,
best of 5 passes, one event at a time and in batches of 500), the transitions and the late
count. Arrival order skips most of the log as late, which is cheap; event-time order stores
every event, then releases it to the threshold.
"""

from __future__ import annotations

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
from app.rules.loader import load_rules  # noqa: E402
from ingest.adapters.apache import apache_events  # noqa: E402

APACHE = ROOT.parent / "shared" / "datasets" / "apache_logs" / "apache_logs"
RULE = """rules:
  - id: errors
    source: logs
    where: status >= 400
    for: 1m
    group_by: [host]
"""
ORDERS = {"arrival": "", "event_time": "    allowed_lateness: 1m\n    order: event_time\n"}
PASSES = 5
BATCH = 500


def log_events() -> list[tuple[str, Event]]:
    rows = [r for r in apache_events(str(APACHE), host="www") if isinstance(r, dict)]
    events = [("logs", SCHEMAS["logs"].validate(r)) for r in rows]
    last = max(e.ts_ms for _, e in events)  # one later event releases whatever still waits
    flush = SCHEMAS["logs"].validate({"host": "zz", "ts": format_ts(last + 600_000), "status": 200})
    return [*events, ("logs", flush)]


def main() -> int:
    events = log_events()
    with tempfile.TemporaryDirectory() as tmp:
        for order, extra in ORDERS.items():
            directory = Path(tmp) / order
            directory.mkdir()
            (directory / "r.yaml").write_text(RULE + extra)
            ruleset = load_rules([directory])
            rates = {}
            for mode in ("one at a time", f"batches of {BATCH}"):
                best = 0.0
                for _ in range(PASSES):
                    eng = Engine(ruleset)
                    started = time.process_time()
                    if mode == "one at a time":
                        alerts = sum(len(eng.process(s, e).alerts) for s, e in events)
                    else:
                        alerts = sum(
                            len(eng.process_batch(events[i : i + BATCH]).alerts)
                            for i in range(0, len(events), BATCH)
                        )
                    best = max(best, len(events) / (time.process_time() - started))
                rates[mode] = best
            shown = ", ".join(f"{mode} {rate:,.0f} events/s" for mode, rate in rates.items())
            print(f"{order}: {shown}; {alerts} transitions, {eng.stats.late} events late")
    return 0


if __name__ == "__main__":
    sys.exit(main())
