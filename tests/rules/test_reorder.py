"""``order: event_time``: a threshold rule takes its group's events in event-time order
once the watermark passes them, instead of skipping those that arrive out of order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.errors import RuleConfigError
from app.events import SCHEMAS, Event, format_ts, parse_ts
from app.rules.evaluator import Engine
from app.rules.loader import RuleSet, load_rules
from ingest.adapters.apache import apache_events

ROOT = Path(__file__).resolve().parents[2]
APACHE = ROOT.parent / "shared" / "datasets" / "apache_logs" / "apache_logs"

RULE = """
rules:
  - id: errors
    source: logs
    where: status >= 400
    for: 1m
    group_by: [host]
    {extra}
"""


def rules(tmp_path: Path, extra: str) -> RuleSet:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "r.yaml").write_text(RULE.format(extra=extra))
    return load_rules([tmp_path])


def real_log() -> list[tuple[str, Event]]:
    rows = [r for r in apache_events(str(APACHE), host="www") if isinstance(r, dict)]
    events = [("logs", SCHEMAS["logs"].validate(r)) for r in rows]
    # one more event, another host, 10 minutes after the last: its clock lets the
    # watermark pass every waiting event
    last = max(e.ts_ms for _, e in events)
    flush = {"host": "zz", "ts": format_ts(last + 600_000), "status": 200}
    return [*events, ("logs", SCHEMAS["logs"].validate(flush))]


def transitions(ruleset: RuleSet, events: list[tuple[str, Event]], batch: int = 0) -> tuple[list[Any], int]:
    eng = Engine(ruleset)
    outs = (
        [eng.process_batch(events[i : i + batch]) for i in range(0, len(events), batch)]
        if batch
        else [eng.process(s, e) for s, e in events]
    )
    alerts = [
        (a.alert_id, a.status, a.starts_at, a.ends_at, a.event_ts, a.values) for o in outs for a in o.alerts
    ]
    return alerts, eng.stats.late


@pytest.fixture(scope="module")
def log_events() -> list[tuple[str, Event]]:
    return real_log()


def test_the_real_access_log_in_event_time_order(tmp_path: Path, log_events: list[tuple[str, Event]]) -> None:
    """The real log is out of order by up to 59 s: in arrival order the rule skips most of
    it; with order: event_time and a minute of lateness it gives exactly the alerts of the
    log sorted by time, one event at a time and in batches."""
    arrival = rules(tmp_path, "")
    ordered = rules(tmp_path / "o", "allowed_lateness: 1m\n    order: event_time")
    sorted_log = sorted(log_events, key=lambda item: item[1].ts_ms)  # stable: arrival order among ties

    expected, none_late = transitions(arrival, sorted_log)
    assert none_late == 0
    assert len(expected) > 20, "the sorted log raises alerts: the comparison proves something"
    skipping, late = transitions(arrival, log_events)
    assert late > 9_000  # arrival order: 94 % of the lines are older than one before them
    assert len(skipping) < len(expected)

    for batch in (0, 1, 64, 500):
        got, late = transitions(ordered, log_events, batch)
        assert late == 0
        assert [a[1:] for a in got] == [a[1:] for a in expected], f"batch {batch}"
    # same rule id and labels, so the same alert ids as the sorted log's
    assert {a[0] for a in got} == {a[0] for a in expected}


def test_an_event_behind_the_watermark_is_late_only_after_a_newer_one(tmp_path: Path) -> None:
    ordered = rules(tmp_path, "allowed_lateness: 1m\n    order: event_time")
    base = parse_ts("2024-01-01T00:00:00Z")

    def log(seconds: int, status: int, host: str = "h") -> tuple[str, Event]:
        row = {"host": host, "ts": format_ts(base + seconds * 1000), "status": status}
        return "logs", SCHEMAS["logs"].validate(row)

    eng = Engine(ordered)
    for item in (log(0, 500), log(30, 500), log(200, 200, host="other")):  # clock 200 s: both released
        eng.process(*item)
    assert eng.stats.late == 0
    eng.process(*log(10, 500))  # behind the watermark, and older than the newest evaluated (30 s)
    assert eng.stats.late == 1
    eng.process(*log(100, 503))  # behind the watermark (140 s) but newer than 30 s: evaluated now
    assert eng.stats.late == 1
    out = eng.process(*log(300, 200, host="other"))  # nothing waits: no alert from the timer
    assert out.alerts == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("order: event_time", "needs 'allowed_lateness'"),
        ("allowed_lateness: 1m\n    order: event_time\n    keep_firing_for: 5m", "cannot be combined"),
        ("allowed_lateness: 1m\n    order: event_time\n    no_data: {after: 5m}", "cannot be combined"),
        ("order: sorted", "order"),
    ],
)
def test_order_event_time_is_refused_where_it_cannot_apply(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(RuleConfigError, match=message):
        rules(tmp_path, extra)


def test_order_event_time_belongs_to_threshold_rules(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        "rules:\n  - {id: w, source: logs, window: {type: tumbling, size: 1m}, aggregate: {n: count(*)},\n"
        "     having: n > 1, allowed_lateness: 1m, order: event_time}\n"
    )
    with pytest.raises(RuleConfigError, match="applies to threshold rules"):
        load_rules([tmp_path])


def test_adding_the_option_leaves_existing_rule_versions_alone(tmp_path: Path) -> None:
    """A rule without ``order`` keeps its version (and so its state) across the upgrade."""
    plain = rules(tmp_path / "a", "").rules[0]
    explicit = rules(tmp_path / "b", "order: arrival").rules[0]
    ordered = rules(tmp_path / "c", "allowed_lateness: 1m\n    order: event_time").rules[0]
    assert plain.version == explicit.version == "4b217ac26109"  # as computed before the option existed
    assert ordered.version != plain.version
