"""A stream regrouped from two partitions: access-log lines keyed by host, and rules grouped by
client IP, whose every group takes events from both partitions of ``events.logs``. Run as the
engines meet them after a backlog (produced before the engine starts), these lines took one
partition's events before the other's and lost alerts: the backtest gives 233 transitions
(50 ``burst-403``, 3 ``per-ip-minute``, 180 ``forbidden-streak``); the Spark query gave 142 before
``jobs.state.arrival_order``, the Faust worker 142 to 185 before ``agents.merge``."""

from __future__ import annotations

import io
from pathlib import Path

import orjson

from app.alerts import Alert
from app.backtest import BacktestReport, backtest, read_events
from app.rules.loader import load_rules

#: the rules, for either engine (prefix ``engine: spark`` for Spark)
REGROUPED = """\
rules:
  - id: burst-403
    source: logs
    where: status = 403
    group_by: [client_ip]
    window: {type: sliding, size: 1m}
    aggregate: {n: count(*)}
    having: n >= 5
  - id: per-ip-minute
    source: logs
    group_by: [client_ip]
    window: {type: tumbling, size: 1m}
    aggregate: {n: count(*)}
    having: n >= 8
  - id: forbidden-streak
    source: logs
    where: status = 403
    group_by: [client_ip]
    consecutive: 4
"""


def regrouped_logs(n: int) -> list[tuple[bytes, bytes]]:
    """``n`` access-log lines from six hosts (on both partitions of ``events.logs``), one per
    second in time order, from three client IPs; every fifth second's IP sends 403s for a while."""
    hosts = [f"web-{i}" for i in range(6)]
    ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    out = []
    for i in range(n):
        ip = ips[(i // 7) % 3]
        status = 403 if (i // 20) % 3 == 0 else 200
        ts = f"2026-03-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"
        event = {"host": hosts[i * 5 % 6], "ts": ts, "client_ip": ip, "status": status, "path": "/"}
        out.append((event["host"].encode(), orjson.dumps(event)))
    return out


def regrouped_backlog(
    tmp_path: Path, n: int, partitions: int
) -> tuple[Path, list[tuple[bytes, bytes]], list[Alert]]:
    """The rules in ``tmp_path/rules``, ``n`` lines (:func:`regrouped_logs`) and the backtest's
    alert transitions over them on ``partitions`` partitions."""
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "regrouped.yaml").write_text(REGROUPED)
    records = regrouped_logs(n)
    report = BacktestReport()
    expected = backtest(load_rules([rules_dir]), read_events([v for _, v in records], "in", report),
                        io.StringIO(), report, partitions=partitions)  # fmt: skip
    return rules_dir, records, expected
