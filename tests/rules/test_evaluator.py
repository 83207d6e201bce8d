"""The pure evaluator: threshold lifecycle in event time, determinism, late events, rule health."""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app.alerts import Alert, alert_id, fingerprint
from app.events import SENSORS, Event
from app.rules.evaluator import Engine, StreamEvaluator, run_backtest
from app.rules.loader import load_rules
from app.rules.logic.base import DictStore
from app.rules.logic.windows import SlidingLogic
from app.runtime import native
from app.tables import Tables
from tests.conftest import NAB_MACHINE_TEMP, require_dataset
from tests.rules.helpers import HOT, rules, sensor


def statuses(alerts: list[Alert]) -> list[tuple[str, str, str | None]]:
    return [(a.status, a.starts_at, a.ends_at) for a in alerts]


def test_fires_then_resolves_with_event_times(tmp_path: Path) -> None:
    out = run_backtest(rules(tmp_path, HOT), [sensor(0, 90), sensor(1, 101), sensor(2, 102), sensor(3, 99)])
    assert statuses(out) == [
        ("firing", "2024-01-01T00:01:00.000Z", None),
        ("resolved", "2024-01-01T00:01:00.000Z", "2024-01-01T00:03:00.000Z"),
    ]
    firing = out[0]
    assert firing.labels == {"alertname": "hot", "severity": "critical", "device_id": "d1"}
    assert firing.annotations["summary"] == "d1 at 101"
    assert firing.values == {"temperature": 101.0}
    assert firing.fingerprint == fingerprint(firing.labels)
    assert firing.alert_id == alert_id("hot", firing.fingerprint, firing.starts_at, "firing")


def test_for_duration_holds_until_elapsed(tmp_path: Path) -> None:
    rs = rules(tmp_path, HOT.replace("    severity", "    for: 10m\n    severity"))
    out = run_backtest(rs, [sensor(0, 101), sensor(5, 101), sensor(9, 101), sensor(10, 101), sensor(20, 50)])
    assert statuses(out) == [
        ("pending", "2024-01-01T00:00:00.000Z", None),
        ("firing", "2024-01-01T00:00:00.000Z", None),
        ("resolved", "2024-01-01T00:00:00.000Z", "2024-01-01T00:20:00.000Z"),
    ]
    assert out[1].event_ts == "2024-01-01T00:10:00.000Z"


def test_for_resets_when_the_condition_breaks(tmp_path: Path) -> None:
    rs = rules(tmp_path, HOT.replace("    severity", "    for: 10m\n    severity"))
    out = run_backtest(rs, [sensor(0, 101), sensor(5, 99), sensor(9, 101), sensor(15, 101)])
    # pending episodes that end before ``for`` never fire: inactive, not resolved
    assert statuses(out) == [
        ("pending", "2024-01-01T00:00:00.000Z", None),
        ("inactive", "2024-01-01T00:00:00.000Z", "2024-01-01T00:05:00.000Z"),
        ("pending", "2024-01-01T00:09:00.000Z", None),
    ]


def test_consecutive_needs_n_in_a_row(tmp_path: Path) -> None:
    rs = rules(tmp_path, HOT.replace("    severity", "    consecutive: 3\n    severity"))
    out = run_backtest(
        rs, [sensor(0, 101), sensor(1, 101), sensor(2, 50), sensor(3, 101), sensor(4, 101), sensor(5, 101)]
    )
    assert statuses(out) == [
        ("pending", "2024-01-01T00:00:00.000Z", None),
        ("inactive", "2024-01-01T00:00:00.000Z", "2024-01-01T00:02:00.000Z"),
        ("pending", "2024-01-01T00:03:00.000Z", None),
        ("firing", "2024-01-01T00:03:00.000Z", None),
    ]


def test_groups_are_independent(tmp_path: Path) -> None:
    out = run_backtest(rules(tmp_path, HOT), [sensor(0, 101, "a"), sensor(1, 101, "b"), sensor(2, 50, "a")])
    assert [(a.labels["device_id"], a.status) for a in out] == [
        ("a", "firing"),
        ("b", "firing"),
        ("a", "resolved"),
    ]


def test_null_never_fires_and_late_events_are_skipped(tmp_path: Path) -> None:
    eng = Engine(rules(tmp_path, HOT))
    assert eng.process(*sensor(0, None)).alerts == []
    assert [a.status for a in eng.process(*sensor(5, 101)).alerts] == ["firing"]
    assert eng.process(*sensor(3, 50)).alerts == []  # late: would otherwise resolve
    assert eng.stats.late == 1
    assert [a.status for a in eng.process(*sensor(6, 50)).alerts] == ["resolved"]


def test_a_failing_rule_is_recorded_and_others_still_run(tmp_path: Path) -> None:
    rs = rules(tmp_path, HOT + HOT.replace("id: hot", "id: hot2"))
    eng = Engine(rs)

    def boom(_row: Any) -> Any:
        raise ZeroDivisionError("boom")

    logic = eng.streams["sensors"][0].evaluator.logics["hot"]
    logic.where = boom  # type: ignore[union-attr]
    out = eng.process(*sensor(0, 101)).alerts
    assert [a.rule_id for a in out] == ["hot2"]
    assert "ZeroDivisionError" in eng.stats.per_rule_errors["hot"]


def nab_events() -> list[tuple[str, Event]]:
    path = require_dataset(NAB_MACHINE_TEMP)
    out = []
    with path.open() as f:
        for row in csv.DictReader(f):
            ts = datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            out.append(
                (
                    "sensors",
                    SENSORS.validate(
                        {
                            "device_id": "machine-temp-1",
                            "ts": ts.isoformat(),
                            "temperature": float(row["value"]),
                        }
                    ),
                )
            )
    return out


def test_real_nab_series_is_deterministic_and_fires_in_labelled_failures() -> None:
    rs = load_rules([Path(__file__).parents[2] / "rules" / "iot.yaml"])
    events = nab_events()
    first = run_backtest(rs, events)
    second = run_backtest(rs, events)
    assert [a.alert_id for a in first] == [a.alert_id for a in second]
    assert len({a.alert_id for a in first}) == len(first)  # one id per transition
    overheat = [a for a in first if a.rule_id == "machine-overheat" and a.status == "firing"]
    assert overheat, "the real failure data must trip the overheat rule"
    # every firing is matched by a resolution of the same episode, except possibly the last
    resolved = {a.starts_at for a in first if a.rule_id == "machine-overheat" and a.status == "resolved"}
    assert len({a.starts_at for a in overheat} - resolved) <= 1
    assert overheat[0].starts_at == "2013-12-11T05:05:00.000Z"


def test_a_views_state_keys_are_the_rules_keys_remembered(tmp_path: Path) -> None:
    """``VersionedStore.key`` gives ``state_key`` for a group's suffix, the same string object
    each time (so its hash is not computed again), and stays right when its memo fills."""
    from app.rules.evaluator import group_and_suffix
    from app.rules.logic import base
    from app.rules.logic.base import DictStore, VersionedStore, state_key

    rule = rules(tmp_path, HOT).rules[0]
    view = VersionedStore(DictStore(), rule.version, 0, rule.id)
    group, suffix = group_and_suffix(rule, {"device_id": "m1"})
    first = view.key(suffix)
    assert first == state_key(rule, group) == f"{rule.id}\x1fm1"
    assert view.key("\x1fm" + "1") is first  # an equal suffix built anew finds the same key
    for i in range(base.MAX_STATE_KEYS + 5):  # past the memo's bound it starts again
        assert view.key(f"\x1fd{i}") == f"{rule.id}\x1fd{i}"
    assert view.key(suffix) == first


def test_each_rule_counts_the_events_it_evaluated_and_those_its_where_matched(tmp_path: Path) -> None:
    """Counted per rule on the batch path: events skipped for a missing registry row are not
    evaluated, a rule without ``where`` matches every event it evaluates, a branch counts its
    ``where``, and taking the counts starts them again from zero."""
    body = (
        HOT
        + """  - id: any-reading
    source: sensors
    group_by: [device_id]
    absent_for: 30m
    severity: info
  - id: joined
    source: sensors
    enrich: [{table: devices, on: device_id, as: device}]
    where: temperature > device.max_temp
    group_by: [device_id]
    severity: warning
  - id: copy-hot
    source: sensors
    where: temperature > 50
    branch:
      - {when: temperature > 100, to: sensors.very-hot}
      - {otherwise: sensors.hot}
"""
    )
    tables = Tables()
    tables.load_rows("devices", [{"device_id": "d1", "site": "lab", "max_temp": 95.0}])
    eng = Engine(rules(tmp_path, body), tables=tables)
    temps = [90, 101, 102, 40, 99]
    events = [sensor(m, t) for m, t in enumerate(temps)] + [sensor(9, 120, device="d2")]  # d2: no row
    eng.process_batch(events[:3])
    eng.process_batch(events[3:])
    assert eng.take_rule_counts() == {
        "hot": (6, 3),  # 101, 102, 120
        "any-reading": (6, 6),
        "joined": (5, 3),  # d2 skipped; d1 above its 95: 101, 102, 99
        "copy-hot": (6, 5),
    }
    assert eng.take_rule_counts() == {}
    eng.process_batch([sensor(20, 130)])
    assert eng.take_rule_counts()["hot"] == (1, 1)


#: a sliding window per device whose change point at each event is due at once (no lateness),
#: or 10 s later (``LATENESS``)
SPREAD = """  - id: spread
    source: sensors
    group_by: [device_id]
    window: {type: sliding, size: 30s}
    allowed_lateness: LATENESS
    aggregate: {lo: min(temperature), hi: max(temperature)}
    having: hi - lo > 5
"""


def _stream(tmp_path: Path, lateness: str) -> tuple[StreamEvaluator, Any, Any]:
    """A stream evaluator of ``spread`` (with a test's logic in place of its own) and ``hot``."""
    rs = rules(tmp_path, SPREAD.replace("LATENESS", lateness) + HOT)
    spread, hot = rs.rules
    return StreamEvaluator("sensors.device_id", [spread, hot], DictStore()), spread, hot


class _Runaway(BaseException):
    """Not an ``Exception``: the evaluator does not catch it."""


_PLAIN_ONLY = pytest.mark.skipif(
    native.active(),
    reason="a compiled logic class cannot be subclassed in Python; make test runs this in its "
    "plain-Python pass (APP_NATIVE=0)",
)


@_PLAIN_ONLY
@pytest.mark.parametrize("lateness", ["0s", "10s"])
def test_a_timer_that_raises_is_tried_again_when_the_clock_moves_not_in_a_loop(
    tmp_path: Path, lateness: str
) -> None:
    """A rule whose timer raises (a bug) is counted, and tried again at a later clock; the
    evaluator goes on, and the stream's other rules fire. Its state still says the timer is
    due, so re-arming it from the state used to run it again within the same event, forever:
    the partition hung, logging the error."""
    evaluator, spread, _hot = _stream(tmp_path, lateness)
    calls: list[int] = []

    class Broken(SlidingLogic):
        def on_timer(self, store: Any, key: str, clock_ms: int) -> list[Any]:
            calls.append(clock_ms)
            if len(calls) > 100:
                raise _Runaway  # not caught by the evaluator: ends the loop, fails the test
            raise RuntimeError("a bug in the rule's timer")

    evaluator.use_logic(spread.id, Broken(spread))
    temps = [90.0, 101.0, 102.0, 95.0, 96.0, 97.0]
    fired = []
    for minute, temp in enumerate(temps):
        fired += evaluator.process(sensor(minute, temp)[1]).alerts
    assert [(a.rule_id, a.status) for a in fired] == [("hot", "firing"), ("hot", "resolved")]
    assert evaluator.stats.errors == len(calls)
    assert "a bug in the rule's timer" in evaluator.stats.per_rule_errors[spread.id]
    # tried at most twice per event (as the clock passes the failed time, and after the
    # event's own write), and again as the clock moves on: not once and never again
    assert len(temps) - 1 <= len(calls) <= 2 * len(temps)
    assert calls == sorted(calls)


@_PLAIN_ONLY
@pytest.mark.parametrize("batch", [False, True])
def test_a_timer_an_event_makes_due_at_once_runs_at_that_event_once(tmp_path: Path, batch: bool) -> None:
    """Each event of a sliding window without lateness is a change point due at once: its
    timer runs at that event, once, after the timers due before it; a later event runs the
    timers the clock passed (the events leaving the window) first, then its own."""
    evaluator, spread, _hot = _stream(tmp_path, "0s")
    runs: list[tuple[str, int]] = []

    class Recording(SlidingLogic):
        def on_timer(self, store: Any, key: str, clock_ms: int) -> list[Any]:
            runs.append((key.rsplit("\x1f", 1)[-1], clock_ms))
            return super().on_timer(store, key, clock_ms)

    evaluator.use_logic(spread.id, Recording(spread))
    t0 = sensor(0, 0.0)[1].ts_ms
    events = [
        sensor(0, 20.0, "d1")[1],
        _at(sensor(0, 21.0, "d1")[1], t0 + 1_000),
        _at(sensor(0, 30.0, "d1")[1], t0 + 2_000),
        _at(sensor(0, 20.0, "d2")[1], t0 + 40_000),
    ]
    if batch:
        alerts = evaluator.process_batch(events).alerts
    else:
        alerts = [a for ev in events for a in evaluator.process(ev).alerts]
    keys = [r[0] for r in runs]
    assert [r[1] - t0 for r in runs] == [0, 1_000, 2_000, 40_000, 40_000]
    assert keys[:4] == [keys[0]] * 4 and keys[4] != keys[0]
    # d1's spread went over 5 at 2 s (20 to 30), and back under as the values left (32 s)
    assert [(a.status, a.labels["device_id"]) for a in alerts] == [("firing", "d1"), ("resolved", "d1")]


def _at(ev: Event, ts_ms: int) -> Event:
    return SENSORS.validate({**ev.fields, "ts": datetime.fromtimestamp(ts_ms / 1000, UTC).isoformat()})
