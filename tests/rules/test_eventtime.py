"""The evaluator's event-time bound (APP_MAX_EVENT_SKEW, docs/event-time.md): no single
event moves a partition's clock by more than the skew; a real jump is taken once a second
event confirms it; held and refused events are reported, never lost silently."""

from __future__ import annotations

import copy
import io
import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path

from app.alerts import Alert
from app.backtest import BacktestReport, backtest
from app.events import SENSORS, Event
from app.rules.evaluator import DictStore, Engine, StreamEvaluator
from app.rules.loader import RuleSet, load_rules
from app.rules.timebound import HOLD_LIMIT_MS
from app.runtime.settings import PROJECT_ROOT
from ingest.adapters.nab import nab_events
from tests.conftest import DATASETS, NAB_MACHINE_TEMP, require_dataset

SKEW = 5 * 60_000
T0 = datetime(2024, 1, 1, tzinfo=UTC)
SILENT = """rules:
  - id: silent
    source: sensors
    group_by: [device_id]
    absent_for: 30m
  - id: hot
    source: sensors
    where: temperature > 100
    group_by: [device_id]
"""


def ev(minute: float, device: str = "d1", temp: float = 20.0) -> Event:
    ts = (T0 + timedelta(minutes=minute)).isoformat()
    return SENSORS.validate({"device_id": device, "ts": ts, "temperature": temp})


def future(device: str, ts: str = "2099-12-31T00:00:00Z", temp: float = 20.0) -> Event:
    return SENSORS.validate({"device_id": device, "ts": ts, "temperature": temp})


def ruleset(tmp_path: Path, text: str = SILENT) -> RuleSet:
    f = tmp_path / "r.yaml"
    f.write_text(text)
    return load_rules([f])


def evaluator(tmp_path: Path, store: DictStore | None = None) -> StreamEvaluator:
    rs = ruleset(tmp_path)
    return StreamEvaluator("sensors", list(rs.rules), store or DictStore(), max_skew_ms=SKEW)


def nab(device: str = "machine-temp-1") -> list[tuple[str, Event]]:
    path = require_dataset(NAB_MACHINE_TEMP)
    return [
        ("sensors", SENSORS.validate(r)) for r in nab_events(str(path), device=device, field="temperature")
    ]  # type: ignore[arg-type]


def run(
    rs: RuleSet, events: list[tuple[str, Event]], skew: int, partitions: int
) -> tuple[list[Alert], BacktestReport]:
    report = BacktestReport(statuses=frozenset({"firing", "resolved", "pending"}))
    alerts = backtest(rs, events, io.StringIO(), report, partitions=partitions, max_skew_ms=skew)
    return alerts, report


def test_future_dated_events_leave_the_real_nab_series_alerts_unchanged() -> None:
    rs = load_rules([PROJECT_ROOT / "rules"])
    series = nab()
    expected, clean = run(rs, series, SKEW, partitions=1)
    assert len(expected) > 100 and clean.refused == 0
    bad = [
        future("rogue-1"),  # another device's bad clock, on the same (only) partition
        future("machine-temp-1"),  # the device's own clock, once
        future("machine-temp-1", "2014-02-10T00:00:00Z"),  # weeks ahead, not years
    ]
    mixed = [*series[:5000], ("sensors", bad[0]), *series[5000:9000], ("sensors", bad[1])]
    mixed += [*series[9000:15000], ("sensors", bad[2]), *series[15000:]]
    got, report = run(rs, mixed, SKEW, partitions=1)
    assert [a.alert_id for a in got] == [a.alert_id for a in expected]
    assert report.refused == 3
    assert "2099-12-31T00:00:00.000Z is 31" in report.problems[0]
    assert "ahead of its partition's clock 2013-12-" in report.problems[0]
    assert (
        "(max skew 5m; stream sensors, partition 0); the clock moved on 1d since without a witness"
        in (report.problems[0])
    )
    # without the bound, the one event wrecks the partition: what the bound prevents
    wrecked, _ = run(rs, mixed, -1, partitions=1)
    assert len(wrecked) != len(expected)
    assert sum(a.rule_id == "device-silent" for a in wrecked) > 1000


def test_real_multi_hour_gaps_are_taken_once_the_next_event_confirms_them() -> None:
    """The NAB ambient series is hourly with gaps of up to 30 hours: every event is more
    than the skew ahead, each is confirmed by the next; only the last, which nothing
    follows, is refused."""
    path = require_dataset(DATASETS / "nab/data/realKnownCause/ambient_temperature_system_failure.csv")
    rs = load_rules([PROJECT_ROOT / "rules" / "iot.yaml"])
    series = [
        ("sensors", SENSORS.validate(r))
        for r in nab_events(str(path), device="office-1", field="temperature")
    ]  # type: ignore[arg-type]
    times = [e.ts_ms for _, e in series]
    assert max(b - a for a, b in itertools.pairwise(times)) > 24 * 3_600_000
    unbounded, _ = run(rs, series[:-1], -1, partitions=1)
    bounded, report = run(rs, series, SKEW, partitions=1)
    assert [a.alert_id for a in bounded] == [a.alert_id for a in unbounded]
    assert report.refused == 1 and "before the input ended" in report.problems[0]


def test_a_held_event_is_confirmed_by_another_key_and_evaluated_first(tmp_path: Path) -> None:
    e = evaluator(tmp_path)
    e.process(ev(0, "a"))
    e.process(ev(1, "b"))
    held = e.process(ev(60, "a", temp=101))
    assert held.alerts == [] and held.refused == [] and e.clocks[0] == ev(1).ts_ms
    out = e.process(ev(61, "b"))  # another device agrees: the partition did move on
    assert e.clocks[0] == ev(61).ts_ms
    # both devices were silent from minute 1 to 60: the absences fire at 31 as the clock passes
    assert [(a.rule_id, a.labels["device_id"], a.status) for a in out.alerts] == [
        ("silent", "a", "firing"),
        ("silent", "b", "firing"),
        ("silent", "a", "resolved"),
        ("hot", "a", "firing"),
        ("silent", "b", "resolved"),
    ]


def test_one_future_event_never_moves_the_clock_and_is_refused_with_its_reason(tmp_path: Path) -> None:
    e = evaluator(tmp_path)
    e.process(ev(0, "a"))
    assert e.process(future("b")).refused == []
    day = HOLD_LIMIT_MS // 60_000
    refused = []
    for m in range(5, day + 1, 5):
        out = e.process(ev(m, "a"))
        assert out.alerts == []  # "b" never went silent: the clock never jumped
        assert (out.refused != []) == (m == day)  # refused once the clock moved on a day without it
        refused += out.refused
    assert e.clocks[0] == ev(day).ts_ms
    assert [(r[0].key, r[0].fields["ts"]) for r in refused] == [("b", "2099-12-31T00:00:00.000Z")]
    assert refused[0][1].startswith("event time 2099-12-31T00:00:00.000Z is ")
    assert refused[0][1].endswith("; the clock moved on 1d since without a witness")
    assert e.stats.refused == 1


def test_a_held_event_the_clock_catches_up_with_is_evaluated(tmp_path: Path) -> None:
    """Events of several partitions merged into one regrouped stream run apart: one far ahead
    of the rest waits until they catch up, and is then evaluated, not refused."""
    e = evaluator(tmp_path)
    e.process(ev(0, "a"))
    assert e.process(ev(20, "b", 101)).alerts == []  # held
    outs = [e.process(ev(m, "a")) for m in range(1, 17)]  # another partition's events, behind
    assert [a.rule_id for o in outs for a in o.alerts] == ["hot"]  # "b" came when the clock reached 15
    assert outs[14].alerts[0].labels["device_id"] == "b" and e.stats.refused == 0


def test_the_same_device_confirms_itself_only_where_it_talks_alone_or_nothing_came_between(
    tmp_path: Path,
) -> None:
    alone = evaluator(tmp_path)
    for m in (0, 60, 65):
        alone.process(ev(m, "a"))
    assert alone.clocks[0] == ev(65).ts_ms  # one device, a real gap: taken
    moved_on = evaluator(tmp_path)
    for m, device in ((0, "a"), (0.5, "b"), (60, "b"), (61, "b")):
        moved_on.process(ev(m, device))
    assert moved_on.clocks[0] == ev(61).ts_ms  # every event since is at the new time: taken
    shared = evaluator(tmp_path)
    for e in (ev(0, "a"), ev(0.5, "b"), future("b", "2030-01-01T00:00:00Z"), ev(1, "a")):
        shared.process(e)
    shared.process(future("b", "2030-01-01T00:01:00Z"))  # a bad clock agrees with itself: not enough
    assert shared.clocks[0] == ev(1).ts_ms
    assert len(shared.finish().refused) == 2


def test_the_end_of_the_input_refuses_what_is_still_held(tmp_path: Path) -> None:
    rs = ruleset(tmp_path)
    alerts, report = run(rs, [("sensors", ev(0)), ("sensors", ev(1)), ("sensors", ev(90))], SKEW, 1)
    assert alerts == [] and report.refused == 1
    assert "no later event on the partition confirmed it before the input ended" in report.problems[0]


def test_the_wall_clock_refuses_what_is_ahead_of_it_and_witnesses_what_is_near_it(tmp_path: Path) -> None:
    e = evaluator(tmp_path)
    now = ev(600).ts_ms
    e.process_batch([ev(0, "a")], 0, now)
    out = e.process_batch([ev(606, "a"), ev(598, "b")], 0, now)
    assert [r[0].fields["ts"] for r in out.refused] == ["2024-01-01T10:06:00.000Z"]
    assert "ahead of the wall clock 2024-01-01T10:00:00.000Z (max skew 5m)" in out.refused[0][1]
    assert e.clocks[0] == ev(598).ts_ms  # ten hours ahead of the partition, but now: taken at once


def test_batches_hold_and_release_exactly_as_single_events(tmp_path: Path) -> None:
    stream = [ev(0, "a"), ev(1, "b"), future("c"), ev(2, "a"), ev(60, "a", 101), ev(40, "b"), ev(61, "b")]
    stream += [ev(61.5, "c"), future("c", "2024-01-01T05:00:00Z"), ev(62, "a", 102), ev(63, "b")]
    one = evaluator(tmp_path)
    singles = [o for e in stream for o in (one.process(e),)]
    many = evaluator(tmp_path)
    batched = [
        many.process_batch(stream[:4]),
        many.process_batch(stream[4:9]),
        many.process_batch(stream[9:]),
    ]
    ids = sorted(a.alert_id for o in singles for a in o.alerts)
    assert ids and ids == sorted(a.alert_id for o in batched for a in o.alerts)
    assert [r for o in singles for r in o.refused] == [r for o in batched for r in o.refused]
    assert one.clocks == many.clocks and one.finish().refused == many.finish().refused


def test_a_restart_resumes_the_clock_and_the_held_events(tmp_path: Path) -> None:
    store = DictStore()
    before = evaluator(tmp_path, store)
    before.process_batch([ev(0, "a"), ev(1, "b"), ev(60, "a", 101)])
    after = evaluator(tmp_path, store)  # a restarted worker, or the same rules reloaded
    after.restore(store.items())
    assert after.clocks[0] == ev(1).ts_ms and not after.process_batch([ev(2, "b")]).alerts
    out = after.process_batch([ev(61, "b")])  # confirms the held event, which the restart kept
    assert [a.rule_id for a in out.alerts if a.status == "firing"] == ["silent", "silent", "hot"]


def test_the_bound_is_off_unless_asked_for(tmp_path: Path) -> None:
    eng = Engine(ruleset(tmp_path))
    eng.process("sensors", ev(0))
    eng.process("sensors", future("b"))
    assert eng.streams["sensors"][0].evaluator.clocks[0] == future("b").ts_ms


def test_the_live_worker_takes_a_held_event_on_a_quiet_partition_as_a_new_start(tmp_path: Path) -> None:
    wall = ev(365 * 24 * 60).ts_ms  # a replay of last year's data: the wall clock witnesses nothing
    quiet = evaluator(tmp_path)
    quiet.process_batch([ev(0, "a")], 0, wall)
    quiet.process_batch([ev(60, "a", 101)], 0, wall)  # held: nothing follows it
    assert quiet.release(0, wall + 2_999, 3_000).alerts == []
    out = quiet.release(0, wall + 3_000, 3_000)
    assert [(a.rule_id, a.status) for a in out.alerts] == [
        ("silent", "firing"),
        ("silent", "resolved"),
        ("hot", "firing"),
    ]
    assert quiet.clocks[0] == ev(60).ts_ms and quiet.held_partitions() == []
    busy = evaluator(tmp_path)
    busy.process_batch([ev(0, "a"), ev(1, "b"), future("a", "2024-01-02T00:00:00Z"), ev(2, "b")], 0, wall)
    assert busy.release(0, wall + 60_000, 3_000).alerts == []  # the partition went on without it
    assert busy.held_partitions() == [0]


def test_a_partition_forgotten_and_restored_goes_on_from_the_restored_state_alone(tmp_path: Path) -> None:
    """What the rule worker does at a rebalance: the partition's state is read again from the
    changelog (the last commit) and the events after it are read again; nothing memory kept
    of those events (the clock, a held event, a timer) may count them a second time."""
    committed = [ev(0, "a"), ev(1, "b")]
    after_commit = [ev(60, "a", 101), ev(2, "b")]  # the first is held: 59 min ahead of the clock
    then = [ev(61, "b"), ev(95, "b")]  # confirms the held event; the absence of "a" comes due

    live_store = DictStore()
    live = evaluator(tmp_path, live_store)
    live.process_batch(committed, 0)
    snapshot = copy.deepcopy(live_store.data)  # the changelog at the commit
    assert not live.process_batch(after_commit, 0).alerts and live.held_partitions() == [0]
    live.process_batch([ev(0, "z")], 1)  # another partition, kept as it is

    live.forget(0)
    live_store.data.update(copy.deepcopy(snapshot))  # the restore overwrites the partition's states
    live.restore(live_store.items())
    replayed = [live.process_batch(after_commit, 0), live.process_batch(then, 0)]

    fresh_store = DictStore(copy.deepcopy(snapshot))
    fresh = evaluator(tmp_path, fresh_store)  # a worker that never saw the events after the commit
    fresh.restore(fresh_store.items())
    expected = [fresh.process_batch(after_commit, 0), fresh.process_batch(then, 0)]

    ids = [sorted(a.alert_id for a in o.alerts) for o in expected]
    assert ids[1], "the held event and the absence alert"
    assert [sorted(a.alert_id for a in o.alerts) for o in replayed] == ids
    assert live.clocks[0] == fresh.clocks[0] and live.held_partitions() == fresh.held_partitions()
    assert {k: v for k, v in live_store.data.items() if v.get("partition") == 0} == fresh_store.data
    assert live.clocks[1] == ev(0).ts_ms  # partition 1 untouched
