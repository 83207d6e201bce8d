"""Event-time pacing for replays, and timestamp rebasing for ``--live`` and ``--shift-to``.

Both are pure: the wall clock is passed in, so tests drive them with numbers.

:class:`Pacer` keeps a schedule rather than sleeping per gap, so the time spent
publishing does not add up as drift: event time ``t`` is due at
``anchor_wall + (t - anchor_event) / speedup``. Only a new event-time high
watermark can be due later; an out-of-order or equal timestamp is due at once,
so the late rows of a series burst out as they would from a real device.
A single wait never exceeds ``max_sleep_s`` (default 5 s): a 30-hour hole in the
data at speed-up 100 would otherwise stall a demo for 18 minutes. After a capped
wait the schedule is re-anchored there, i.e. the hole is shortened, not replayed.

:class:`app.eventtime.Clock` is a schedule shared by several producers (``--clock``): event time
``event_ms`` is due at Unix time ``wall_s`` for each of them, so they publish on one
event-time axis, whenever each started. Self-anchored, two producers of one topic
started a few seconds apart run that far apart for good (3 s at speed-up 3000 is
2.5 hours of event time), and the later one's devices look silent to the partition
clock the earlier one drives. On a shared clock a hole is waited out, not shortened
(shortening it would move that producer off the axis), and events already due go
at once.
"""

from __future__ import annotations

import logging

from app.errors import IngestDecodeError
from app.events import TS_RANGE_MS, Event, format_ts

logger = logging.getLogger(__name__)

MAX_SLEEP_S = 5.0


class Pacer:
    """Says how long to wait before publishing each event. Not thread-safe.

    ``anchor``: a shared schedule (``Clock.anchor``): event time ``anchor[1]`` is due at
    ``anchor[0]`` on the caller's clock; no wait is capped. Without it, the first event
    anchors the schedule at the moment it is asked for."""

    def __init__(
        self, speedup: float, max_sleep_s: float = MAX_SLEEP_S, anchor: tuple[float, int] | None = None
    ) -> None:
        if speedup <= 0:
            msg = f"speedup must be > 0, got {speedup}"
            raise ValueError(msg)
        self.speedup = speedup
        self.max_sleep_s = max_sleep_s if anchor is None else float("inf")
        self._anchor_wall = 0.0 if anchor is None else anchor[0]  # seconds, on the caller's monotonic clock
        self._anchor_ms = 0 if anchor is None else anchor[1]
        self._shared = anchor is not None
        self._watermark_ms: int | None = None

    def delay(self, ts_ms: int, now: float) -> float:
        """Seconds to wait, from ``now`` (monotonic seconds), before publishing an
        event with event time ``ts_ms``. Call once per event, in publish order;
        the caller is assumed to wait the returned time."""
        if self._watermark_ms is None and not self._shared:
            self._anchor_wall, self._anchor_ms, self._watermark_ms = now, ts_ms, ts_ms
            return 0.0
        if self._watermark_ms is not None and ts_ms <= self._watermark_ms:
            return 0.0
        self._watermark_ms = ts_ms
        due = self._anchor_wall + (ts_ms - self._anchor_ms) / 1000.0 / self.speedup
        wait = due - now
        if wait > self.max_sleep_s:
            self._anchor_wall, self._anchor_ms = now + self.max_sleep_s, ts_ms
            return self.max_sleep_s
        return max(wait, 0.0)


class Rebaser:
    """Shifts event times by one offset, keeping every gap (and every out-of-order step)
    exactly as recorded: so the first event is at ``now_ms`` (``--live``), or by a fixed
    ``offset_ms`` (``--shift-to``, see :meth:`fixed`)."""

    def __init__(self, now_ms: int) -> None:
        self._now_ms = now_ms
        self._offset_ms: int | None = None

    @classmethod
    def fixed(cls, offset_ms: int) -> Rebaser:
        """Every event moved by ``offset_ms``, whatever the first event is: a replay that
        resumes after what an earlier run sent keeps that run's axis."""
        rebaser = cls(0)
        rebaser._offset_ms = offset_ms
        return rebaser

    def apply(self, event: Event) -> Event:
        """The event with ``ts`` (and ``ts_ms``) moved by the offset. Raises
        IngestDecodeError (field ``ts``) when that takes it outside 1970..2100."""
        if self._offset_ms is None:
            self._offset_ms = self._now_ms - event.ts_ms
        ts_ms = event.ts_ms + self._offset_ms
        if not TS_RANGE_MS[0] <= ts_ms < TS_RANGE_MS[1]:
            msg = f"field 'ts' {event.fields['ts']} moved to {format_ts(ts_ms)} is outside 1970..2100"
            raise IngestDecodeError(msg, "ts")
        return Event(event.key, ts_ms, {**event.fields, "ts": format_ts(ts_ms)})
