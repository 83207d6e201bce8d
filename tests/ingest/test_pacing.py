"""Pacing and rebasing are pure: driven here with explicit clock values."""

from __future__ import annotations

import pytest

from app.events import SENSORS
from ingest.pacing import Pacer, Rebaser

MIN = 60_000


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


def test_rebase_moves_the_first_event_to_now_and_keeps_spacing() -> None:
    rebaser = Rebaser(now_ms=1_700_000_000_000)
    first = SENSORS.validate({"device_id": "d", "ts": "2014-01-07T02:55:00Z", "value": 1})
    late = SENSORS.validate({"device_id": "d", "ts": "2014-01-07T02:00:00Z", "value": 2})
    a, b = rebaser.apply(first), rebaser.apply(late)
    assert a.ts_ms == 1_700_000_000_000
    assert a.fields["ts"] == "2023-11-14T22:13:20.000Z"
    assert a.ts_ms - b.ts_ms == 55 * MIN
    assert SENSORS.validate(b.fields).ts_ms == b.ts_ms
