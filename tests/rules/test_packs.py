"""The shipped rule packs on real data, each checked against an independent computation."""

from __future__ import annotations

import csv
import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.alerts import Alert
from app.events import SCHEMAS, Event, parse_ts
from app.rules.evaluator import run_backtest
from app.rules.loader import load_rules
from app.runtime.settings import PROJECT_ROOT
from ingest.adapters.apache import apache_events
from ingest.adapters.nab import nab_events
from ingest.adapters.ohlc import ohlc_events
from tests.conftest import APACHE_LOG, DATASETS, NAB_MACHINE_TEMP, require_dataset

RULES = PROJECT_ROOT / "rules"


def events(source: str, rows: object) -> list[tuple[str, Event]]:
    return [(source, SCHEMAS[source].validate(r)) for r in rows if isinstance(r, dict)]  # type: ignore[attr-defined]


def firing(alerts: list[Alert], rule: str) -> list[Alert]:
    return [a for a in alerts if a.rule_id == rule and a.status == "firing"]


def test_iot_pack_on_the_machine_temperature_failures() -> None:
    path = require_dataset(NAB_MACHINE_TEMP)
    evs = events("sensors", nab_events(str(path), device="machine-temp-1", field="temperature"))
    out = run_backtest(load_rules([RULES / "iot.yaml"]), evs, partitions=4)
    windows = json.loads((DATASETS / "nab/labels/combined_windows.json").read_text())[
        "realKnownCause/machine_temperature_system_failure.csv"
    ]
    spans = [(parse_ts(a.replace(" ", "T") + "Z"), parse_ts(b.replace(" ", "T") + "Z")) for a, b in windows]

    def labelled(a: Alert) -> bool:
        return any(lo <= parse_ts(a.starts_at) <= hi for lo, hi in spans)

    overheat = firing(out, "machine-overheat")
    assert overheat and labelled(overheat[0])  # the first failure window runs hot
    assert 10 <= len(overheat) <= 40  # hysteresis keeps a series that hovers around 100 from flapping
    cold = firing(out, "machine-cold")
    assert cold and all(labelled(a) for a in cold)  # the machine stops in a labelled failure
    hourly = firing(out, "machine-hourly-heat")
    assert hourly and all(a.values["avg_t"] > 90 and a.values["readings"] >= 3 for a in hourly)
    assert not firing(out, "device-silent")  # a reading every 5 minutes, never 30 minutes of silence
    assert len({a.alert_id for a in out}) == len(out)


def test_absence_on_the_real_gaps_of_the_ambient_sensor(tmp_path: Path) -> None:
    path = require_dataset(DATASETS / "nab/data/realKnownCause/ambient_temperature_system_failure.csv")
    rule = tmp_path / "r.yaml"
    rule.write_text(
        "rules:\n  - id: silent\n    source: sensors\n    group_by: [device_id]\n    absent_for: 3h\n"
    )
    evs = events("sensors", nab_events(str(path), device="office-1", field="temperature"))
    out = run_backtest(load_rules([rule]), evs)
    times = [e.ts_ms for _, e in evs]
    gaps = [(a, b) for a, b in itertools.pairwise(times) if b - a > 3 * 3_600_000]
    assert gaps, "the ambient series has real multi-hour gaps"
    fired = [parse_ts(a.starts_at) for a in firing(out, "silent")]
    assert fired == [a + 3 * 3_600_000 for a, _ in gaps]
    resolved = [parse_ts(a.ends_at or "") for a in out if a.status == "resolved"]
    assert resolved == [b for _, b in gaps]


def test_logs_pack_on_the_real_access_log() -> None:
    path = require_dataset(APACHE_LOG)
    evs = events("logs", apache_events(str(path), host="www-1"))
    out = run_backtest(load_rules([RULES / "logs.yaml"]), evs, partitions=4)
    scans = firing(out, "not-found-scan")
    assert {a.labels["client_ip"] for a in scans} == {"144.76.95.39"}
    assert scans[0].values["n"] >= 10
    assert not firing(out, "forbidden-burst")  # the log holds two 403s in all
    assert not firing(out, "server-error-spike")  # three 500s over three days


def _adj_close_episodes(symbol: str) -> list[str]:
    rows = [r for r in ohlc_events(symbol) if isinstance(r, dict)]
    out, prev_hit = [], False
    for prev, cur in itertools.pairwise(rows):
        hit = prev["adj_close"] and (cur["adj_close"] - prev["adj_close"]) / prev["adj_close"] >= 0.10
        if hit and not prev_hit:
            out.append(cur["ts"])
        prev_hit = bool(hit)
    return out


@pytest.mark.parametrize("symbol", ["AAPL", "GOOG", "MSFT"])
def test_finance_pack_stock_jumps_match_the_adjusted_close(symbol: str) -> None:
    evs = events("finance", ohlc_events(symbol))
    out = run_backtest(load_rules([RULES / "finance.yaml"]), evs)
    jumps = firing(out, "stock-jump")
    assert [a.starts_at for a in jumps] == _adj_close_episodes(symbol)
    assert all(a.values["pct_change"] >= 10 for a in jumps)


def test_raw_close_split_is_a_false_crash_that_adjusted_close_avoids(tmp_path: Path) -> None:
    rule = tmp_path / "r.yaml"
    body = (
        "  - id: {}-crash\n    source: finance\n    group_by: [symbol]\n"
        "    where: pct_change({}, 1d) <= -40\n"
    )
    rule.write_text("rules:\n" + body.format("raw", "close") + body.format("adj", "adj_close"))
    out = run_backtest(load_rules([rule]), events("finance", ohlc_events("AAPL")))
    assert "2000-06-21T00:00:00.000Z" in [a.starts_at for a in firing(out, "raw-crash")]
    assert "2000-06-21T00:00:00.000Z" not in [a.starts_at for a in firing(out, "adj-crash")]


def test_tweet_burst_on_real_tweet_volume() -> None:
    path = require_dataset(DATASETS / "nab/data/realTweets/Twitter_volume_AAPL.csv")
    rows = []
    with path.open() as f:
        for r in csv.DictReader(f):
            ts = datetime.strptime(r["timestamp"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            rows.append({"symbol": "AAPL", "ts": ts.isoformat(), "tweet_count": int(float(r["value"]))})
    out = run_backtest(load_rules([RULES / "finance.yaml"]), events("finance", rows))
    bursts = firing(out, "tweet-burst")
    assert bursts
    hourly: dict[datetime, int] = {}
    for r in rows:
        ts = datetime.fromisoformat(r["ts"])
        hour = ts.replace(minute=0, second=0)
        hourly[hour] = hourly.get(hour, 0) + int(r["tweet_count"])
    for a in bursts[:20]:
        start = datetime.fromisoformat(a.starts_at.replace("Z", "+00:00"))
        assert a.values["tweets"] == hourly[start]
        assert hourly[start] >= 3 * hourly.get(start - timedelta(hours=1), 0)
