"""The one retry policy of the notify pipeline: exponential backoff with full jitter.

:meth:`RetryPolicy.run` calls an operation until it succeeds, raises a
non-retryable :class:`NotifierError`, or the policy gives up. Giving up
re-raises the last error. Between attempts it waits, in order of precedence:

1. the server's ``Retry-After`` (``NotifierError.retry_after``, seconds), as is;
2. otherwise full jitter: ``uniform(0, min(cap_s, base_s * 2 ** (retry - 1)))``
   (the AWS "exponential backoff and jitter" scheme).

It gives up before waiting when ``max_attempts`` attempts were made, or when
the wait would end past ``max_age_s`` since the first attempt. ``sleep``,
``random`` and ``clock`` are injectable so tests run without real waiting.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random as _random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from app.errors import AppError, NotifierError

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: ``(attempt, error, delay_s)``, called before each wait.
RetryHook = Callable[[int, NotifierError, float], None]


class RetryAbortedError(AppError):
    """``stop`` was set while waiting to retry: the operation neither succeeded
    nor was given up, so the caller must not treat it as done."""


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff settings (seconds) and injectable time sources. Immutable; one
    instance may serve many concurrent :meth:`run` calls."""

    base_s: float = 1.0
    cap_s: float = 60.0
    max_attempts: int | None = 10
    max_age_s: float | None = 900.0
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    random: Callable[[], float] = _random.random
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if self.base_s <= 0 or self.cap_s < self.base_s:
            msg = f"retry policy needs 0 < base_s <= cap_s, got base_s={self.base_s} cap_s={self.cap_s}"
            raise ValueError(msg)
        if self.max_attempts is not None and self.max_attempts < 1:
            msg = f"retry policy max_attempts must be >= 1 or None, got {self.max_attempts}"
            raise ValueError(msg)

    def backoff(self, retry: int) -> float:
        """Full-jitter wait before retry number ``retry`` (1 is the first retry)."""
        ceiling = min(self.cap_s, self.base_s * 2 ** min(retry - 1, 62))
        return self.random() * ceiling

    def delay(self, retry: int, error: NotifierError) -> float:
        """The wait before ``retry``: the server's ``retry_after`` if any, else :meth:`backoff`."""
        if error.retry_after is not None:
            return max(0.0, error.retry_after)
        return self.backoff(retry)

    def next_delay(self, attempt: int, error: NotifierError, elapsed_s: float) -> float | None:
        """Seconds to wait after failed attempt number ``attempt`` (1-based), or None to give
        up: the error is not retryable, ``max_attempts`` were made, or the wait would end past
        ``max_age_s`` after the first attempt (``elapsed_s`` ago). The durable outbox uses
        this to schedule its next attempt; :meth:`run` uses it between in-memory attempts."""
        if not error.retryable:
            return None
        wait = self.delay(attempt, error)
        if self.max_attempts is not None and attempt >= self.max_attempts:
            return None
        if self.max_age_s is not None and elapsed_s + wait > self.max_age_s:
            return None
        return wait

    async def run(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        stop: asyncio.Event | None = None,
        on_retry: RetryHook | None = None,
    ) -> T:
        """Await ``op()`` under this policy and return its result.

        Raises the first non-retryable :class:`NotifierError`, the last
        retryable one on giving up, or :class:`RetryAbortedError` when ``stop``
        is set during a wait. Other exceptions from ``op`` propagate at once.
        """
        started = self.clock()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await op()
            except NotifierError as err:
                wait = self.next_delay(attempt, err, self.clock() - started)
                if wait is None:
                    raise
                if on_retry is not None:
                    on_retry(attempt, err, wait)
                await self._pause(wait, stop)

    async def _pause(self, seconds: float, stop: asyncio.Event | None) -> None:
        if stop is None:
            await self.sleep(seconds)
            return
        if stop.is_set():
            msg = "stop requested before retrying"
            raise RetryAbortedError(msg)
        sleeper = asyncio.ensure_future(self.sleep(seconds))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, stopper):
                task.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)
        if stop.is_set():
            msg = "stop requested while waiting to retry"
            raise RetryAbortedError(msg)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from an HTTP ``Retry-After`` value (delta-seconds or an
    HTTP date, RFC 9110 10.2.3), never negative. ``None`` when absent or
    unparseable. ``now`` (aware) is the reference for dates; default: the wall clock."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    reference = now or datetime.now(tz=UTC)
    return max(0.0, (when - reference).total_seconds())
