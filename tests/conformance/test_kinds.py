"""Two-engine conformance for every stateful rule kind (the Spark engine's stream path):
windows of each type with lateness and each late policy, absence, change, new term,
sequences, keep_firing_for/clear, pct_change(), enrichment and branching.

Every transition is compared, with the ``pending``, ``inactive`` and ``no_data`` statuses
(``backtest --statuses all``).

Input: the real data of ``test_threshold`` (NAB machine temperature, the Apache access
log, OHLC bars, crafted threshold cases) plus crafted window events that are out of
order within the lateness, late beyond it (dropped, amended, copied aside), duplicated,
and a device that goes silent while another moves its partition's clock. Both backtests
emulate two partitions, so per-partition clocks and regrouping are exercised. Compared:
alert ids, each fingerprint's id sequence, the output lines, and the report counts
(events, invalid lines, transitions, branch copies, late copies, late events).
"""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import orjson
import pytest
from pyspark.sql import SparkSession

from app.alerts import Alert
from app.backtest import BacktestReport, backtest, parse_statuses, read_events
from app.rules.loader import load_rules
from jobs.backtest import file_records, run_backtest
from tests.conformance.kind_cases import RULES, crafted_windows, lines_for_test, tables
from tests.conformance.threshold_cases import at, by_fingerprint

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a real Spark

EVERY_STATUS = parse_statuses("all")


def both_backtests(
    spark: SparkSession, path: Path, partitions: int, max_skew_ms: int = -1, native: bool = True
) -> tuple[list[Alert], BacktestReport, str, list[Alert], BacktestReport, str]:
    """The Faust and Spark backtests of the kinds file over ``path``; Spark with its native
    plans (``native``, ``APP_SPARK_BACKTEST_PLANS=native``) or with every rule through the
    evaluator (the command's default)."""
    ruleset = load_rules([RULES])
    faust_report, faust_out = BacktestReport(statuses=EVERY_STATUS), io.StringIO()
    with path.open("rb") as f:
        faust = backtest(
            ruleset, read_events(f, str(path), faust_report), faust_out, faust_report,
            partitions=partitions, tables=tables(), max_skew_ms=max_skew_ms,
        )  # fmt: skip
    spark_report, spark_out = BacktestReport(statuses=EVERY_STATUS), io.StringIO()
    on_spark = run_backtest(
        spark, ruleset, file_records(spark, path), str(path), spark_out, spark_report,
        partitions=partitions, tables=tables(), max_skew_ms=max_skew_ms, native_windows=native,
        native_thresholds=native, native_absence=native, native_event_alerts=native,
    )  # fmt: skip
    return faust, faust_report, faust_out.getvalue(), on_spark, spark_report, spark_out.getvalue()


@pytest.mark.parametrize("native", [True, False], ids=["native-plans", "evaluator-plans"])
def test_every_kind_gives_the_same_alerts_on_both_engines(
    spark: SparkSession, tmp_path: Path, native: bool
) -> None:
    """With both of a Spark backtest's plans: the native ones, and every rule through the
    evaluator (the backtest command's default, ``APP_SPARK_BACKTEST_PLANS``)."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines_for_test()) + b"\n")
    faust, f_report, f_out, on_spark, s_report, s_out = both_backtests(
        spark, path, partitions=2, native=native
    )

    every_rule = {r.id for r in load_rules([RULES]).rules} - {"volume-branch"}
    fired = Counter(a.rule_id for a in faust)
    assert set(fired) == every_rule, (
        f"rules that never fired make the comparison weak: {every_rule - set(fired)}"
    )
    assert {a.alert_id for a in on_spark} == {a.alert_id for a in faust}
    assert by_fingerprint(on_spark) == by_fingerprint(faust)
    assert Counter(s_out.splitlines()) == Counter(f_out.splitlines())
    assert s_out.splitlines() == f_out.splitlines()
    assert f_report.routed > 0 and f_report.late > 0
    # expect_from: registry keys never seen, on each partition, fire on Spark too
    ghosts = {a.labels.get("device_id") for a in on_spark if a.rule_id == "registry-silent"}
    assert {"ghost-1", "ghost-3"} <= ghosts
    assert (s_report.events, s_report.skipped, s_report.alerts, s_report.routed, s_report.late) == (
        f_report.events,
        f_report.skipped,
        f_report.alerts,
        f_report.routed,
        f_report.late,
    )
    # the events a rule could not use for their time, every late policy, once per rule: on the
    # native plans each kind counts its own (windows, thresholds and changes have late ones here)
    assert f_report.late_events > 10_000
    assert s_report.late_events == f_report.late_events


def test_late_out_of_order_and_silent_cases_are_decided_the_same_way(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "crafted.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in crafted_windows()) + b"\n")
    faust, _, _, on_spark, report, _ = both_backtests(spark, path, partitions=1)
    assert by_fingerprint(on_spark) == by_fingerprint(faust)

    def seen(rule: str, device: str = "w-1") -> list[tuple[str, str, str | None]]:
        mine = [a for a in on_spark if a.rule_id == rule and a.labels.get("device_id") == device]
        return [(a.status, a.starts_at, a.ends_at) for a in mine]

    # the in-lateness 58-minute reading counts; the 200-degree one (minute 10, 80 minutes late) does not
    heat = [a for a in on_spark if a.rule_id == "hourly-heat" and a.status == "firing"]
    assert heat and heat[0].values["max_t"] == 100.5
    assert report.late == 1  # hot-quarter (late_policy: side) copied the 200-degree reading aside
    assert ("firing", at(660), None) in seen("heat-rising")  # raised late by the amended window
    # cleared at 102, back at 110 within keep_firing_for, cleared at 111: resolves 15m later
    assert seen("overheat-held")[-2:] == [("firing", at(701), None), ("resolved", at(701), at(726))]
    assert seen("device-silent")[:1] == [("firing", at(741), None)]  # silent from 711, +30m
    assert [a.labels["device_id"] for a in on_spark if a.rule_id == "unknown-device-hot"] == ["w-3"]
    # no_data, w-1 silent from 711 to 800: a no_data episode until data returns
    assert seen("hot-then-silent")[-4:] == [
        ("resolved", at(605), at(711)),
        ("no_data", at(731), None),
        ("inactive", at(731), at(800)),
        ("pending", at(800), None),
    ]
    # alerting: fires from the pending streak's start at 711 + 25m, resolves on data
    assert seen("silent-means-alerting")[-3:] == [
        ("pending", at(711), None),
        ("firing", at(711), None),
        ("resolved", at(711), at(800)),
    ]
    alerting = [
        a for a in on_spark if a.rule_id == "silent-means-alerting" and a.labels["device_id"] == "w-1"
    ]
    assert alerting[-2].event_ts == at(736) and alerting[-2].values["no_data"] is True
    assert seen("silent-means-ok")[-2:] == [("firing", at(711), None), ("resolved", at(711), at(726))]
    assert seen("silent-kept")[-1] == ("inactive", at(710), at(711))  # keep: silence changes nothing
    assert seen("plain-hot")[:3] == [
        ("pending", at(645), None),
        ("firing", at(645), None),
        ("resolved", at(645), at(662)),
    ]


def test_future_dated_events_are_refused_the_same_way_and_change_no_alert(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The time bound (APP_MAX_EVENT_SKEW) on both engines: events from clocks decades or
    weeks ahead, among every kind's input, are refused alike, and the alerts are those of
    the input without them."""
    lines = lines_for_test()
    far = [
        {"device_id": "w-2", "ts": "2099-12-31T00:00:00Z", "temperature": 20.0},
        {"device_id": "machine-temp-1", "ts": "2099-12-31T00:00:00Z", "temperature": 120.0},
        {"host": "www-9", "ts": "2099-12-31T00:00:00Z", "client_ip": "10.0.0.9", "path": "/x", "status": 404},
        {"device_id": "w-1", "ts": at(600 + 30 * 24 * 60), "temperature": 20.0},
    ]
    mixed = [*lines[:3000], orjson.dumps(far[1]), *lines[3000:-20], orjson.dumps(far[0]), *lines[-20:-5]]
    mixed += [orjson.dumps(far[3]), lines[-5], orjson.dumps(far[2]), *lines[-4:]]
    clean, dirty = tmp_path / "clean.jsonl", tmp_path / "dirty.jsonl"
    clean.write_bytes(b"\n".join(lines) + b"\n")
    dirty.write_bytes(b"\n".join(mixed) + b"\n")
    skew = 5 * 60_000
    faust, f_report, f_out, on_spark, s_report, s_out = both_backtests(spark, dirty, 2, skew)
    assert {a.alert_id for a in on_spark} == {a.alert_id for a in faust}
    assert by_fingerprint(on_spark) == by_fingerprint(faust)
    assert Counter(s_out.splitlines()) == Counter(f_out.splitlines())
    assert s_out.splitlines() == f_out.splitlines()
    assert (s_report.events, s_report.alerts, s_report.routed, s_report.late, s_report.refused) == (
        f_report.events, f_report.alerts, f_report.routed, f_report.late, f_report.refused,
    )  # fmt: skip
    assert (s_report.late_events, s_report.late_events > 0) == (f_report.late_events, True)
    refused = sorted(p for p in f_report.problems if p.startswith("refused"))
    assert sorted(p for p in s_report.problems if p.startswith("refused")) == refused
    assert all(any(e["ts"][:10] in p for p in refused) for e in far), refused

    ruleset = load_rules([RULES])
    report = BacktestReport(statuses=EVERY_STATUS)
    with clean.open("rb") as f:
        without = backtest(
            ruleset, read_events(f, str(clean), report), io.StringIO(), report, partitions=2, tables=tables(),
            max_skew_ms=skew,
        )  # fmt: skip
    assert by_fingerprint(faust) == by_fingerprint(without)
    assert report.refused == 0  # real jumps (2013 -> 2024, daily bars) are all confirmed or caught up with
    assert f_report.refused == len(far) + 2  # the logs event is refused by each of its three streams
