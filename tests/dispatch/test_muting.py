"""Silences, inhibition, acks with escalation, flapping and storms, with an injected clock."""

from __future__ import annotations

from pathlib import Path

from app.dispatch.base import iso
from app.dispatch.commands import AckCommand, SilenceCommand, UnsilenceCommand
from app.dispatch.dispatcher import Dispatcher
from tests.dispatch.helpers import FakeClock, alert, ids_in, routes, run_until

FAST = """
route:
  receiver: ops
  group_by: ['...']
  group_wait: 1s
  group_interval: 10s
  repeat_interval: 1h
"""


def make(tmp_path: Path, extra: str = "") -> tuple[Dispatcher, FakeClock]:
    clock = FakeClock()
    return Dispatcher(routes(tmp_path, FAST + extra), clock=clock), clock


def silence(clock: FakeClock, *matchers: str, minutes: float = 10, sid: str = "s1") -> SilenceCommand:
    return SilenceCommand(
        silence_id=sid, matchers=matchers, starts_at=iso(clock.now), ends_at=iso(clock.now + minutes * 60),
        at=iso(clock.now), by="ann", comment="maintenance",
    )  # fmt: skip


def test_a_silence_mutes_until_it_ends_then_the_alert_is_sent(tmp_path: Path) -> None:
    d, clock = make(tmp_path)
    d.on_command(silence(clock, 'device_id=~"d[12]"', minutes=1))
    d.on_alert(alert("d1"))
    d.on_alert(alert("d3"))
    (msg,) = run_until(d, clock, 30)
    assert ids_in(msg) == [("d3", "firing")]
    (late,) = run_until(d, clock, 60)
    assert ids_in(late) == [("d1", "firing")]  # the silence ended


def test_unsilence_ends_a_silence_early(tmp_path: Path) -> None:
    d, clock = make(tmp_path)
    d.on_command(silence(clock, "severity=critical"))
    d.on_alert(alert("d1"))
    assert run_until(d, clock, 30) == []
    d.on_command(UnsilenceCommand(silence_id="s1", at=iso(clock.now), by="ann"))
    (msg,) = run_until(d, clock, 11)
    assert ids_in(msg) == [("d1", "firing")]


INHIBIT = """
inhibit_rules:
  - source_matchers: ['severity="critical"']
    target_matchers: ['severity="warning"']
    equal: [device_id]
"""


def test_inhibition_mutes_targets_with_equal_labels_while_the_source_fires(tmp_path: Path) -> None:
    d, clock = make(tmp_path, INHIBIT)
    d.on_alert(alert("d1", rule="overheat"))
    d.on_alert(alert("d1", severity="warning", rule="warm"))
    d.on_alert(alert("d2", severity="warning", rule="warm"))
    got = sorted(ids_in(m)[0] + (m.group_key,) for m in run_until(d, clock, 5))
    assert [(dev, status) for dev, status, _ in got] == [("d1", "firing"), ("d2", "firing")]
    assert "warm" in got[1][2] and "overheat" in got[0][2]  # d1's warning stayed muted
    d.on_alert(alert("d1", "resolved", rule="overheat"))
    later = run_until(d, clock, 15)
    assert sorted(s for m in later for s in ids_in(m)) == [("d1", "firing"), ("d1", "resolved")]


def test_unacknowledged_alert_escalates_and_its_resolution_follows(tmp_path: Path) -> None:
    d, clock = make(tmp_path, "  escalate: {after: 15m, to: pager}\n")
    d.on_alert(alert("d1"))
    (first,) = run_until(d, clock, 5)
    assert first.receiver == "ops"
    assert run_until(d, clock, 14 * 60) == []
    (esc,) = run_until(d, clock, 60, step=5)
    assert (esc.receiver, esc.notice, ids_in(esc)) == ("pager", "escalation", [("d1", "firing")])
    assert [m.receiver for m in run_until(d, clock, 3600, step=60)] == ["ops"]  # the hourly repeat only
    d.on_alert(alert("d1", "resolved"))
    resolved = [m for m in run_until(d, clock, 20) if m.receiver == "pager"]
    assert [ids_in(m) for m in resolved] == [[("d1", "resolved")]]


def test_an_ack_stops_escalation_and_repeats_but_not_the_resolution(tmp_path: Path) -> None:
    d, clock = make(tmp_path, "  escalate: {after: 15m, to: pager}\n")
    firing = alert("d1")
    d.on_alert(firing)
    run_until(d, clock, 5)
    d.on_command(AckCommand(fingerprint=firing.fingerprint, starts_at=firing.starts_at, at=iso(clock.now)))
    assert run_until(d, clock, 2 * 3600, step=30) == []  # no escalation, no hourly repeat
    d.on_alert(alert("d1", "resolved"))
    (msg,) = run_until(d, clock, 20)
    assert (msg.receiver, ids_in(msg)) == ("ops", [("d1", "resolved")])


FLAP = """
flapping: {window: 1h, changes: 4}
"""


def flap(d: Dispatcher, n: int, start_minute: int = 0) -> None:
    """n state changes of d1, one every 5 minutes of event time (new episode each firing)."""
    for i in range(n + 1):
        minute = start_minute + 5 * i
        start = f"2024-05-01T10:{minute - minute % 10:02d}:00Z"
        if i % 2 == 0:
            d.on_alert(alert("d1", start=start, event=start))
        else:
            d.on_alert(alert("d1", "resolved", start=start, event=f"2024-05-01T10:{minute:02d}:00Z"))


def test_flapping_alert_is_muted_with_one_notice_until_stable(tmp_path: Path) -> None:
    d, clock = make(tmp_path, FLAP)
    flap(d, 6)  # 6 changes within 30 minutes of event time
    msgs = run_until(d, clock, 60)
    notices = [m for m in msgs if "flapping" in m.group_key]
    assert [ids_in(m) for m in notices] == [[("d1", "firing")]]
    body = notices[0].body.decode()
    assert '"flapping":"true"' in body and "is flapping: 4 state changes within 1h" in body
    others = [s for m in msgs if m not in notices for s in ids_in(m)]
    assert len(others) <= 1  # at most the first state, before flapping started
    quiet = run_until(d, clock, 3600, step=60)  # stable for the window on the clock
    assert sorted(s for m in quiet for s in ids_in(m)) == [("d1", "firing"), ("d1", "resolved")]


def test_a_storm_collapses_into_one_incident_notice_and_nothing_floods_after(tmp_path: Path) -> None:
    d, clock = make(tmp_path, "  storm_threshold: 5\n")
    for i in range(20):
        d.on_alert(alert(f"d{i}"))
    (notice,) = run_until(d, clock, 5)  # one notice: every group's first flush is absorbed
    assert (notice.notice, ids_in(notice)) == ("storm", [("AlertStorm", "firing")])
    assert b'"alerts_in_window":6' in notice.body
    assert run_until(d, clock, 50) == []
    (over,) = run_until(d, clock, 30)
    assert (over.notice, ids_in(over)) == ("storm", [("AlertStorm", "resolved")])
    assert b'"collapsed":20' in over.body
    assert run_until(d, clock, 300) == []  # the collapsed alerts are not sent afterwards
    d.on_alert(alert("late"))
    assert [ids_in(m) for m in run_until(d, clock, 5)] == [[("late", "firing")]]
