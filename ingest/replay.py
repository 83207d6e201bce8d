"""Replay a recorded file onto an event topic, validated, paced, stoppable and resumable.

``replay`` is the Python API behind ``python -m ingest replay`` (and ``simulate``). The
topic decides the source schema (:data:`app.topics.SOURCE_TOPICS`). Each input item is
validated by the :class:`~ingest.publisher.Publisher`; converter errors and invalid events
go to ``dlq.events`` with the reason and the raw line, never dropped. Items given as
:class:`Line` (``open_input`` numbers every item) and an ``origin`` (the file name) put
``FILE:LINE: `` before every dead-letter reason; without an origin it is ``line N: ``.
Event time is kept, or shifted as a whole (``live``: the first event is now; ``shift_ms``: by
a fixed offset), before pacing, so a shared clock paces the times the topic gets; pacing is
described in :mod:`ingest.pacing`. Setting ``stop`` ends the replay after the current event: what was
sent is flushed and the summary still returned.

Resuming (``ReplayOptions.progress``, see :mod:`ingest.progress`): the input must be a
deterministic sequence. A run skips the items an earlier run had acknowledged, counts
``limit`` against the events sent over all runs, and returns at once, without connecting,
when an earlier run reached the end or the limit. While it runs it writes the acknowledged
counts every ``checkpoint_s`` (after a flush) and once more after the final flush; a
delivery that fails stops the replay, so the progress never passes a record that is not on
the broker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, tzinfo
from typing import Any, NamedTuple

import orjson

from app.errors import IngestDecodeError
from app.events import parse_ts
from app.eventtime import Clock
from app.runtime.clockgate import ClockGate, leave, wait_async
from app.runtime.settings import Settings
from app.topics import SOURCE_TOPICS
from ingest.adapters import FORMAT_SOURCES
from ingest.adapters.apache import numbered_apache_events
from ingest.adapters.jsonl import numbered_jsonl_lines
from ingest.adapters.logfile import numbered_log_events
from ingest.adapters.logformats import LOG_FORMATS
from ingest.adapters.nab import numbered_nab_events
from ingest.model import ConvertError, IngestArgError
from ingest.pacing import MAX_SLEEP_S, Pacer, Rebaser
from ingest.progress import CHECKPOINT_S, Progress, ProgressFile
from ingest.publisher import Publisher
from ingest.runtime import stopped_within

logger = logging.getLogger(__name__)

ReplayItem = dict[str, Any] | bytes | str | ConvertError
_YIELD_EVERY = 256  # items between explicit yields, so signal handlers get to run
_SKIP_CHUNK = 4096  # items skipped between two looks at ``stop`` when resuming


class Line(NamedTuple):
    """An input item and the 1-based line of the file it came from."""

    number: int
    item: ReplayItem


ReplayInput = ReplayItem | Line


@dataclass(frozen=True)
class ReplayOptions:
    """``speedup``: divide event-time gaps by this (None: no waiting at all);
    ``limit``: stop after this many events were sent, over all runs when resuming (None: whole input);
    ``live``: rebase event times so the first event is now;
    ``shift_ms``: move every event time by this (``--shift-to``; a resumed run keeps it);
    ``rate``: send at most this many events per wall-clock second (None: no cap);
    ``progress``: resume from and record into this file (None: start at the first item);
    ``end_is_final``: the input's end is its last item, recorded as finished (False for a
    simulation cut by ``--duration``: a later run with a longer duration goes on);
    ``checkpoint_s``: seconds between two progress writes;
    ``clock``: pace on this shared schedule, not from the first event (with ``speedup``); a
    :class:`~app.runtime.clockgate.ClockGate`: on the clock it starts once the producer is connected."""

    speedup: float | None = None
    limit: int | None = None
    live: bool = False
    shift_ms: int = 0
    max_sleep_s: float = MAX_SLEEP_S
    rate: float | None = None
    progress: ProgressFile | None = None
    end_is_final: bool = True
    checkpoint_s: float = CHECKPOINT_S
    clock: Clock | ClockGate | None = None


@dataclass(frozen=True)
class ReplaySummary:
    """Counts acknowledged by the broker: ``published`` events on ``topic``,
    ``dlq`` records on dlq.events; ``failed`` were never acknowledged. With a
    progress file: ``skipped`` items an earlier run had published, ``progress`` the
    totals over all runs (as saved)."""

    topic: str
    published: int
    dlq: int
    failed: int
    interrupted: bool
    elapsed_s: float
    skipped: int = 0
    progress: Progress | None = None

    def to_json(self) -> bytes:
        """The one-line summary printed by the CLI (a stable contract; the keys after
        ``topic`` only appear with a progress file)."""
        out: dict[str, Any] = {"published": self.published, "dlq": self.dlq, "topic": self.topic}
        if self.progress is not None:
            totals = {"sent_total": self.progress.sent, "finished": self.progress.finished}
            out |= {"skipped": self.skipped, **totals}
        return orjson.dumps(out)


def source_for_topic(topic: str) -> str:
    """The event source whose topic is ``topic``; IngestArgError otherwise."""
    for source, name in SOURCE_TOPICS.items():
        if name == topic:
            return source
    msg = f"--topic {topic!r} is not an event topic; expected one of: {', '.join(SOURCE_TOPICS.values())}"
    raise IngestArgError(msg)


def open_input(
    path: str,
    fmt: str,
    source: str,
    *,
    device: str | None,
    field: str | None,
    host: str | None,
    tz: tzinfo = UTC,
    kind: str | None = None,
) -> Iterator[Line]:
    """The items of ``path`` read as ``fmt``, each with its line number; IngestArgError when
    the format does not produce ``source`` events or its options are missing or stray."""
    if fmt not in FORMAT_SOURCES:
        msg = f"--format {fmt!r}: expected one of {', '.join(FORMAT_SOURCES)}"
        raise IngestArgError(msg)
    produces = FORMAT_SOURCES[fmt]
    if produces is not None and produces != source:
        msg = f"--format {fmt} produces {produces} events, but the topic takes {source} events"
        raise IngestArgError(msg)
    given = {"--device": device, "--field": field, "--host": host, "--kind": kind}
    needed: tuple[str, ...] = {"nab": ("--device", "--field")}.get(fmt, ())
    if fmt in LOG_FORMATS and LOG_FORMATS[fmt].needs_host:
        needed = ("--host",)
    optional = {"syslog": ("--host",), "nab": ("--kind",)}.get(fmt, ())
    for option, value in given.items():
        if option in needed and not value:
            msg = f"--format {fmt} needs {' and '.join(needed)}"
            raise IngestArgError(msg)
        if option not in needed and option not in optional and value is not None:
            msg = f"{option} does not apply to --format {fmt}"
            raise IngestArgError(msg)
    numbered: Iterator[tuple[int, ReplayItem]]
    if fmt == "nab":
        numbered = numbered_nab_events(path, device=device or "", field=field or "", kind=kind)
    elif fmt == "apache":
        numbered = numbered_apache_events(path, host=host or "")
    elif fmt == "jsonl":
        numbered = numbered_jsonl_lines(path)
    else:
        numbered = numbered_log_events(path, fmt, host=host, tz=tz)
    return (Line(number, item) for number, item in numbered)


class _Checkpoints:
    """The run's counts on top of an earlier run's, written to the progress file (if any)
    only once the broker acknowledged them. Not thread-safe."""

    def __init__(self, file: ProgressFile | None, base: Progress, every_s: float, clock: Callable[[], float]):
        self.file, self.base, self.every_s, self.clock = file, base, every_s, clock
        self.consumed = self.sent = 0  # this run's
        self.saved = base
        self._last = clock()

    def total(self, finished: bool = False) -> Progress:
        return Progress(self.base.consumed + self.consumed, self.base.sent + self.sent, finished)

    async def due(self, pub: Publisher) -> bool:
        """Save when ``every_s`` passed since the last save; False when a record was not
        acknowledged (the caller stops: what it published next would be published again)."""
        if self.file is None or self.clock() - self._last < self.every_s:
            return True
        return await self.now(pub)

    async def now(self, pub: Publisher) -> bool:
        """Flush, then save the counts if every record so far was acknowledged."""
        if self.file is None:
            return True
        self._last = self.clock()
        total = self.total()
        if total == self.saved:
            return True
        await pub.flush()
        if pub.failed:
            logger.error(
                "%d record(s) were not acknowledged: stopping; %s stays at %d items",
                pub.failed,
                self.file.path,
                self.saved.consumed,
            )
            return False
        self.file.save(total)
        self.saved = total
        return True

    def close(self, pub: Publisher, finished: bool) -> Progress:
        """After the publisher's final flush: save the totals unless a record failed."""
        if self.file is None:
            return self.total(finished)
        if pub.failed:
            logger.warning(
                "%s stays at %d items: %d record(s) were not acknowledged, so the next run "
                "publishes again from there",
                self.file.path,
                self.saved.consumed,
                pub.failed,
            )
            return self.saved
        final = self.total(finished)
        if final != self.saved:
            self.file.save(final)
            self.saved = final
        return final


async def _skip(items: Iterator[ReplayInput], n: int, stop: asyncio.Event) -> int:
    """Consume up to ``n`` items, looking at ``stop`` every few thousand; how many were skipped."""
    skipped = 0
    while skipped < n and not stop.is_set():
        want = min(_SKIP_CHUNK, n - skipped)
        got = sum(1 for _ in itertools.islice(items, want))
        skipped += got
        if got < want:
            break
        await asyncio.sleep(0)
    return skipped


def _where(origin: str | None, line: int | None, index: int) -> str:
    """``FILE:LINE`` (or ``line N``, or ``ORIGIN item N``) for dead-letter reasons."""
    if line is not None:
        return f"{origin}:{line}" if origin else f"line {line}"
    return f"{origin} item {index}" if origin else ""


async def replay(
    settings: Settings,
    items: Iterable[ReplayInput],
    *,
    topic: str,
    adapter: str,
    options: ReplayOptions | None = None,
    stop: asyncio.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    origin: str | None = None,
) -> ReplaySummary:
    """Publish ``items`` to ``topic`` and return the acknowledged counts.

    ``origin`` names the input in dead-letter reasons (``FILE:LINE: reason``). Raises
    IngestArgError for a topic that is not an event topic, ConfigError without bootstrap
    servers, ProgressError for a progress file that cannot be used and BrokerError when
    Kafka cannot be reached.
    """
    opts = options or ReplayOptions()
    source = source_for_topic(topic)
    stop = stop or asyncio.Event()
    base = opts.progress.load() if opts.progress is not None else Progress()
    if opts.progress is not None and base.done(opts.limit):
        leave(opts.clock)
        why = "reached the end of its input" if base.finished else f"sent its limit of {opts.limit} events"
        logger.info(
            "%s: already done: an earlier run %s (%d items, %d events); nothing to publish",
            opts.progress.path,
            why,
            base.consumed,
            base.sent,
        )
        return ReplaySummary(topic, 0, 0, 0, False, 0.0, base.consumed, base)
    rebaser = Rebaser(wall_ms()) if opts.live else Rebaser.fixed(opts.shift_ms) if opts.shift_ms else None
    started, interrupted, finished = clock(), False, False
    marks = _Checkpoints(opts.progress, base, opts.checkpoint_s, clock)
    stream = iter(items)
    skipped = await _skip(stream, base.consumed, stop) if base.consumed else 0
    if skipped < base.consumed and not stop.is_set():
        logger.warning("the input has %d items, fewer than the %d already published", skipped, base.consumed)
    async with Publisher(settings, topic, source, adapter, wall_clock=False) as pub:  # recorded times
        shared = await wait_async(opts.clock, stop) if isinstance(opts.clock, ClockGate) else opts.clock
        anchor = shared.anchor(clock(), wall_ms() / 1000) if shared else None
        pacer = Pacer(opts.speedup, opts.max_sleep_s, anchor) if opts.speedup else None
        for n, entry in enumerate(stream):
            if n % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if stop.is_set() or (opts.limit is not None and base.sent + marks.sent >= opts.limit):
                interrupted = stop.is_set()
                break
            line, item = entry if isinstance(entry, Line) else (None, entry)
            if isinstance(item, ConvertError):
                line = item.line if line is None and item.line else line
            where = _where(origin, line, base.consumed + n + 1)
            prefix = f"{where}: " if where else ""
            if isinstance(item, ConvertError):
                await pub.reject(prefix + item.reason, item.raw, field=item.field)
                marks.consumed += 1
                if not await marks.due(pub):
                    break
                continue
            try:
                event = pub.check(item)
                event = pub.accept(rebaser.apply(event) if rebaser else event)
            except IngestDecodeError as exc:
                raw = item if isinstance(item, bytes | str) else orjson.dumps(item, default=str)
                await pub.reject(prefix + exc.reason, raw, field=exc.field)
                marks.consumed += 1
                if not await marks.due(pub):
                    break
                continue
            now = clock()
            wait = pacer.delay(event.ts_ms, now) if pacer else 0.0
            if opts.rate:
                wait = max(wait, started + marks.sent / opts.rate - now)
            if wait > 0:
                if not await marks.due(pub):
                    break
                if await stopped_within(stop, wait):
                    interrupted = True
                    break
            await pub.send(event, where=where)
            marks.sent += 1
            marks.consumed += 1
            if not await marks.due(pub):
                break
        else:
            finished = opts.end_is_final
    progress = marks.close(pub, finished)
    elapsed = clock() - started
    summary = ReplaySummary(
        topic,
        pub.produced,
        pub.dead_lettered,
        pub.failed,
        interrupted,
        elapsed,
        skipped,
        progress if opts.progress is not None else None,
    )
    logger.info(
        "replayed %d events to %s (%d dead-lettered, %d failed) in %.2f s%s%s",
        summary.published,
        topic,
        summary.dlq,
        summary.failed,
        elapsed,
        " (stopped)" if interrupted else "",
        f", after {skipped} items published before" if skipped else "",
    )
    return summary


def starting_at(items: Iterable[ReplayInput], from_ms: int) -> Iterator[ReplayInput]:
    """Only the items whose event time is at or after ``from_ms`` (``--from``).

    Items whose time cannot be read (bad lines, conversion errors) pass through,
    so they still reach the dead-letter topic with their reason.
    """
    for entry in items:
        obj: Any = entry.item if isinstance(entry, Line) else entry
        if isinstance(obj, bytes | str):
            try:
                obj = orjson.loads(obj)
            except orjson.JSONDecodeError:
                yield entry
                continue
        ts = obj.get("ts") if isinstance(obj, dict) else None
        try:
            if isinstance(ts, str) and parse_ts(ts) < from_ms:
                continue
        except IngestDecodeError:
            pass
        yield entry
