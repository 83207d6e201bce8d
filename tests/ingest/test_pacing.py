"""Pacing and rebasing are pure: driven here with explicit clock values."""

from __future__ import annotations

import pytest

from app.errors import IngestDecodeError
from app.events import SENSORS
from app.eventtime import Clock
from ingest.pacing import Pacer, Rebaser

MIN = 60_000
DAY = 1440 * MIN


def test_gaps_are_divided_by_the_speedup() -> None:
    pacer = Pacer(speedup=60)
    assert pacer.delay(0, now=100.0) == 0.0
    assert pacer.delay(5 * MIN, now=100.0) == pytest.approx(5.0)
    # publishing took 1 s of the next 5 s wait: the schedule absorbs it
    assert pacer.delay(10 * MIN, now=106.0) == pytest.approx(4.0)


def test_out_of_order_and_equal_timestamps_do_not_wait() -> None:
    pacer = Pacer(speedup=60)
    pacer.delay(10 * MIN, now=0.0)
    assert pacer.delay(10 * MIN, now=0.0) == 0.0
    assert pacer.delay(5 * MIN, now=0.0) == 0.0  # late event: at once
    assert pacer.delay(11 * MIN, now=0.0) == pytest.approx(1.0)  # from the watermark, not the late event


def test_a_long_hole_is_capped_and_the_schedule_re_anchored() -> None:
    pacer = Pacer(speedup=100, max_sleep_s=5.0)
    pacer.delay(0, now=0.0)
    assert pacer.delay(30 * 60 * MIN, now=0.0) == 5.0  # 30 h / 100 = 18 min, capped
    assert pacer.delay(30 * 60 * MIN + 10_000, now=5.0) == pytest.approx(0.1)


def test_behind_schedule_never_waits_negative() -> None:
    pacer = Pacer(speedup=1)
    pacer.delay(0, now=0.0)
    assert pacer.delay(1000, now=50.0) == 0.0


def test_producers_on_one_clock_publish_on_one_axis_whenever_each_started() -> None:
    """The demo's fleet started 3 s after the NAB replay: each self-anchored, its readings ran
    2.5 hours of event time behind at speed-up 3000. On one clock both are due together."""
    clock = Clock(wall_s=1000.0, event_ms=0)
    early = Pacer(speedup=3000, anchor=clock.anchor(now=50.0, wall_now=995.0))  # up 5 s before
    late = Pacer(speedup=3000, anchor=clock.anchor(now=7.0, wall_now=1003.0))  # up 3 s after
    assert early.delay(0, now=50.0) == pytest.approx(5.0)  # the first event waits for the clock
    assert late.delay(0, now=7.0) == 0.0  # already due: at once
    assert late.delay(150 * MIN, now=7.0) == 0.0  # 150 minutes / 3000 = 3 s: due now
    assert late.delay(155 * MIN, now=7.0) == pytest.approx(0.1)
    assert early.delay(155 * MIN, now=55.0) == pytest.approx(3.1)  # the same instant: Unix 1003.1


def test_on_a_shared_clock_a_hole_is_waited_out_not_shortened() -> None:
    pacer = Pacer(speedup=100, max_sleep_s=5.0, anchor=(0.0, 0))
    assert pacer.delay(0, now=0.0) == 0.0
    assert pacer.delay(30 * 60 * MIN, now=0.0) == pytest.approx(1080.0)  # 30 h / 100: not capped
    assert pacer.delay(30 * 60 * MIN + 10_000, now=1080.0) == pytest.approx(0.1)  # still on the axis


def test_a_clock_reads_and_prints_wall_at_time_and_refuses_anything_else() -> None:
    clock = Clock.parse("1764432000.25@2013-12-10T12:00:00Z")
    assert clock == Clock(1764432000.25, 1_386_676_800_000)
    assert Clock.parse(str(clock)) == clock
    for text in (
        "noon",
        "1764432000",
        "0@2013-12-10T12:00:00Z",
        "x@2013-12-10T12:00:00Z",
        "inf@2013-12-10T12:00:00Z",
    ):
        with pytest.raises(ValueError, match="expected WALL@TIME"):
            Clock.parse(text)


def test_rebase_moves_the_first_event_to_now_and_keeps_spacing() -> None:
    rebaser = Rebaser(now_ms=1_700_000_000_000)
    first = SENSORS.validate({"device_id": "d", "ts": "2014-01-07T02:55:00Z", "value": 1})
    late = SENSORS.validate({"device_id": "d", "ts": "2014-01-07T02:00:00Z", "value": 2})
    a, b = rebaser.apply(first), rebaser.apply(late)
    assert a.ts_ms == 1_700_000_000_000
    assert a.fields["ts"] == "2023-11-14T22:13:20.000Z"
    assert a.ts_ms - b.ts_ms == 55 * MIN
    assert SENSORS.validate(b.fields).ts_ms == b.ts_ms


def test_a_fixed_shift_moves_every_event_by_one_offset_and_refuses_to_leave_the_schema_range() -> None:
    """``--shift-to``: the offset does not depend on the first event, so a replay resumed after
    what an earlier run sent stays on that run's axis; a time moved past 2100 is bad input."""
    rebaser = Rebaser.fixed(-3 * DAY)
    later = SENSORS.validate({"device_id": "d", "ts": "2014-03-14T09:06:00Z", "value": 1})
    assert rebaser.apply(later).fields["ts"] == "2014-03-11T09:06:00.000Z"
    assert SENSORS.validate(rebaser.apply(later).fields).ts_ms == later.ts_ms - 3 * DAY
    early = SENSORS.validate({"device_id": "d", "ts": "1970-01-02T00:00:00Z", "value": 1})
    moved = r"field .ts. 1970-01-02T00:00:00.000Z moved to 1969-12-30T00:00:00.000Z is outside 1970..2100"
    with pytest.raises(IngestDecodeError, match=moved) as caught:
        rebaser.apply(early)
    assert caught.value.field == "ts"
