"""``order: event_time``: a threshold, change or sequence rule takes its group's events in
event-time order once the watermark passes them, instead of skipping those that arrive out
of order, and runs its own timers on the watermark's axis."""

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
        (a.alert_id, a.status, a.starts_at, a.ends_at, a.event_ts, a.values, a.fingerprint)
        for o in outs
        for a in o.alerts
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


KINDS = {
    "threshold, keep_firing_for and clear": """
    where: status >= 400
    clear: status < 300
    keep_firing_for: 2m
    group_by: [host]""",
    "threshold, no_data": """
    where: status >= 400
    for: 20s
    group_by: [client_ip]
    no_data: {after: 5m, state: no_data}""",
    "change": """
    where: status >= 400
    change: status
    group_by: [host]
    resolve_after: 2m""",
    "sequence": """
    sequence:
      - {name: misses, where: status = 404, times: 2}
      - {name: hit, where: status = 200}
    within: 2m
    group_by: [client_ip]""",
    "sequence, absent step": """
    sequence:
      - {name: miss, where: status = 404}
      - {name: no_hit, where: status = 200, absent: true}
    within: 1m
    group_by: [client_ip]""",
}


@pytest.mark.parametrize("body", KINDS.values(), ids=KINDS.keys())
def test_every_order_dependent_kind_gives_the_alerts_of_the_sorted_log(
    tmp_path: Path, log_events: list[tuple[str, Event]], body: str
) -> None:
    """With its timers (keep_firing_for, no_data, resolve_after, an absent step, forgetting):
    the log as it comes, in event-time order within a minute, gives per alert the transitions
    of the same rule without lateness on the log sorted by time."""

    def pack(directory: Path, extra: str) -> RuleSet:
        directory.mkdir()
        (directory / "r.yaml").write_text(f"rules:\n  - id: r\n    source: logs{body}{extra}\n")
        return load_rules([directory])

    sorted_log = sorted(log_events, key=lambda item: item[1].ts_ms)
    expected, late = transitions(pack(tmp_path / "arrival", ""), sorted_log)
    assert late == 0
    assert len(expected) >= 4, "the rule raises alerts on the log: the comparison proves something"
    ordered = pack(tmp_path / "ordered", "\n    allowed_lateness: 1m\n    order: event_time")
    for batch in (0, 500):
        got, late = transitions(ordered, log_events, batch)
        assert late == 0
        assert per_alert(got) == per_alert(expected), f"batch {batch}"


def per_alert(alerts: list[Any]) -> dict[str, list[Any]]:
    """Each alert's (fingerprint's) transitions with their ids, in order. Different groups'
    alerts interleave differently: the sorted log runs a group's timers at other groups'
    events, the event-time order when the watermark passes them."""
    out: dict[str, list[Any]] = {}
    for a in alerts:
        out.setdefault(a[-1], []).append(a[:-1])
    return out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("order: event_time", "needs 'allowed_lateness'"),
        ("order: sorted", "order"),
    ],
)
def test_order_event_time_is_refused_where_it_cannot_apply(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(RuleConfigError, match=message):
        rules(tmp_path, extra)


def test_order_event_time_belongs_to_the_order_dependent_kinds(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        "rules:\n  - {id: w, source: logs, window: {type: tumbling, size: 1m}, aggregate: {n: count(*)},\n"
        "     having: n > 1, allowed_lateness: 1m, order: event_time}\n"
    )
    with pytest.raises(RuleConfigError, match="applies to threshold, change and sequence rules"):
        load_rules([tmp_path])


def test_adding_the_option_leaves_existing_rule_versions_alone(tmp_path: Path) -> None:
    """A rule without ``order`` keeps its version (and so its state) across the upgrade."""
    plain = rules(tmp_path / "a", "").rules[0]
    explicit = rules(tmp_path / "b", "order: arrival").rules[0]
    ordered = rules(tmp_path / "c", "allowed_lateness: 1m\n    order: event_time").rules[0]
    assert plain.version == explicit.version == "4b217ac26109"  # as computed before the option existed
    assert ordered.version != plain.version


def test_timers_run_in_time_order_between_released_events(tmp_path: Path) -> None:
    """One clock jump releases several waiting events: the rule's own timers due between
    them run between them, on the watermark's axis without a second lateness."""
    (tmp_path / "r.yaml").write_text(
        "rules:\n"
        "  - {id: changed, source: logs, change: status, group_by: [host], resolve_after: 20s,\n"
        "     allowed_lateness: 1m, order: event_time}\n"
        "  - {id: silent, source: logs, where: status >= 400, group_by: [host],\n"
        "     no_data: {after: 5m, state: no_data}, allowed_lateness: 10m, order: event_time}\n"
    )
    base = parse_ts("2024-01-01T00:00:00Z")

    def log(seconds: int, status: int, host: str = "h") -> tuple[str, Event]:
        row = {"host": host, "ts": format_ts(base + seconds * 1000), "status": status}
        return "logs", SCHEMAS["logs"].validate(row)

    eng = Engine(load_rules([tmp_path]))
    alerts = []
    events = (log(0, 404), log(5, 500), log(40, 404), log(330, 200), log(730, 200), log(5000, 200, "other"))
    for item in events:
        alerts += [(a.rule_id, a.status, a.starts_at, a.ends_at) for a in eng.process(*item).alerts]

    def at(seconds: int) -> str:
        return format_ts(base + seconds * 1000)

    # changed: 0, 5 and 40 wait until the clock reaches 330; released together, the episode
    # raised at 5 resolves at 25 (its timer) before the change back at 40 raises a new one
    assert [a[1:] for a in alerts if a[0] == "changed"] == [
        ("firing", at(5), None),
        ("resolved", at(5), at(25)),
        ("firing", at(40), None),
        ("resolved", at(40), at(60)),
        ("firing", at(330), None),
        ("resolved", at(330), at(350)),
    ]
    # silent: quiet from 330; no data at 630 (5 minutes on the watermark's axis, not 5 + 10),
    # before the event at 730 that ends it; silent again from 730
    assert [a[1:] for a in alerts if a[0] == "silent"] == [
        ("firing", at(0), None),
        ("resolved", at(0), at(330)),
        ("no_data", at(630), None),
        ("inactive", at(630), at(730)),
        ("no_data", at(1030), None),
    ]
