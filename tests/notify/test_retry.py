"""The retry policy with injected sleep, random and clock: no real waiting."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from app.errors import NotifierError
from app.notify import RetryAbortedError, RetryPolicy, parse_retry_after


class FakeTime:
    """A clock that only moves when something sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(errors: list[NotifierError]) -> tuple[list[int], object]:
    calls: list[int] = []

    async def op() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return "ok"

    return calls, op


def policy(t: FakeTime, **kw: object) -> RetryPolicy:
    return RetryPolicy(sleep=t.sleep, clock=t.clock, random=lambda: 1.0, **kw)  # type: ignore[arg-type]


def retryable(retry_after: float | None = None) -> NotifierError:
    return NotifierError("503", retryable=True, retry_after=retry_after)


def test_full_jitter_grows_exponentially_up_to_the_cap() -> None:
    p = RetryPolicy(base_s=0.5, cap_s=3.0, random=lambda: 1.0)
    assert [p.backoff(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert RetryPolicy(base_s=0.5, random=lambda: 0.25).backoff(3) == 0.5


def test_retries_until_success_with_backoff() -> None:
    t = FakeTime()
    calls, op = failing([retryable(), retryable()])
    assert asyncio.run(policy(t, base_s=1.0).run(op)) == "ok"  # type: ignore[arg-type]
    assert (len(calls), t.sleeps) == (3, [1.0, 2.0])


def test_retry_after_overrides_backoff() -> None:
    t = FakeTime()
    _, op = failing([retryable(retry_after=7.0)])
    asyncio.run(policy(t).run(op))  # type: ignore[arg-type]
    assert t.sleeps == [7.0]


def test_non_retryable_is_raised_at_once() -> None:
    t = FakeTime()
    calls, op = failing([NotifierError("400", retryable=False)])
    with pytest.raises(NotifierError, match="400"):
        asyncio.run(policy(t).run(op))  # type: ignore[arg-type]
    assert (len(calls), t.sleeps) == (1, [])


def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    t = FakeTime()
    calls, op = failing([retryable() for _ in range(10)])
    retries: list[int] = []
    with pytest.raises(NotifierError) as info:
        asyncio.run(policy(t, max_attempts=3).run(op, on_retry=lambda n, e, d: retries.append(n)))  # type: ignore[arg-type]
    assert info.value.retryable
    assert (len(calls), retries) == (3, [1, 2])


def test_gives_up_when_the_wait_would_pass_max_age() -> None:
    t = FakeTime()
    calls, op = failing([retryable(retry_after=4.0) for _ in range(10)])
    with pytest.raises(NotifierError):
        asyncio.run(policy(t, max_attempts=None, max_age_s=10.0).run(op))  # type: ignore[arg-type]
    assert t.sleeps == [4.0, 4.0]  # a third wait would end at 12 s > 10 s
    assert len(calls) == 3


def test_stop_cuts_a_wait_short() -> None:
    async def main() -> float:
        stop = asyncio.Event()
        _, op = failing([retryable(retry_after=30.0)])
        asyncio.get_running_loop().call_later(0.1, stop.set)
        started = time.monotonic()
        with pytest.raises(RetryAbortedError):
            await RetryPolicy().run(op, stop=stop)  # type: ignore[arg-type]
        return time.monotonic() - started

    assert asyncio.run(asyncio.wait_for(main(), 5)) < 2.0


def test_parse_retry_after_seconds_and_dates() -> None:
    now = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
    assert parse_retry_after("5", now) == 5.0
    assert parse_retry_after("-3", now) == 0.0
    assert parse_retry_after("Wed, 01 May 2024 10:00:30 GMT", now) == 30.0
    assert parse_retry_after("Wed, 01 May 2024 09:00:00 GMT", now) == 0.0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None
