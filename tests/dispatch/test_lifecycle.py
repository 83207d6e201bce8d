"""Every transition through the Dispatcher with an injected clock: grouping timers, dedup,
repeats, send_resolved, pending, duplicates, manual resolution and state restore."""

from __future__ import annotations

from pathlib import Path

from app.dispatch.commands import ResolveCommand
from app.dispatch.dispatcher import Dispatcher
from tests.dispatch.helpers import TIMERS, FakeClock, alert, ids_in, routes, run_until, sent


def make(tmp_path: Path, body: str = TIMERS) -> tuple[Dispatcher, FakeClock]:
    clock = FakeClock()
    return Dispatcher(routes(tmp_path, body), clock=clock), clock


def test_group_wait_batches_then_group_interval_paces_and_resolution_is_sent(tmp_path: Path) -> None:
    d, clock = make(tmp_path)
    assert d.on_alert(alert("d1", "pending")) == "recorded"
    d.on_alert(alert("d1"))
    clock.advance(10)
    d.on_alert(alert("d2"))
    assert run_until(d, clock, 19) == []  # group_wait not over
    (first,) = run_until(d, clock, 2)
    assert ids_in(first) == [("d1", "firing"), ("d2", "firing")]
    d.on_alert(alert("d1", "resolved"))
    assert run_until(d, clock, 290) == []  # waits for group_interval
    (second,) = run_until(d, clock, 15)
    assert ids_in(second) == [("d1", "resolved"), ("d2", "firing")]
    assert second.msg_id != first.msg_id
    assert run_until(d, clock, 3600) == []  # nothing changed: no repeat before 4h


def test_repeat_interval_renotifies_with_a_new_message_id(tmp_path: Path) -> None:
    d, clock = make(tmp_path)
    d.on_alert(alert("d1"))
    first = run_until(d, clock, 31)
    repeats = run_until(d, clock, 4 * 3600 + 300, step=60)
    assert len(first) == 1 and len(repeats) == 1
    assert ids_in(repeats[0]) == ids_in(first[0]) and repeats[0].msg_id != first[0].msg_id


def test_duplicates_and_stale_transitions_change_nothing(tmp_path: Path) -> None:
    d, clock = make(tmp_path)
    d.on_alert(alert("d1"))
    assert d.on_alert(alert("d1")) == "duplicate"
    run_until(d, clock, 31)
    d.on_alert(alert("d1", "resolved"))
    assert d.on_alert(alert("d1")) == "stale"  # the older firing, redelivered late
    (msg,) = run_until(d, clock, 301)
    assert ids_in(msg) == [("d1", "resolved")]


def test_an_alert_that_fires_and_resolves_within_group_wait_is_not_sent(tmp_path: Path) -> None:
    d, clock = make(tmp_path)
    d.on_alert(alert("d1"))
    d.on_alert(alert("d1", "resolved"))
    assert run_until(d, clock, 400) == []
    assert len(d.groups.table) == 0  # the group is gone once empty


def test_send_resolved_false_logs_resolutions_without_sending_them(tmp_path: Path) -> None:
    d, clock = make(tmp_path, TIMERS.replace("receiver: ops", "receiver: quiet"))
    d.on_alert(alert("d1"))
    d.on_alert(alert("d2"))
    assert len(run_until(d, clock, 31)) == 1
    d.on_alert(alert("d1", "resolved"))
    assert run_until(d, clock, 301) == []  # no new firing alert, resolutions not wanted
    d.on_alert(alert("d2", "resolved"))
    assert run_until(d, clock, 301) == []  # all resolved: recorded in the log, nothing sent
    (entry,) = d.nflog.table.values()
    assert entry.firing == frozenset() and len(entry.resolved) == 1


def test_manual_resolve_publishes_the_same_id_the_evaluator_would(tmp_path: Path) -> None:
    d, clock = make(tmp_path)
    firing = alert("d1")
    d.on_alert(firing)
    run_until(d, clock, 31)
    d.on_command(
        ResolveCommand(fingerprint=firing.fingerprint, at="2026-01-01T00:00:00Z", by="ann", comment="ok")
    )
    (manual,) = d.take_effects().alerts
    assert manual.alert_id == alert("d1", "resolved").alert_id
    assert manual.annotations["resolved_by"] == "resolved by hand by ann: ok"
    (msg,) = run_until(d, clock, 301)
    assert ids_in(msg) == [("d1", "resolved")]
    assert d.on_alert(alert("d1", "resolved")) == "duplicate"  # the evaluator's later resolution


def test_state_survives_a_restart_without_duplicates_or_gaps(tmp_path: Path) -> None:
    d, clock = make(tmp_path)
    d.on_alert(alert("d1"))
    run_until(d, clock, 31)
    d.on_alert(alert("d1", "resolved"))
    saved = {t.name: [(k, v) for k, v in t.drain() if v is not None] for t in d.tables()}
    again = Dispatcher(d.config, clock=clock)
    for t in again.tables():
        t.restore(saved[t.name])
    (msg,) = run_until(again, clock, 301)  # the pending resolution is not lost...
    assert ids_in(msg) == [("d1", "resolved")]
    assert again.on_alert(alert("d1")) == "stale"  # ...and the firing is not sent twice
    assert sent(again) == []


def test_pending_no_data_and_inactive_are_recorded_never_notified(tmp_path: Path) -> None:
    d, clock = make(tmp_path)
    assert d.on_alert(alert("d1", "pending")) == "recorded"
    assert d.on_alert(alert("d1", "inactive", event="2024-05-01T10:05:00Z")) == "recorded"
    assert d.on_alert(alert("d2", "no_data", start="2024-05-01T10:40:00Z")) == "recorded"
    assert run_until(d, clock, 400) == []
    assert d.registry.get(alert("d2").fingerprint).status == "no_data"  # type: ignore[union-attr]
    # a pending or no-data alert cannot be resolved by hand: only firing ones are open
    d.on_command(ResolveCommand(fingerprint=alert("d2").fingerprint, at="2026-01-01T00:00:00Z", by="op"))
    assert d.take_effects().alerts == []
    # the episode that fires after its pending is notified as usual
    d.on_alert(alert("d1", start="2024-05-01T11:00:00Z"))
    (msg,) = run_until(d, clock, 31)
    assert ids_in(msg) == [("d1", "firing")]
