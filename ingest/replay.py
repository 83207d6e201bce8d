"""Replay a recorded file onto an event topic, validated, paced and stoppable.

``replay`` is the Python API behind ``python -m ingest replay``. The topic
decides the source schema (:data:`app.topics.SOURCE_TOPICS`). Each input item
is validated by the :class:`~ingest.publisher.Publisher`; converter errors and
invalid events go to ``dlq.events`` with the reason and the raw line, never
dropped. Event time is kept (or shifted as a whole with ``live``); pacing is
described in :mod:`ingest.pacing`. Setting ``stop`` ends the replay after the
current event: what was sent is flushed and the summary still returned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, tzinfo
from typing import Any

import orjson

from app.config import Settings
from app.errors import IngestDecodeError
from app.events import parse_ts
from app.topics import SOURCE_TOPICS
from ingest.adapters import FORMAT_SOURCES, apache_events, jsonl_lines, nab_events
from ingest.adapters.logfile import log_events
from ingest.adapters.logformats import LOG_FORMATS
from ingest.model import ConvertError, IngestArgError
from ingest.pacing import MAX_SLEEP_S, Pacer, Rebaser
from ingest.publisher import Publisher
from ingest.runtime import stopped_within

logger = logging.getLogger(__name__)

ReplayItem = dict[str, Any] | bytes | str | ConvertError
_YIELD_EVERY = 256  # items between explicit yields, so signal handlers get to run


@dataclass(frozen=True)
class ReplayOptions:
    """``speedup``: divide event-time gaps by this (None: no waiting at all);
    ``limit``: stop after this many events were sent (None: whole input);
    ``live``: rebase event times so the first event is now;
    ``rate``: send at most this many events per wall-clock second (None: no cap)."""

    speedup: float | None = None
    limit: int | None = None
    live: bool = False
    max_sleep_s: float = MAX_SLEEP_S
    rate: float | None = None


@dataclass(frozen=True)
class ReplaySummary:
    """Counts acknowledged by the broker: ``published`` events on ``topic``,
    ``dlq`` records on dlq.events; ``failed`` were never acknowledged."""

    topic: str
    published: int
    dlq: int
    failed: int
    interrupted: bool
    elapsed_s: float

    def to_json(self) -> bytes:
        """The one-line summary printed by the CLI (a stable contract)."""
        return orjson.dumps({"published": self.published, "dlq": self.dlq, "topic": self.topic})


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
) -> Iterator[ReplayItem]:
    """The items of ``path`` read as ``fmt``; IngestArgError when the format does
    not produce ``source`` events or its options are missing or stray."""
    if fmt not in FORMAT_SOURCES:
        msg = f"--format {fmt!r}: expected one of {', '.join(FORMAT_SOURCES)}"
        raise IngestArgError(msg)
    produces = FORMAT_SOURCES[fmt]
    if produces is not None and produces != source:
        msg = f"--format {fmt} produces {produces} events, but the topic takes {source} events"
        raise IngestArgError(msg)
    given = {"--device": device, "--field": field, "--host": host}
    needed: tuple[str, ...] = {"nab": ("--device", "--field")}.get(fmt, ())
    if fmt in LOG_FORMATS and LOG_FORMATS[fmt].needs_host:
        needed = ("--host",)
    optional = ("--host",) if fmt == "syslog" else ()
    for option, value in given.items():
        if option in needed and not value:
            msg = f"--format {fmt} needs {' and '.join(needed)}"
            raise IngestArgError(msg)
        if option not in needed and option not in optional and value is not None:
            msg = f"{option} does not apply to --format {fmt}"
            raise IngestArgError(msg)
    if fmt == "nab":
        return nab_events(path, device=device or "", field=field or "")
    if fmt == "apache":
        return apache_events(path, host=host or "")
    if fmt == "jsonl":
        return jsonl_lines(path)
    return log_events(path, fmt, host=host, tz=tz)


async def replay(
    settings: Settings,
    items: Iterable[ReplayItem],
    *,
    topic: str,
    adapter: str,
    options: ReplayOptions | None = None,
    stop: asyncio.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
) -> ReplaySummary:
    """Publish ``items`` to ``topic`` and return the acknowledged counts.

    Raises IngestArgError for a topic that is not an event topic, ConfigError
    without bootstrap servers and BrokerError when Kafka cannot be reached.
    """
    opts = options or ReplayOptions()
    source = source_for_topic(topic)
    pacer = Pacer(opts.speedup, opts.max_sleep_s) if opts.speedup else None
    rebaser = Rebaser(wall_ms()) if opts.live else None
    stop = stop or asyncio.Event()
    started, sent, interrupted = clock(), 0, False
    async with Publisher(settings, topic, source, adapter, wall_clock=False) as pub:  # recorded times
        for n, item in enumerate(items):
            if n % _YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if stop.is_set() or (opts.limit is not None and sent >= opts.limit):
                interrupted = stop.is_set()
                break
            if isinstance(item, ConvertError):
                await pub.reject(f"line {item.line}: {item.reason}", item.raw, field=item.field)
                continue
            event = await pub.admit(item)
            if event is None:
                continue
            now = clock()
            wait = pacer.delay(event.ts_ms, now) if pacer else 0.0
            if opts.rate:
                wait = max(wait, started + sent / opts.rate - now)
            if wait > 0 and await stopped_within(stop, wait):
                interrupted = True
                break
            await pub.send(rebaser.apply(event) if rebaser else event)
            sent += 1
    elapsed = clock() - started
    summary = ReplaySummary(topic, pub.produced, pub.dead_lettered, pub.failed, interrupted, elapsed)
    logger.info(
        "replayed %d events to %s (%d dead-lettered, %d failed) in %.2f s%s",
        summary.published,
        topic,
        summary.dlq,
        summary.failed,
        elapsed,
        " (stopped)" if interrupted else "",
    )
    return summary


def starting_at(items: Iterable[ReplayItem], from_ms: int) -> Iterator[ReplayItem]:
    """Only the items whose event time is at or after ``from_ms`` (``--from``).

    Items whose time cannot be read (bad lines, conversion errors) pass through,
    so they still reach the dead-letter topic with their reason.
    """
    for item in items:
        obj: Any = item
        if isinstance(item, bytes | str):
            try:
                obj = orjson.loads(item)
            except orjson.JSONDecodeError:
                yield item
                continue
        ts = obj.get("ts") if isinstance(obj, dict) else None
        try:
            if isinstance(ts, str) and parse_ts(ts) < from_ms:
                continue
        except IngestDecodeError:
            pass
        yield item
