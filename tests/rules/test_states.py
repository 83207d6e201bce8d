"""Threshold lifecycle states beyond firing/resolved: pending, inactive and no data."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.alerts import Alert, alert_id
from app.errors import RuleConfigError
from app.rules.evaluator import Engine, run_backtest
from app.rules.loader import load_rules
from tests.rules.helpers import HOT, rules, sensor


def seen(alerts: list[Alert]) -> list[tuple[str, str, str, str | None]]:
    return [
        (a.labels["device_id"], a.status, a.starts_at[11:16], a.ends_at and a.ends_at[11:16]) for a in alerts
    ]


def with_opts(opts: str) -> str:
    return HOT.replace("    severity", opts + "    severity")


def test_pending_ids_are_deterministic_and_distinct_per_transition(tmp_path: Path) -> None:
    rs = rules(tmp_path, with_opts("    for: 10m\n"))
    events = [sensor(0, 101), sensor(10, 101)]
    first, second = run_backtest(rs, events), run_backtest(rs, events)
    assert [a.alert_id for a in first] == [a.alert_id for a in second]
    pending, firing = first
    assert pending.alert_id == alert_id("hot", pending.fingerprint, pending.starts_at, "pending")
    assert pending.starts_at == firing.starts_at and pending.alert_id != firing.alert_id
    assert pending.values == {"temperature": 101.0}


def test_without_for_a_rule_fires_at_once_and_never_pends(tmp_path: Path) -> None:
    out = run_backtest(rules(tmp_path, HOT), [sensor(0, 101), sensor(1, 50)])
    assert [a.status for a in out] == ["firing", "resolved"]


NO_DATA = "    for: 10m\n    no_data: {after: 30m, state: %s}\n"


def test_no_data_ends_pending_and_opens_a_no_data_episode_until_data_returns(tmp_path: Path) -> None:
    eng = Engine(rules(tmp_path, with_opts(NO_DATA % "no_data")))
    out: list[Alert] = []
    # d1 starts pending and then goes quiet; d2 keeps reporting (moves the partition clock)
    for ev in [sensor(0, 101), sensor(0, 20, "d2"), sensor(30, 20, "d2"), sensor(31, 20, "d2")]:
        out += eng.process(*ev).alerts
    assert seen(out) == [
        ("d1", "pending", "00:00", None),
        ("d1", "inactive", "00:00", "00:30"),
        ("d1", "no_data", "00:30", None),
    ]
    assert out[2].values == {"no_data": True, "silent_since": 0 + 1_704_067_200_000}
    assert eng.process(*sensor(20, 101)).alerts == []  # older than the silence's start: late
    back = eng.process(*sensor(40, 101)).alerts
    assert seen(back) == [("d1", "inactive", "00:30", "00:40"), ("d1", "pending", "00:40", None)]


def test_silence_exactly_after_is_not_no_data(tmp_path: Path) -> None:
    eng = Engine(rules(tmp_path, with_opts(NO_DATA % "no_data")))
    out: list[Alert] = []
    for ev in [sensor(0, 50), sensor(30, 50, "d2"), sensor(30, 50)]:
        out += eng.process(*ev).alerts
    assert out == []  # a quiet group is tracked too, but 30m of silence is not more than 30m


def test_no_data_alerting_fires_from_the_pending_start_and_resolves_on_data(tmp_path: Path) -> None:
    eng = Engine(rules(tmp_path, with_opts(NO_DATA % "alerting")))
    out: list[Alert] = []
    for ev in [sensor(0, 101), sensor(31, 20, "d2"), sensor(40, 50)]:
        out += eng.process(*ev).alerts
    assert seen(out) == [
        ("d1", "pending", "00:00", None),
        ("d1", "firing", "00:00", None),
        ("d1", "resolved", "00:00", "00:40"),
    ]
    assert out[1].event_ts.startswith("2024-01-01T00:30") and out[1].values["no_data"] is True


def test_no_data_ok_resolves_a_firing_alert_and_keep_changes_nothing(tmp_path: Path) -> None:
    ok = Engine(
        rules(tmp_path, HOT.replace("    severity", "    no_data: {after: 5m, state: ok}\n    severity"))
    )
    out: list[Alert] = []
    for ev in [sensor(0, 101), sensor(6, 20, "d2")]:
        out += ok.process(*ev).alerts
    assert seen(out) == [("d1", "firing", "00:00", None), ("d1", "resolved", "00:00", "00:05")]
    keep = rules(tmp_path, HOT.replace("    severity", "    no_data: {after: 5m, state: keep}\n    severity"))
    assert [a.status for a in run_backtest(keep, [sensor(0, 101), sensor(60, 20, "d2")])] == ["firing"]


def test_no_data_never_ends_a_firing_alert_in_no_data_state(tmp_path: Path) -> None:
    rs = rules(tmp_path, HOT.replace("    severity", "    no_data: {after: 5m}\n    severity"))
    out = run_backtest(rs, [sensor(0, 101), sensor(60, 20, "d2"), sensor(61, 20)])
    assert seen(out) == [("d1", "firing", "00:00", None), ("d1", "resolved", "00:00", "01:01")]


def test_no_data_waits_for_allowed_lateness(tmp_path: Path) -> None:
    rs = rules(tmp_path, with_opts(NO_DATA % "no_data" + "    allowed_lateness: 10m\n"))
    assert [a.status for a in run_backtest(rs, [sensor(0, 50), sensor(40, 50, "d2")])] == []
    assert [a.status for a in run_backtest(rs, [sensor(0, 50), sensor(41, 50, "d2")])] == ["no_data"]


def test_no_data_survives_a_restart_through_the_store(tmp_path: Path) -> None:
    rs = rules(tmp_path, with_opts(NO_DATA % "no_data"))
    first = Engine(rs)
    first.process(*sensor(0, 50))
    (stream,) = [s for s in first.streams["sensors"] if s.evaluator.rules]
    second = Engine(rs)
    (again,) = [s for s in second.streams["sensors"] if s.evaluator.rules]
    again.evaluator.store = stream.evaluator.store
    again.evaluator.restore(stream.evaluator.store.items())  # type: ignore[attr-defined]
    assert [a.status for a in second.process(*sensor(31, 50, "d2")).alerts] == ["no_data"]


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ("    no_data: {after: 0s}\n", "'after' must be above 0"),
        ("    no_data: {after: soon}\n", "'after'"),
        ("    no_data: {after: 5m, state: unknown}\n", "'state'"),
        ("    no_data: {after: 5m, when: x}\n", "unknown key 'when'"),
    ],
)
def test_bad_no_data_is_reported_with_its_position(tmp_path: Path, opts: str, message: str) -> None:
    f = tmp_path / "r.yaml"
    f.write_text("rules:\n" + with_opts(opts))
    with pytest.raises(RuleConfigError) as info:
        load_rules([f])
    (problem,) = [str(p) for p in info.value.problems]
    assert problem.startswith(f"{f}:6:") and "hot" in problem and message in problem, problem


def test_no_data_belongs_to_threshold_rules(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(
        "rules:\n  - id: quiet\n    source: sensors\n    absent_for: 5m\n    group_by: [device_id]\n"
        "    no_data: {after: 5m}\n"
    )
    with pytest.raises(RuleConfigError) as info:
        load_rules([f])
    (problem,) = [str(p) for p in info.value.problems]
    assert problem.startswith(f"{f}:6:14: quiet:") and "belongs to threshold rules" in problem, problem


def test_unset_no_data_keeps_existing_rule_versions(tmp_path: Path) -> None:
    plain = rules(tmp_path, HOT).rules[0]
    assert plain.version == "c9b401c3e12d"  # the version this rule had before no_data existed
    assert rules(tmp_path, with_opts("    no_data: {after: 5m}\n")).rules[0].version != plain.version
