"""BusyWatch: `make run` warns once when the embedded broker keeps a CPU busy (app.broker)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from app.broker import BusyWatch, cpu_seconds


class Fake:
    """A clock and a CPU counter the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu: float | None = 0.0

    def run(self, seconds: float, share: float) -> None:
        self.now += seconds
        assert self.cpu is not None
        self.cpu += seconds * share


def watch(fake: Fake, warned: list[float], **kw: float) -> BusyWatch:
    return BusyWatch(lambda: fake.cpu, warned.append, clock=lambda: fake.now, **kw)


def test_warns_once_when_the_share_over_a_full_window_reaches_the_threshold() -> None:
    fake, warned = Fake(), []
    w = watch(fake, warned, threshold=0.8, window_s=60, every_s=5)
    assert w.poll() is None  # the first reading
    for _ in range(12):  # a whole minute at 50 %
        fake.run(5, 0.5)
        w.poll()
    assert w.poll() is None  # less than every_s since the last reading: nothing read
    assert warned == []
    shares = []
    for _ in range(11):  # then busy: after k readings, the last minute is 0.5 + k/24 busy
        fake.run(5, 1.0)
        shares.append(w.poll())
    assert shares == pytest.approx([0.5 + k / 24 for k in range(1, 12)])
    assert warned == [shares[7]]  # the first at 0.8 or more: 0.833 after 8 readings
    for _ in range(24):  # still busy: no second warning
        fake.run(5, 1.0)
        w.poll()
    assert len(warned) == 1


def test_no_share_before_a_full_window_even_when_busy() -> None:
    fake, warned = Fake(), []
    w = watch(fake, warned, threshold=0.5, window_s=60, every_s=5)
    shares = []
    for _ in range(12):
        shares.append(w.poll())
        fake.run(5, 1.0)
    assert shares == [None] * 12  # 55 s of readings so far
    assert w.poll() == 1.0
    assert warned == [1.0]


def test_a_short_burst_inside_an_idle_minute_does_not_warn() -> None:
    fake, warned = Fake(), []
    w = watch(fake, warned, threshold=0.8, window_s=60, every_s=5)
    w.poll()
    for i in range(36):
        fake.run(5, 1.0 if i in (14, 15, 16) else 0.1)
        w.poll()
    assert warned == []


def test_an_unreadable_process_is_skipped() -> None:
    fake, warned = Fake(), []
    w = watch(fake, warned, threshold=0.1, window_s=10, every_s=1)
    fake.cpu = None
    for _ in range(30):
        fake.now += 1
        assert w.poll() is None
    assert warned == [] and not w.samples
    assert cpu_seconds(2**22 + 12345) is None  # above Linux's largest pid


def test_a_real_busy_process_is_noticed() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        warned: list[float] = []
        w = BusyWatch(lambda: cpu_seconds(spin.pid), warned.append, threshold=0.5, window_s=1.0, every_s=0.1)
        deadline = time.monotonic() + 10
        while not warned and time.monotonic() < deadline:
            w.poll()
            time.sleep(0.05)
        assert warned and 0.5 <= warned[0] <= 1.2
        mine = cpu_seconds(os.getpid())
        assert mine is not None and mine > 0
    finally:
        spin.kill()
        spin.wait(5)
