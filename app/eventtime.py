"""The event-time bound of live ingest, and the counter of events refused for their time.

Live ingest (HTTP, MQTT, syslog, file tail: :class:`ingest.publisher.Publisher`)
judges an event's ``ts`` against the wall clock with :class:`WallClockBound`:
more than ``APP_MAX_EVENT_SKEW`` ahead, or more than ``APP_MAX_EVENT_AGE``
behind, and the event goes to ``dlq.events`` with the reason. Replays of
recorded files are not judged against the wall clock; the rule evaluator bounds
every event against its partition's clock instead
(:meth:`app.rules.timebound.TimeBound.admit`). docs/event-time.md has the
whole policy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter

from app.errors import IngestDecodeError
from app.events import Event, format_ts, span
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
