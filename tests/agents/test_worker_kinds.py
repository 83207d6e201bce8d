"""Rule kinds through a real Faust worker on the real broker: regrouped streams, windows,
registry enrichment, absence, branching, a threshold in event-time order; hot reload; a
restart that resumes window state. Every alert id must equal the backtest's for the same
input and partition count."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.backtest import BacktestReport, backtest, read_events
from app.kafka.broker import KafkaBroker
from app.rules.loader import load_rules
from app.tables import Tables
from ingest.adapters.apache import apache_events
from tests.agents.worker_helpers import PARTITIONS, worker_env
from tests.conftest import APACHE_LOG, require_dataset
from tests.kafka_helpers import committed, consume_json, produce, rewind, wait_for_json
from tests.procs import role, stop, wait_for
from tests.regrouped import regrouped_backlog

pytestmark = [pytest.mark.slow, pytest.mark.integration]


RULES = """rules:
  - id: not-found-scan
    source: logs
    where: status = 404
    group_by: [client_ip]
    window: {type: sliding, size: 1m}
    allowed_lateness: 1m
    aggregate: {n: count(*)}
    having: n >= 10
  - id: errors-in-time-order
    source: logs
    where: status >= 400
    for: 30s
    group_by: [host]
    allowed_lateness: 1m
    order: event_time
  - id: too-hot-for-its-site
    source: sensors
    enrich: [{table: devices, on: device_id, as: device}]
    where: temperature > device.max_temp
    group_by: [device_id]
  - id: device-silent
    source: sensors
    group_by: [device_id]
    absent_for: 30m
    expect_from: devices
  - id: trade-size-branch
    source: finance
    branch:
      - {when: amount >= 40, to: finance.high_amount}
      - {otherwise: finance.low_amount}
"""

DEVICES = [
    {"device_id": "d1", "site": "lab-2", "max_temp": 30.0},
    {"device_id": "d2", "site": "lab-3", "max_temp": 50.0},
    {"device_id": "ghost", "site": "lab-9"},
]


def by_fingerprint(items: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for fp, aid in items:
        out.setdefault(fp, []).append(aid)
    return out


def sensor(minute: int, device: str, temp: float) -> bytes:
    return orjson.dumps({"device_id": device, "ts": f"2024-01-01T{minute // 60:02d}:{minute % 60:02d}:00Z",
                         "temperature": temp})  # fmt: skip


def test_kinds_through_faust_match_the_backtest(broker: KafkaBroker, tmp_path: Path) -> None:
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "kinds.yaml").write_text(RULES)
    produce(broker.bootstrap, "tables.devices", [(d["device_id"].encode(), orjson.dumps(d)) for d in DEVICES])
    logs = [orjson.dumps(r) for r in apache_events(str(require_dataset(APACHE_LOG)), host="www-1")
            if isinstance(r, dict)]  # fmt: skip
    # d1 overheats, then goes silent; a small fleet keeps every partition's event-time clock moving
    sensors = [sensor(m, "d1", 25.0 + m) for m in range(0, 12)]
    sensors += [sensor(m, f"f{i}", 20.0) for m in range(0, 90, 5) for i in range(6)]
    trades = [
        orjson.dumps({"symbol": "ACME", "ts": "2024-01-01T00:00:00Z", "amount": float(a)}) for a in (5, 50)
    ]
    produce(broker.bootstrap, "events.logs", [(b"www-1", v) for v in logs])
    produce(broker.bootstrap, "events.sensors", [(orjson.loads(v)["device_id"].encode(), v) for v in sensors])
    produce(broker.bootstrap, "events.finance", [(b"ACME", v) for v in trades])

    tables = Tables()
    tables.load_rows("devices", DEVICES)
    report = BacktestReport()
    lines = [*sensors, *logs, *trades]
    with (tmp_path / "expected.jsonl").open("w") as out:
        expected = backtest(load_rules([rules_dir]), read_events(lines, "in", report), out, report,
                            partitions=PARTITIONS, tables=tables)  # fmt: skip
    kinds = {a.rule_id for a in expected}
    assert {"not-found-scan", "errors-in-time-order", "too-hot-for-its-site", "device-silent"} <= kinds

    with role(
        ["agents", "worker", "-l", "info"], worker_env(broker, tmp_path, rules_dir), tmp_path / "w.log"
    ):
        alerts = wait_for_json(broker.bootstrap, "alerts", len(expected), timeout_s=90, what="alerts")
        routed_high = consume_json(broker.bootstrap, "finance.high_amount", min_count=1, timeout_s=10)
        routed_low = consume_json(broker.bootstrap, "finance.low_amount", min_count=1, timeout_s=10)
    assert by_fingerprint([(a["fingerprint"], a["alert_id"]) for a in alerts]) == by_fingerprint(
        [(a.fingerprint, a.alert_id) for a in expected]
    )
    ghost = [a for a in alerts if a["rule_id"] == "device-silent" and a["labels"]["device_id"] == "ghost"]
    assert ghost, "a registry device never seen must go silent"
    assert [r["amount"] for r in routed_high] == [50.0] and [r["amount"] for r in routed_low] == [5.0]


def _rule(rule_id: str, where: str) -> str:
    return f"rules:\n  - id: {rule_id}\n    source: sensors\n    where: {where}\n    group_by: [device_id]\n"


def test_hot_reload_applies_valid_edits_and_keeps_the_last_good_rules(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "a.yaml").write_text(_rule("hot", "temperature > 100"))
    log = tmp_path / "w.log"

    def alerts_for(rule: str, n: int) -> list[dict[str, Any]]:
        return wait_for(lambda: (a := [x for x in consume_json(broker.bootstrap, "alerts", timeout_s=2)
                                       if x["rule_id"] == rule]) and len(a) >= n and a,
                        timeout_s=30, what=f"{n} alert(s) of {rule}")  # fmt: skip

    with role(["agents", "worker", "-l", "info"], worker_env(broker, tmp_path, rules_dir), log):
        produce(broker.bootstrap, "events.sensors", [(b"d1", sensor(0, "d1", 101.0))])
        assert alerts_for("hot", 1)[0]["status"] == "firing"
        # a new file takes effect without a restart
        (rules_dir / "b.yaml").write_text(_rule("cold", "temperature < 0"))
        wait_for(lambda: "reloaded 2 rules" in log.read_text(), timeout_s=10, what="the reload")
        produce(broker.bootstrap, "events.sensors", [(b"d2", sensor(1, "d2", -5.0))])
        cold = alerts_for("cold", 1)
        assert cold[0]["labels"]["device_id"] == "d2"
        # a broken edit is rejected with its errors; the last good rules keep running
        started = time.monotonic()
        (rules_dir / "b.yaml").write_text(_rule("cold", "temprature < 0"))
        wait_for(lambda: "rule files rejected" in log.read_text(), timeout_s=10, what="the rejection")
        assert time.monotonic() - started < 5
        assert "unknown field 'temprature'" in log.read_text()
        produce(broker.bootstrap, "events.sensors", [(b"d3", sensor(2, "d3", -7.0))])
        assert {a["labels"]["device_id"] for a in alerts_for("cold", 2)} == {"d2", "d3"}
        # while any file is broken, nothing changes; fixing it and editing a rule applies both:
        # the old version's alert ends (app.rules.retire), the new version's alerts carry it
        (rules_dir / "b.yaml").write_text(_rule("cold", "temperature < 0"))
        (rules_dir / "a.yaml").write_text(_rule("hot", "temperature > 50"))
        wait_for(lambda: log.read_text().count("reloaded") >= 2, timeout_s=10, what="the second reload")
        produce(broker.bootstrap, "events.sensors", [(b"d4", sensor(3, "d4", 60.0))])
        hot = alerts_for("hot", 3)
        d1 = [(a["status"], a["rule_version"]) for a in hot if a["labels"]["device_id"] == "d1"]
        d4 = [(a["status"], a["rule_version"]) for a in hot if a["labels"]["device_id"] == "d4"]
        assert d1 == [("firing", d1[0][1]), ("resolved", d1[0][1])]
        assert d4 == [("firing", d4[0][1])] and d4[0][1] != d1[0][1]


@pytest.mark.parametrize("crash", [False, True], ids=["stop", "crash-between-states-and-offsets"])
def test_restart_resumes_window_state_from_the_changelog(
    broker: KafkaBroker, tmp_path: Path, crash: bool
) -> None:
    """A restart resumes the window from the changelog, and counts no reading twice.

    ``crash``: at least once, a commit writes the states, then commits the offsets. A crash
    between the two left the states counting readings the offsets did not cover, and the
    restart counted them again: the hour's 6 readings as 9 (a gate met it once, with a stop).
    Here the offsets are put back after the stop, as that crash leaves them."""
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "w.yaml").write_text(
        "rules:\n  - id: busy\n    source: sensors\n    group_by: [device_id]\n"
        "    window: {type: tumbling, size: 1h}\n    aggregate: {n: count(*)}\n    having: n >= 6\n"
    )
    env = worker_env(broker, tmp_path, rules_dir)
    first = [sensor(m, "d1", 1.0) for m in (0, 10, 20)]
    second = [sensor(m, "d1", 1.0) for m in (30, 40, 50, 61)]
    with role(["agents", "worker", "-l", "info"], env, tmp_path / "w1.log") as w1:
        produce(broker.bootstrap, "events.sensors", [(b"d1", v) for v in first])
        wait_for(
            lambda: committed(broker.bootstrap, "streamalert-rules", "events.sensors") == 3,
            timeout_s=60,
            what="the first readings committed (their states are written before)",
        )
        assert stop(w1) == 0
    if crash:
        rewind(broker.bootstrap, "streamalert-rules", "events.sensors", 0)
    produce(broker.bootstrap, "events.sensors", [(b"d1", v) for v in second])
    with role(["agents", "worker", "-l", "info"], env, tmp_path / "w2.log"):
        alerts = wait_for(
            lambda: consume_json(broker.bootstrap, "alerts", min_count=1, timeout_s=3),
            timeout_s=60,
            what="the window alert after the restart",
        )
    # 0..50 are the first hour (61 closes it): 3 before the restart + 3 after; losing the state
    # would leave 3, below the threshold, and no alert at all
    assert [(a["rule_id"], a["status"], a["values"]["n"]) for a in alerts] == [("busy", "firing", 6)]


def test_a_state_too_large_for_a_changelog_record_stays_in_memory(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    """One client IP's burst fills its sliding window past what one Kafka record may hold:
    the worker keeps that state in memory, logs it once, and goes on alerting. (The
    producer refused the record, and the worker stopped with every rule.)"""
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "burst.yaml").write_text(
        "rules:\n  - id: burst\n    source: logs\n    where: status = 403\n    group_by: [client_ip]\n"
        "    window: {type: sliding, size: 1m}\n    aggregate: {n: count(*)}\n    having: n >= 100\n"
    )
    env = {**worker_env(broker, tmp_path, rules_dir), "APP_STATE_RECORD_MAX_BYTES": "4096"}

    def hit(ms: int, status: int) -> tuple[bytes, bytes]:
        ts = f"2024-01-01T00:{ms // 60_000:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}Z"
        return b"www", orjson.dumps({"ts": ts, "host": "www", "client_ip": "6.6.6.6", "status": status})

    burst = [hit(i * 100, 403) for i in range(300)]  # 300 in 30 s: ~7 KB of window state
    with role(["agents", "worker", "-l", "info"], env, tmp_path / "w.log") as proc:
        produce(broker.bootstrap, "events.logs", burst)
        wait_for(
            lambda: "over the 4096 a changelog record may have" in (tmp_path / "w.log").read_text(),
            timeout_s=60,
            what="the oversized state at a commit",
        )
        produce(broker.bootstrap, "events.logs", [hit(180_000, 200)])  # the window passes
        alerts = wait_for_json(broker.bootstrap, "alerts", 2, timeout_s=60, what="the burst's alerts")
        assert proc.poll() is None
    assert [(a["rule_id"], a["status"]) for a in alerts] == [("burst", "firing"), ("burst", "resolved")]
    log = (tmp_path / "w.log").read_text()
    assert log.count("over the 4096 a changelog record may have") == 1
    assert "MessageSizeTooLargeError" not in log


def test_a_backlog_regrouped_from_two_partitions_gives_the_backtests_alerts(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    """Rules grouped by client IP on logs keyed by host: every group takes events from both
    partitions. The lines are there before the worker starts, as after a restart behind a
    backlog. The worker merges its source partitions by record time (``agents.merge``) and
    forwards their events in that order, and gives the backtest's 233 transitions.

    1,200 lines: a few seconds of catch-up. With 20,000 (several fetches per partition, the
    wait for a lagging partition) it gave the backtest's 3,948 locally, idle and under load,
    and in one clean-clone run, but other ids for a few groups in another, cause not found (a
    suspect: at least once, a replay after a start-up rebalance counts forwarded events
    again, agents.wiring). ``tests/agents/test_merge.py`` covers the wait.

    Forwarding each fetched partition batch in turn gave 142 to 185 of 233 transitions on the
    first 1,200 lines; merging each fetch but never waiting for a lagging partition gave 5,946
    of 7,906 on 40,000 (a partition's next fetch went back behind the other's last). Two
    workers, and exactly-once: ``tests/agents/test_worker_group.py``."""
    rules_dir, records, expected = regrouped_backlog(tmp_path, 1200, PARTITIONS)
    assert len(expected) == 233
    produce(broker.bootstrap, "events.logs", records)
    env = worker_env(broker, tmp_path, rules_dir)
    with role(["agents", "worker", "-l", "info"], env, tmp_path / "w.log"):
        alerts = wait_for_json(broker.bootstrap, "alerts", len(expected), timeout_s=90, what="alerts")
    assert by_fingerprint([(a["fingerprint"], a["alert_id"]) for a in alerts]) == by_fingerprint(
        [(a.fingerprint, a.alert_id) for a in expected]
    )
