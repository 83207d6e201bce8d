"""Every rule kind on recorded inputs through the pure engine, in event time."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from app.alerts import Alert
from app.events import SCHEMAS, Event
from app.rules.evaluator import Engine, run_backtest
from app.rules.loader import RuleSet, load_rules
from app.rules.logic.threshold import pct_value, remember
from app.tables import Tables

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def rules(tmp_path: Path, body: str) -> RuleSet:
    f = tmp_path / "r.yaml"
    f.write_text("rules:\n" + body)
    return load_rules([f])


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat()


def ev(source: str, minutes: float, **fields: Any) -> tuple[str, Event]:
    return source, SCHEMAS[source].validate({"ts": at(minutes), **fields})


def sensor(minutes: float, device: str = "d1", **fields: Any) -> tuple[str, Event]:
    return ev("sensors", minutes, device_id=device, **fields)


def log(minutes: float, ip: str = "1.2.3.4", **fields: Any) -> tuple[str, Event]:
    return ev("logs", minutes, host="www", client_ip=ip, **fields)


def brief(alerts: list[Alert]) -> list[tuple[str, str, str | None]]:
    return [(a.status, a.starts_at[11:16], a.ends_at[11:16] if a.ends_at else None) for a in alerts]


HOURLY = """  - id: hourly-heat
    source: sensors
    group_by: [device_id]
    window: {type: tumbling, size: 1h}
    allowed_lateness: 10m
    aggregate: {avg_t: avg(temperature), max_t: max(temperature), n: count(*)}
    having: avg_t > 90
    severity: info
"""


def test_tumbling_window_fires_at_close_plus_lateness_and_resolves_on_the_next(tmp_path: Path) -> None:
    rs = rules(tmp_path, HOURLY)
    events = [sensor(m, temperature=95.0) for m in (0, 20, 40)]
    events += [sensor(65, temperature=50.0)]  # closes nothing yet: 60 + 10 lateness
    events += [sensor(71, temperature=50.0), sensor(131, temperature=50.0)]
    out = run_backtest(rs, events)
    assert brief(out) == [("firing", "00:00", None), ("resolved", "00:00", "01:00")]
    assert out[0].values["avg_t"] == 95.0 and out[0].values["n"] == 3
    assert out[0].values["window_end"] == int((T0 + timedelta(hours=1)).timestamp() * 1000)
    assert out[0].event_ts[11:16] == "01:00"


def test_late_event_within_lateness_counts_and_beyond_is_dropped_or_sided(tmp_path: Path) -> None:
    rs = rules(tmp_path, HOURLY.replace("avg_t > 90", "n >= 3"))
    # the third reading of hour 0 arrives 8 minutes after the hour: still counted
    out = run_backtest(
        rs,
        [
            sensor(10, temperature=1.0),
            sensor(30, temperature=1.0),
            sensor(68, temperature=1.0),
            sensor(50, temperature=1.0),
            sensor(75, temperature=1.0),
        ],
    )
    assert brief(out)[:1] == [("firing", "00:00", None)]
    side = rules(
        tmp_path, HOURLY.replace("allowed_lateness: 10m", "allowed_lateness: 10m\n    late_policy: side")
    )
    eng = Engine(side)
    for s, e in [sensor(10, temperature=1.0), sensor(75, temperature=1.0), sensor(30, temperature=1.0)]:
        out2 = eng.process(s, e)
    assert eng.stats.late == 1
    assert [orjson.loads(v)["rule_id"] for _, v in out2.late] == ["hourly-heat"]
    assert out2.late_count == 1


def test_every_late_policy_counts_the_late_event_in_its_output(tmp_path: Path) -> None:
    """The worker's ``worker_late_events_total`` counts an event's ``late_count``: a rule that
    drops it (the default) counts it as one that copies it aside does, without a copy."""
    both = HOURLY + HOURLY.replace("id: hourly-heat", "id: hourly-side").replace(
        "allowed_lateness: 10m", "allowed_lateness: 10m\n    late_policy: side"
    )
    eng = Engine(rules(tmp_path, both))
    outs = [eng.process(*sensor(m, temperature=1.0)) for m in (10, 75, 30)]
    assert [o.late_count for o in outs] == [0, 0, 2]
    assert [orjson.loads(v)["rule_id"] for _, v in outs[2].late] == ["hourly-side"]


def test_amend_policy_raises_an_alert_from_a_late_event(tmp_path: Path) -> None:
    body = HOURLY.replace("avg_t > 90", "n >= 2").replace(
        "allowed_lateness: 10m", "allowed_lateness: 10m\n    late_policy: amend"
    )
    out = run_backtest(
        rules(tmp_path, body),
        [sensor(10, temperature=1.0), sensor(62, temperature=1.0), sensor(50, temperature=1.0)],
    )
    assert brief(out) == [("firing", "00:00", None)]


def test_hopping_windows_overlap(tmp_path: Path) -> None:
    body = """  - id: busy
    source: logs
    group_by: [host]
    window: {type: hopping, size: 10m, advance: 5m}
    aggregate: {n: count(*)}
    having: n >= 3
"""
    events = [log(m) for m in (6, 7, 8)] + [log(30)]
    out = run_backtest(rules(tmp_path, body), events)
    # [0,10) and [5,15) both hold the three events: one episode from 00:00 to 00:15
    assert brief(out) == [("firing", "00:00", None), ("resolved", "00:00", "00:15")]


FORBIDDEN = """  - id: forbidden-burst
    source: logs
    where: status = 403
    group_by: [client_ip]
    window: {type: sliding, size: 1m}
    aggregate: {n: count(*)}
    having: n >= 5
    severity: warning
"""


def test_sliding_window_fires_on_the_fifth_and_resolves_when_they_expire(tmp_path: Path) -> None:
    events = [log(m / 10, status=403) for m in range(5)]  # five 403s within 24 s
    events += [log(0.3, ip="9.9.9.9", status=403), log(0.5, status=200), log(3, status=200)]
    out = run_backtest(rules(tmp_path, FORBIDDEN), events)
    assert [(a.status, a.labels["client_ip"], a.values["n"]) for a in out] == [
        ("firing", "1.2.3.4", 5),
        ("resolved", "1.2.3.4", 4),
    ]
    assert out[0].starts_at == "2024-01-01T00:00:24.000Z"
    assert out[1].ends_at == "2024-01-01T00:01:00.000Z"  # the first 403 left the window


def test_sliding_window_result_does_not_depend_on_order_within_lateness(tmp_path: Path) -> None:
    body = FORBIDDEN.replace("severity: warning", "allowed_lateness: 30s\n    severity: warning")
    ordered = [log(m / 10, status=403) for m in range(5)] + [log(3, status=200)]
    shuffled = [ordered[i] for i in (2, 0, 4, 1, 3, 5)]
    a = run_backtest(rules(tmp_path, body), ordered)
    b = run_backtest(rules(tmp_path, body), shuffled)
    assert [x.alert_id for x in a] == [x.alert_id for x in b] and a


def test_session_window_is_an_event_alert(tmp_path: Path) -> None:
    body = """  - id: long-session
    source: logs
    group_by: [client_ip]
    window: {type: session, gap: 5m}
    aggregate: {n: count(*), pages: count(distinct path)}
    having: n >= 3 and pages >= 2
"""
    events = [log(0, path="/a"), log(2, path="/b"), log(4, path="/a"), log(20, path="/c"), log(40, path="/c")]
    out = run_backtest(rules(tmp_path, body), events)
    assert brief(out) == [("firing", "00:00", None), ("resolved", "00:00", "00:14")]
    assert out[0].values["pages"] == 2


def test_spike_against_the_previous_window(tmp_path: Path) -> None:
    body = """  - id: error-spike
    source: logs
    where: status >= 500
    group_by: [host]
    window: {type: tumbling, size: 10m}
    aggregate: {n: count(*)}
    having: n >= 3 and n >= 2 * coalesce(prev(n), 0)
"""
    events = [log(1, status=500), log(2, status=500), log(3, status=500)]  # 3 vs 0
    events += [log(11, status=500), log(12, status=500), log(13, status=500), log(14, status=500)]  # 4 vs 3
    events += [log(31, status=200)]
    out = run_backtest(rules(tmp_path, body), events)
    assert brief(out) == [("firing", "00:00", None), ("resolved", "00:00", "00:10")]


DEVICES = Tables()
DEVICES.load_rows("devices", [
    {"device_id": "d1", "site": "lab-2", "max_temp": 30.0, "depot_lat": 52.52, "depot_lon": 13.405},
    {"device_id": "d3", "site": "lab-3", "max_temp": 40.0},
])  # fmt: skip


def test_absence_fires_after_silence_and_covers_registry_keys_never_seen(tmp_path: Path) -> None:
    body = """  - id: device-silent
    source: sensors
    group_by: [device_id]
    absent_for: 30m
    expect_from: devices
    severity: critical
"""
    events = [sensor(0, "d1", temperature=1.0), sensor(10, "d2", temperature=1.0)]
    events += [sensor(m, "d2", temperature=1.0) for m in range(20, 61, 10)]
    events += [sensor(70, "d1", temperature=1.0)]
    out = run_backtest(rules(tmp_path, body), events, tables=DEVICES)
    got = [(a.labels["device_id"], a.status, a.starts_at[11:16], a.ends_at and a.ends_at[11:16]) for a in out]
    assert ("d1", "firing", "00:30", None) in got
    assert ("d1", "resolved", "00:30", "01:10") in got
    assert ("d3", "firing", "00:30", None) in got  # in the registry, never seen
    assert all(d != "d2" for d, *_ in got)


def test_change_and_new_term(tmp_path: Path) -> None:
    body = """  - id: status-change
    source: sensors
    group_by: [device_id]
    change: status
  - id: new-agent
    source: logs
    group_by: [host]
    new_term: {field: user_agent, horizon: 1h}
"""
    rs = rules(tmp_path, body)
    events = [
        sensor(0, status="ok"),
        sensor(1, status="ok"),
        sensor(2, status="fault"),
        sensor(20, status="ok"),
    ]
    events += [
        log(0, user_agent="curl"),
        log(30, user_agent="bot"),
        log(55, user_agent="curl"),
        log(61, user_agent="curl"),
        log(62, user_agent="evil-scanner"),
        log(63, user_agent="evil-scanner"),
        log(200, user_agent="bot"),
    ]
    out = run_backtest(rs, events)
    change = [a for a in out if a.rule_id == "status-change"]
    # ok -> fault fires and resolves 5 minutes later (resolve_after); fault -> ok is a change too
    assert [(a.status, a.starts_at[11:16]) for a in change] == [
        ("firing", "00:02"),
        ("resolved", "00:02"),
        ("firing", "00:20"),
    ]
    assert change[1].ends_at is not None and change[1].ends_at[11:16] == "00:07"
    assert change[0].values == {"status": "fault", "previous": "ok"}
    new = [a for a in out if a.rule_id == "new-agent" and a.status == "firing"]
    # curl and bot were learned in the first hour; bot comes back after more than the horizon
    assert [a.values["user_agent"] for a in new] == ["evil-scanner", "bot"]


def test_new_term_prunes_its_terms_only_when_a_new_one_makes_a_thousand_more(tmp_path: Path) -> None:
    """Terms past the horizon are dropped when a new term brings the count to a multiple
    of 1,000; a group that stays there does not rebuild its terms at every event."""
    body = """  - id: new-agent
    source: logs
    group_by: [host]
    new_term: {field: user_agent, horizon: 1h}
"""
    eng = Engine(rules(tmp_path, body))
    store = next(s.evaluator.store for s in eng.streams["logs"] if s.evaluator.rules)
    for i in range(999):
        eng.process(*log(i * 0.01, user_agent=f"agent-{i}"))
    eng.process(*log(70, user_agent="late-comer"))  # the 1,000th: every older term is past the horizon
    (st,) = store.data.values()
    assert list(st["terms"]) == ["late-comer"]
    for i in range(998):
        eng.process(*log(71 + i * 0.01, user_agent=f"agent-{i}"))  # new again: 999 terms
    eng.process(*log(90, user_agent="x"))  # the 1,000th, all within the horizon: all kept
    terms = store.data[next(iter(store.data))]["terms"]
    assert len(terms) == 1000
    out = [a for i in range(50) for a in eng.process(*log(91 + i, user_agent="x")).alerts]
    assert store.data[next(iter(store.data))]["terms"] is terms  # not rebuilt by known terms
    assert [a.status for a in out] in ([], ["resolved"])  # "x" is known: nothing new fires


SEQ = """  - id: brute-force-then-success
    source: logs
    group_by: [client_ip]
    sequence:
      - {name: fails, where: status = 401, times: 3}
      - {name: ok, where: status = 200}
    within: 5m
    severity: critical
"""

MFA = """  - id: login-without-mfa
    source: logs
    group_by: [client_ip]
    sequence:
      - {name: login, where: path = '/login' and status = 200}
      - {name: mfa, where: path = '/mfa', absent: true}
    within: 2m
"""


def test_sequence_within_and_too_slow(tmp_path: Path) -> None:
    quick = [
        log(0, status=401),
        log(1, status=404),
        log(1.5, status=401),
        log(2, status=401),
        log(3, status=200),
    ]
    slow = [
        log(10, ip="5.5.5.5", status=401),
        log(11, ip="5.5.5.5", status=401),
        log(12, ip="5.5.5.5", status=401),
        log(16, ip="5.5.5.5", status=200),
    ]
    out = run_backtest(rules(tmp_path, SEQ), quick + slow)
    firing = [a for a in out if a.status == "firing"]
    assert [(a.labels["client_ip"], a.starts_at[11:16]) for a in firing] == [("1.2.3.4", "00:00")]


def test_sequence_resolution_counts_its_matches(tmp_path: Path) -> None:
    """The resolved alert's ``count`` is the number of completed sequences while it fired,
    not the progress of the sequence under way when it resolved."""
    twice = [log(m / 10, status=s) for m, s in enumerate([401, 401, 401, 200, 401, 401, 401, 200, 401])]
    out = run_backtest(rules(tmp_path, SEQ), [*twice, log(30, ip="9.9.9.9", status=200)])
    assert [(a.status, a.values.get("count")) for a in out] == [("firing", None), ("resolved", 2)]


def test_sequence_forgets_idle_groups(tmp_path: Path) -> None:
    """A group is forgotten once the partition clock moved within + allowed_lateness on
    from its last event; a firing group or one waiting for an absent step is kept until
    its alert resolves or its deadline passes."""
    body = SEQ.replace("within: 5m", "within: 5m\n    allowed_lateness: 1m\n    resolve_after: 20m")
    body += MFA.replace("within: 2m", "within: 30m\n    resolve_after: 1h")
    eng = Engine(rules(tmp_path, body))
    store = next(s.evaluator.store for s in eng.streams["logs"] if s.evaluator.rules)
    scanners = [log(i / 100, ip=f"10.0.0.{i}", status=404) for i in range(50)]  # one event each
    attack = [log(1, ip="6.6.6.6", status=401) for _ in range(3)] + [log(2, ip="6.6.6.6", status=200)]
    waiting = [log(2, ip="7.7.7.7", path="/login", status=200)]
    out = [a for s, e in [*scanners, *attack, *waiting] for a in eng.process(s, e).alerts]
    assert len(store.data) == 2 * 52  # both rules keep every group while it is recent

    def groups(rule: str) -> set[str]:
        return {k.split("\x1f")[1] for k in store.data if k.startswith(rule)}

    out += eng.process(*log(7.5, ip="8.8.8.8", status=404)).alerts  # 6.5 min after the scans
    assert groups("brute-force-then-success") == {"6.6.6.6", "7.7.7.7", "8.8.8.8"}  # 6.6.6.6 is firing
    assert len(groups("login-without-mfa")) == 53  # its within is 30 min
    out += eng.process(*log(40, ip="8.8.8.8", status=404)).alerts
    assert [(a.rule_id, a.labels["client_ip"], a.status) for a in out] == [
        ("brute-force-then-success", "6.6.6.6", "firing"),
        ("brute-force-then-success", "6.6.6.6", "resolved"),
        ("login-without-mfa", "7.7.7.7", "firing"),
    ]
    assert groups("brute-force-then-success") == {"8.8.8.8"}  # resolved, then forgotten
    assert groups("login-without-mfa") == {"7.7.7.7", "8.8.8.8"}  # firing until resolve_after
    # a forgotten group's old events are a new group's, not late ones; the alert, already
    # past its resolve_after, resolves at once, and the group is kept until the clock moves on
    late_before = eng.stats.late
    old = [log(1, ip="10.0.0.3", status=401) for _ in range(3)] + [log(1.5, ip="10.0.0.3", status=200)]
    again = [a for s, e in old for a in eng.process(s, e).alerts]
    assert eng.stats.late == late_before
    assert [(a.labels["client_ip"], a.status, a.starts_at[11:16]) for a in again] == [
        ("10.0.0.3", "firing", "00:01"),
        ("10.0.0.3", "resolved", "00:01"),
    ]
    assert groups("brute-force-then-success") == {"8.8.8.8", "10.0.0.3"}
    eng.process(*log(46, ip="8.8.8.8", status=404))  # the clock moves 6 min on from 40
    assert groups("brute-force-then-success") == {"8.8.8.8"}


def test_sequence_not_followed_by(tmp_path: Path) -> None:
    body = MFA
    events = [log(0, path="/login", status=200), log(1, path="/mfa", status=200)]  # followed: fine
    events += [log(5, ip="6.6.6.6", path="/login", status=200), log(9, path="/x", status=200)]
    out = run_backtest(rules(tmp_path, body), events)
    assert [(a.labels["client_ip"], a.status, a.starts_at[11:16]) for a in out] == [
        ("6.6.6.6", "firing", "00:05")
    ]


def test_enrichment_and_geofence(tmp_path: Path) -> None:
    body = """  - id: too-hot-for-its-site
    source: sensors
    enrich: [{table: devices, on: device_id, as: device}]
    where: temperature > device.max_temp
    group_by: [device_id]
    annotations: {summary: "{{ device_id }} at {{ device.site }}"}
  - id: vehicle-left-depot
    source: sensors
    enrich: [{table: devices, on: device_id, as: device}]
    where: distance_km(lat, lon, device.depot_lat, device.depot_lon) > 5
    group_by: [device_id]
"""
    events = [
        sensor(0, "d1", temperature=31.0),
        sensor(0, "d3", temperature=31.0),
        sensor(0, "nobody", temperature=99.0),
    ]
    events += [sensor(1, "d1", lat=52.52, lon=13.41), sensor(2, "d1", lat=52.60, lon=13.50)]
    out = run_backtest(rules(tmp_path, body), events, tables=DEVICES)
    firing = [(a.rule_id, a.labels["device_id"]) for a in out if a.status == "firing"]
    assert firing == [("too-hot-for-its-site", "d1"), ("vehicle-left-depot", "d1")]
    assert out[0].annotations["summary"] == "d1 at lab-2"


def test_branch_routes_events_by_condition(tmp_path: Path) -> None:
    body = """  - id: trade-size-branch
    source: finance
    branch:
      - {when: amount >= 40, to: finance.high_amount}
      - {otherwise: finance.low_amount}
"""
    eng = Engine(rules(tmp_path, body))
    big = eng.process(*ev("finance", 0, symbol="AAPL", amount=50.0))
    small = eng.process(*ev("finance", 0, symbol="AAPL", amount=5.0))
    null = eng.process(*ev("finance", 0, symbol="AAPL"))
    assert [(t, k) for t, k, _ in big.routed] == [("finance.high_amount", b"AAPL")]
    assert [t for t, _, _ in small.routed] == ["finance.low_amount"]
    assert [t for t, _, _ in null.routed] == ["finance.low_amount"]  # NULL is not TRUE
    assert orjson.loads(big.routed[0][2])["amount"] == 50.0


def test_hysteresis_and_keep_firing_for(tmp_path: Path) -> None:
    body = """  - id: hot
    source: sensors
    where: temperature > 100
    clear: temperature < 95
    keep_firing_for: 10m
    group_by: [device_id]
"""
    temps = [(0, 101), (1, 99), (2, 97), (3, 94), (8, 96), (9, 94), (25, 94)]
    out = run_backtest(rules(tmp_path, body), [sensor(m, temperature=float(t)) for m, t in temps])
    # 99 and 97 are inside the band; 94 clears at 00:03, but 96 at 00:08 is not a return above 100,
    # so it ends at 00:13 (cleared + 10m)
    assert brief(out) == [("firing", "00:00", None), ("resolved", "00:00", "00:13")]


def test_partition_emulation_gives_identical_results_for_keyed_rules(tmp_path: Path) -> None:
    rs = rules(tmp_path, HOURLY + FORBIDDEN)
    events = [sensor(m, f"d{m % 3}", temperature=95.0) for m in range(0, 200, 7)]
    events += [log(m / 10, ip=f"10.0.0.{m % 2}", status=403) for m in range(20)]
    one = run_backtest(rs, events, partitions=1)
    four = run_backtest(rs, events, partitions=4)
    assert sorted(a.alert_id for a in one) == sorted(a.alert_id for a in four) and one


def test_absence_stays_firing_until_an_event_at_or_after_its_start(tmp_path: Path) -> None:
    body = """  - id: silent
    source: sensors
    group_by: [device_id]
    absent_for: 30m
"""
    # d2 keeps the partition clock moving; d1 lags behind it by more than 30 minutes
    events = [sensor(0, "d1", temperature=1.0), sensor(45, "d2", temperature=1.0)]
    events += [
        sensor(10, "d1", temperature=1.0),
        sensor(20, "d1", temperature=1.0),
        sensor(40, "d1", temperature=1.0),
    ]
    out = run_backtest(rules(tmp_path, body), events)
    d1 = [
        (a.status, a.starts_at[11:16], a.ends_at and a.ends_at[11:16])
        for a in out
        if a.labels["device_id"] == "d1"
    ]
    # one episode, not one per late event: fired at 00:30, ended by the 00:40 reading
    assert d1 == [("firing", "00:30", None), ("resolved", "00:30", "00:40")]


HOT_TWICE = """  - id: hot-two-hours
    source: sensors
    group_by: [device_id]
    window: {type: tumbling, size: 1h}
    aggregate: {avg_t: avg(temperature)}
    having: avg_t > 90
    consecutive: 2
"""


def test_a_window_streak_pends_then_fires_on_its_second_window(tmp_path: Path) -> None:
    events = [sensor(m, temperature=95.0) for m in (0, 30, 60, 90)] + [sensor(121, temperature=20.0)]
    out = run_backtest(rules(tmp_path, HOT_TWICE), events)
    assert brief(out) == [("pending", "00:00", None), ("firing", "00:00", None)]
    assert [a.event_ts[11:16] for a in out] == ["01:00", "02:00"]
    assert out[0].alert_id != out[1].alert_id and out[0].fingerprint == out[1].fingerprint


def test_a_pending_window_streak_broken_by_a_cool_window_ends_inactive(tmp_path: Path) -> None:
    events = [sensor(m, temperature=t) for m, t in ((0, 95.0), (30, 95.0), (60, 20.0), (121, 20.0))]
    out = run_backtest(rules(tmp_path, HOT_TWICE), events)
    assert brief(out) == [("pending", "00:00", None), ("inactive", "00:00", "01:00")]


def test_an_empty_window_breaks_a_pending_streak(tmp_path: Path) -> None:
    # hot in hour 0, nothing in hour 1 (the device is silent), hot again in hour 2: not 2 in a row
    events = [sensor(m, temperature=95.0) for m in (0, 30, 120, 150)]
    events += [sensor(m, device="other", temperature=20.0) for m in (61, 121, 181)]  # moves the clock
    out = [a for a in run_backtest(rules(tmp_path, HOT_TWICE), events) if a.labels["device_id"] == "d1"]
    assert brief(out) == [
        ("pending", "00:00", None),
        ("inactive", "00:00", "01:00"),
        ("pending", "02:00", None),
    ]


def test_a_sliding_window_with_for_pends_first(tmp_path: Path) -> None:
    body = FORBIDDEN.replace("    having: n >= 5\n", "    having: n >= 2\n    for: 10s\n")
    assert body != FORBIDDEN
    events = [log(m / 10, status=403) for m in range(3)] + [log(3, status=200)]  # 403s at 0, 6 and 12 s
    out = run_backtest(rules(tmp_path, body), events)
    assert brief(out)[:2] == [("pending", "00:00", None), ("firing", "00:00", None)]
    assert [a.status for a in out] == ["pending", "firing", "resolved"]


def test_pct_change_history_matches_a_full_scan_and_stays_bounded(tmp_path: Path) -> None:
    """The lookback history is updated in place and trimmed in bulk: each percent change
    equals the one against the full history, and a busy group keeps about a lookback of it
    (one symbol ticking every second used to copy its whole hour at every event)."""
    body = """  - id: tick-jump
    source: finance
    group_by: [symbol]
    where: pct_change(price, 10m) >= 1
"""
    rule = rules(tmp_path, body).rules[0]
    (pc,) = rule.parts.pct_changes if rule.parts else ()
    rng = random.Random(3)  # noqa: S311 (a reproducible test input)
    hist: list[list[float]] = []
    seen: list[tuple[int, float]] = []
    ts = 0
    for _ in range(5_000):
        ts += rng.choice([0, 1_000, 1_000, 7_000])
        value = rng.choice([None, 0.0, 90.0, 100.0, 101.5])
        older = [v for t, v in seen if t <= ts - pc.lookback_ms]
        want = None if value is None or not older or not older[-1] else (value - older[-1]) / older[-1] * 100
        assert pct_value(hist, pc, ts, value) == want
        remember(hist, pc, ts, value)
        if value is not None:
            seen.append((ts, value))
        assert len(hist) <= 2 * sum(t > ts - pc.lookback_ms for t, _ in seen) + 2


def test_a_registry_change_between_events_reaches_the_next_event(tmp_path: Path) -> None:
    """Joined registry rows are cached across events and batches until a table changes."""
    body = """  - id: too-hot-for-its-site
    source: sensors
    enrich: [{table: devices, on: device_id, as: device}]
    where: temperature > device.max_temp
    group_by: [device_id]
    severity: warning
"""
    rs = rules(tmp_path, body)
    for batched in (False, True):
        tables = Tables()
        tables.load_rows("devices", [{"device_id": "d1", "site": "lab", "max_temp": 30.0}])
        eng = Engine(rs, tables=tables)

        def statuses(
            events: list[tuple[str, Event]], eng: Engine = eng, batched: bool = batched
        ) -> list[str]:
            outs = [eng.process_batch(events)] if batched else [eng.process(s, e) for s, e in events]
            return [a.status for out in outs for a in out.alerts]

        assert statuses([sensor(0, temperature=35.0), sensor(1, temperature=35.0)]) == ["firing"]
        tables.apply("devices", "d1", orjson.dumps({"device_id": "d1", "site": "lab", "max_temp": 40.0}))
        assert statuses([sensor(2, temperature=35.0)]) == ["resolved"], batched  # 35 is under the new 40


def test_a_window_fold_reads_plain_fields_from_the_batchs_shared_columns(tmp_path: Path) -> None:
    """fold_range folds ``rows[begin:end]`` (or the kept indexes) as fold does row by row,
    reading a plain-field input from the batch's columns: a column already read (by
    another rule's condition or fold) is not read from the rows again."""
    from app.rules.evaluator import logic_for
    from app.rules.logic.windows import TumblingLogic

    rule = rules(
        tmp_path,
        """  - id: w
    source: sensors
    group_by: [device_id]
    window: {type: tumbling, size: 1h}
    aggregate: {a: avg(temperature), m: max(temperature + 1), n: count(*)}
    having: a > 0
""",
    ).rules[0]
    logic = logic_for(rule)
    assert isinstance(logic, TumblingLogic)
    rows: list[Any] = [{"temperature": t} for t in (1.0, None, 4.0, 7.5, 2.0)]

    def by_row(picked: list[Any]) -> list[Any]:
        states = logic.empty()
        for row in picked:
            states = logic.fold(states, row)
        return states

    assert logic.fold_range(logic.empty(), rows, {}, None, 1, 4) == by_row(rows[1:4])
    assert logic.fold_range(logic.empty(), rows, {}, [0, 3], 0, 5) == by_row([rows[0], rows[3]])
    columns: dict[str, list[Any]] = {}
    logic.fold_range(logic.empty(), rows, columns, None, 0, 2)
    assert columns == {"temperature": [1.0, None, 4.0, 7.5, 2.0]}  # the whole batch's, read once
    shared = {"temperature": [10.0] * 5}  # what the next fold reads instead of the rows
    sums = logic.results(logic.fold_range(logic.empty(), rows, shared, None, 0, 5))
    assert sums == {"a": 10.0, "m": 8.5, "n": 5}  # max(temperature + 1) reads the rows
