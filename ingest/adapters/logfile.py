"""A whole log file in one of :data:`~ingest.adapters.logformats.LOG_FORMATS` -> logs events.

The batch counterpart of the tailer, used by ``convert`` and ``replay``: lines
are parsed in file order, stack traces joined (:mod:`ingest.adapters.multiline`),
and every line that cannot be used yields a ConvertError with its line number.
The receive time of formats without a year (RFC 3164) is the time the file is
opened.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import tzinfo

from ingest.adapters.logbase import LineContext
from ingest.adapters.logformats import log_format, require_host
from ingest.adapters.multiline import Joiner
from ingest.model import Converter, ConvertResult, read_lines

logger = logging.getLogger(__name__)


def log_events(
    path: str, fmt_name: str, *, host: str | None, tz: tzinfo, now_ms: int | None = None
) -> Converter:
    """Convert ``path`` read as ``fmt_name``. Arguments are checked first
    (IngestArgError for an unknown format or a missing ``--host``)."""
    numbered = numbered_log_events(path, fmt_name, host=host, tz=tz, now_ms=now_ms)
    return (result for _number, result in numbered)


def numbered_log_events(
    path: str, fmt_name: str, *, host: str | None, tz: tzinfo, now_ms: int | None = None
) -> Iterator[tuple[int, ConvertResult]]:
    """:func:`log_events` with a 1-based line number for each result: the line itself for a
    ConvertError, the last line it joined for an event (a stack trace ends there)."""
    fmt = log_format(fmt_name)
    require_host(fmt, host)
    received = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    return _convert(path, Joiner[int](fmt, LineContext(host=host, tz=tz, received_ms=received)))


def _convert(path: str, joiner: Joiner[int]) -> Iterator[tuple[int, ConvertResult]]:
    for number, raw in read_lines(path):
        for parsed in joiner.feed(number, raw, number):
            yield parsed.pos, parsed.result
    for parsed in joiner.flush():
        yield parsed.pos, parsed.result
