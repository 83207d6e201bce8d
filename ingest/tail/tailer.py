"""``python -m ingest tail``: follow a log file onto ``events.logs``, resumable.

Guarantee: every complete line is published exactly once across clean
restarts (SIGTERM/SIGINT), rotations and truncations, including rotation
while the tailer is stopped. The position is saved (:mod:`ingest.tail.state`)
only up to the last line whose event or dead-letter record the broker
acknowledged, in file order, so after a crash (kill -9, power loss) nothing is
lost and the lines published after the last save are published again
(at-least-once). Lines written between a ``copytruncate`` copy and the
truncation are lost by that rotation method itself.

Lines go through the format's parser and the stack-trace :class:`Joiner`; a
pending multi-line event is released after ``multiline_wait_s`` without new
lines. A delivery that fails stops the tailer (exit 1) with the position left
at the last acknowledged line, so a restart resumes there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, tzinfo
from pathlib import Path

from prometheus_client import Counter

from app.runtime.settings import Settings
from app.topics import LOGS
from ingest.adapters.logbase import LineContext
from ingest.adapters.logformats import log_format, require_host
from ingest.adapters.multiline import Joiner, Parsed
from ingest.publisher import Delivery, Publisher
from ingest.runtime import AdapterSummary, stopped_within
from ingest.tail.follower import Follower, StartAt
from ingest.tail.state import Position, load_state, save_state

logger = logging.getLogger(__name__)

LINES = Counter("ingest_tail_lines_total", "Lines read by the file tailer", ["format"])


@dataclass(frozen=True)
class TailOptions:
    """What to tail and how; intervals in seconds."""

    path: str
    fmt: str
    state_path: Path
    host: str | None = None
    tz: tzinfo = UTC
    start_at: StartAt = "beginning"
    poll_interval_s: float = 0.2
    rotate_wait_s: float = 1.0
    multiline_wait_s: float = 1.0
    save_interval_s: float = 0.5


class _Committer:
    """Saves the position of the longest acknowledged prefix of what was sent."""

    def __init__(self, opts: TailOptions, wall_ms: Callable[[], int]) -> None:
        self._opts, self._wall_ms = opts, wall_ms
        self._queue: deque[tuple[Position, Delivery]] = deque()
        self._acked: Position | None = None
        self._saved: Position | None = None
        self._last_save = 0.0
        self.failed = False

    def add(self, pos: Position, delivery: Delivery) -> None:
        self._queue.append((pos, delivery))

    def commit(self, *, force: bool = False) -> None:
        while self._queue and self._queue[0][1].done():
            pos, fut = self._queue[0]
            if fut.cancelled() or fut.exception() is not None:
                self.failed = True
                break
            self._queue.popleft()
            self._acked = pos
        now = time.monotonic()
        due = force or now - self._last_save >= self._opts.save_interval_s
        if self._acked is not None and self._acked != self._saved and due:
            save_state(self._opts.state_path, self._opts.path, self._acked, self._wall_ms())
            self._saved, self._last_save = self._acked, now


async def tail(
    settings: Settings,
    opts: TailOptions,
    stop: asyncio.Event,
    wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
) -> AdapterSummary:
    """Tail until ``stop`` is set or a delivery fails; return the counts.

    Raises IngestArgError for an unknown format or missing host, TailStateError
    for an unusable state file, ConfigError/BrokerError when Kafka is unusable.
    """
    fmt = log_format(opts.fmt)
    require_host(fmt, opts.host)
    follower = Follower(opts.path, start_at=opts.start_at, rotate_wait_s=opts.rotate_wait_s)
    follower.resume(load_state(opts.state_path))
    joiner = Joiner[Position](fmt, LineContext(opts.host, opts.tz))
    committer = _Committer(opts, wall_ms)
    lines_read, last_line = 0, time.monotonic()
    lines_metric = LINES.labels(fmt.name)
    async with Publisher(settings, LOGS, "logs", f"tail-{fmt.name}") as pub:

        async def publish(items: list[Parsed[Position]], where: str) -> None:
            for item in items:
                committer.add(item.pos, await pub.submit(item.result, where=where))

        try:
            while not stop.is_set() and not committer.failed:
                lines = follower.poll()
                ctx = LineContext(opts.host, opts.tz, wall_ms())
                for line in lines:
                    where = f"{line.path} byte {line.start}"
                    await publish(joiner.feed(0, line.raw, line.pos, ctx), where)
                lines_read += len(lines)
                lines_metric.inc(len(lines))
                now = time.monotonic()
                if lines:
                    last_line = now
                elif joiner.pending and now - last_line >= opts.multiline_wait_s:
                    await publish(joiner.flush(), opts.path)
                committer.commit()
                if not lines:
                    await stopped_within(stop, opts.poll_interval_s)
            await publish(joiner.flush(), opts.path)
            await pub.flush(timeout_s=60)
        finally:
            committer.commit(force=True)
            follower.close()
    if committer.failed:
        logger.error("a delivery failed; stopped with the position at the last acknowledged line")
    extra = {"lines": lines_read, "rotations": follower.rotations, "truncations": follower.truncations}
    return AdapterSummary.of(pub, **extra)
