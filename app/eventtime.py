"""The event-time bound of live ingest, and the counter of events refused for their time.

Live ingest (HTTP, MQTT, syslog, file tail: :class:`ingest.publisher.Publisher`)
judges an event's ``ts`` against the wall clock with :class:`WallClockBound`:
more than ``APP_MAX_EVENT_SKEW`` ahead, or more than ``APP_MAX_EVENT_AGE``
behind, and the event goes to ``dlq.events`` with the reason. Replays of
recorded files are not judged against the wall clock; the rule evaluator bounds
every event against its partition's clock instead
(:meth:`app.rules.timebound.TimeBound.admit`). docs/event-time.md has the
whole policy.

:class:`Clock` is the schedule several replays share (``--clock WALL@TIME``,
:mod:`ingest.pacing`), or the one a clock gate starts once they are all ready
(``--clock-gate``, :mod:`app.runtime.clockgate`: ``make run``'s).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter

from app.errors import IngestDecodeError
from app.events import Event, format_ts, parse_ts, span
from app.runtime.settings import Settings

logger = logging.getLogger(__name__)

REFUSED = Counter(
    "events_time_refused_total",
    "Events sent to dlq.events for their time, by source, bound (ahead: of the wall clock at ingest "
    "or of its partition's clock in the rule worker; behind: older than APP_MAX_EVENT_AGE at ingest) "
    "and stage (ingest, worker).",
    ["source", "bound", "stage"],
)


class EventTimeError(IngestDecodeError):
    """An event whose time is out of bounds; ``bound`` is ``ahead`` or ``behind``."""

    def __init__(self, reason: str, bound: str) -> None:
        super().__init__(reason, "ts")
        self.bound = bound


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class WallClockBound:
    """``max_skew_ms`` ahead of and ``max_age_ms`` behind the wall clock (-1: no bound)."""

    max_skew_ms: int
    max_age_ms: int
    now_ms: Callable[[], int] = field(default=wall_ms, compare=False)

    @classmethod
    def of(cls, settings: Settings) -> WallClockBound | None:
        """The bound the settings ask for, or None when both are off."""
        if settings.max_event_skew_ms < 0 and settings.max_event_age_ms < 0:
            return None
        return cls(settings.max_event_skew_ms, settings.max_event_age_ms)

    def check(self, ev: Event, source: str) -> None:
        """Raise :class:`EventTimeError` (counted in ``events_time_refused_total``) for an
        event out of bounds; nothing otherwise."""
        now = self.now_ms()
        ts = ev.ts_ms
        if 0 <= self.max_skew_ms < ts - now:
            REFUSED.labels(source, "ahead", "ingest").inc()
            msg = (
                f"event time {format_ts(ts)} is {span(ts - now)} ahead of the wall clock {format_ts(now)} "
                f"(max skew {span(self.max_skew_ms)}, APP_MAX_EVENT_SKEW)"
            )
            raise EventTimeError(msg, "ahead")
        if 0 <= self.max_age_ms < now - ts:
            REFUSED.labels(source, "behind", "ingest").inc()
            msg = (
                f"event time {format_ts(ts)} is {span(now - ts)} behind the wall clock {format_ts(now)} "
                f"(max age {span(self.max_age_ms)}, APP_MAX_EVENT_AGE)"
            )
            raise EventTimeError(msg, "behind")


@dataclass(frozen=True)
class Clock:
    """A shared schedule: event time ``event_ms`` is due at Unix time ``wall_s``."""

    wall_s: float
    event_ms: int

    @classmethod
    def parse(cls, text: str) -> Clock:
        """``WALL@TIME``: Unix seconds, then an RFC 3339 time with a zone."""
        wall, at, when = text.partition("@")
        try:
            wall_s = float(wall)
        except ValueError:
            wall_s = -1.0
        if not at or not (math.isfinite(wall_s) and wall_s > 0):
            msg = (
                "expected WALL@TIME (Unix seconds, '@', an RFC 3339 time), "
                f"e.g. 1764432000@2013-12-10T12:00:00Z; got {text!r}"
            )
            raise ValueError(msg)
        return cls(wall_s, parse_ts(when, "--clock"))

    def __str__(self) -> str:
        return f"{self.wall_s:.3f}@{format_ts(self.event_ms)}"

    def anchor(self, now: float, wall_now: float) -> tuple[float, int]:
        """This schedule on the caller's clock: ``now`` there is Unix time ``wall_now``."""
        return now + (self.wall_s - wall_now), self.event_ms
