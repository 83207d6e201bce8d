"""Apache / nginx access logs (combined log format) -> logs events.

A line looks like::

    1.2.3.4 - - [17/May/2015:10:05:03 +0000] "GET /a HTTP/1.1" 200 203 "http://r/" "Mozilla/5.0"

and becomes ``{host, ts, client_ip, method, path, protocol, status, bytes,
referrer, user_agent}``. ``bytes`` and ``referrer`` of ``-`` become null. The
common log format (no referrer and user agent) is accepted too, with both null.
Quoted fields may contain ``\\"`` and ``\\\\`` escapes (Apache's); these are
unescaped, other escapes (``\\xhh``) are kept as written.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

from app.events import LOGS, format_ts
from ingest.adapters.logbase import LineContext, LineParseError
from ingest.model import (
    Converter,
    ConvertError,
    ConvertResult,
    IngestArgError,
    Record,
    checked,
    decode_line,
    epoch_ms,
    read_lines,
)

logger = logging.getLogger(__name__)

ADAPTER = "apache"

_PREFIX = re.compile(r"(\S+) (\S+) (\S+) ")
_TIME = re.compile(r"\[(\d{2})/([A-Za-z]{3})/(\d{4}):(\d{2}):(\d{2}):(\d{2}) ([+-])(\d{2})(\d{2})\] ")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_STATUS_BYTES = re.compile(r" (\d{3}) (\d+|-)")
_SPACE = re.compile(r" ")
_END = re.compile(r"\s*$")
_UNESCAPE = re.compile(r"\\([\"\\])")
_MONTHS = {m: i for i, m in enumerate(("jan feb mar apr may jun jul aug sep oct nov dec").split(), start=1)}


class _Bad(Exception):
    """Internal: a line stops parsing here; ``args[0]`` is the reason."""


def apache_events(path: str, *, host: str) -> Converter:
    """Convert an access log file line by line, in file order.

    ``host`` (the event key) is checked first (IngestArgError when empty). A line
    that does not parse, or that the logs schema rejects, yields a ConvertError
    with its line number, raw text and the first thing found wrong. Blank lines
    are skipped.
    """
    return (result for _number, result in numbered_apache_events(path, host=host))


def numbered_apache_events(path: str, *, host: str) -> Iterator[tuple[int, ConvertResult]]:
    """:func:`apache_events` with the 1-based line number of each result."""
    if not host.strip():
        msg = "--host must be a non-empty host name"
        raise IngestArgError(msg)
    return _convert(path, host)


def _convert(path: str, host: str) -> Iterator[tuple[int, ConvertResult]]:
    for number, raw in read_lines(path):
        text = decode_line(ADAPTER, number, raw)
        if isinstance(text, ConvertError):
            yield number, text
        elif text.strip():
            yield number, parse_line(text, host=host, number=number, raw=raw)


def parse_line(text: str, *, host: str, number: int = 0, raw: bytes | None = None) -> ConvertResult:
    """Parse one log line (no line ending) into a validated logs record, or a ConvertError."""
    raw = text.encode() if raw is None else raw
    try:
        record = _parse(text, host)
    except _Bad as exc:
        return ConvertError(ADAPTER, number, raw, str(exc.args[0]))
    return checked(LOGS, ADAPTER, number, raw, record)


def parse_record(text: str, ctx: LineContext) -> Record:
    """Parse one line into an (unvalidated) logs record keyed by ``ctx.host``;
    raises LineParseError. The :class:`~ingest.adapters.logformats.LogFormat` entry point."""
    try:
        return _parse(text, ctx.host or "")
    except _Bad as exc:
        raise LineParseError(str(exc.args[0])) from None


def _parse(text: str, host: str) -> dict[str, object]:
    m = _expect(_PREFIX, text, 0, "expected 'CLIENT IDENT USER ' at the start")
    client_ip = m.group(1)
    t = _expect(_TIME, text, m.end(), "expected a time like [17/May/2015:10:05:03 +0000] after the user")
    ts_ms = _time(t)
    q = _expect(_QUOTED, text, t.end(), "expected the quoted request line after the time")
    method, path, protocol = _request(_unescape(q.group(1)))
    sb = _expect(_STATUS_BYTES, text, q.end(), "expected 'STATUS BYTES' after the request")
    status, size = int(sb.group(1)), sb.group(2)
    referrer = user_agent = None
    pos = sb.end()
    if not _END.match(text, pos):
        sp = _expect(_SPACE, text, pos, "expected a space then the quoted referrer after the byte count")
        r = _expect(_QUOTED, text, sp.end(), "referrer is not a quoted string (missing closing quote?)")
        sp = _expect(_SPACE, text, r.end(), "expected a space then the quoted user agent after the referrer")
        u = _expect(_QUOTED, text, sp.end(), "user agent is not a quoted string (missing closing quote?)")
        _expect(_END, text, u.end(), "unexpected text after the user agent")
        referrer, user_agent = _unescape(r.group(1)), _unescape(u.group(1))
    return {
        "host": host,
        "ts": format_ts(ts_ms),
        "client_ip": client_ip,
        "method": method,
        "path": path,
        "protocol": protocol,
        "status": status,
        "bytes": None if size == "-" else int(size),
        "referrer": None if referrer in (None, "-") else referrer,
        "user_agent": user_agent,
    }


def _expect(pattern: re.Pattern[str], text: str, pos: int, reason: str) -> re.Match[str]:
    m = pattern.match(text, pos)
    if m is None:
        msg = f"{reason} (column {pos + 1})"
        raise _Bad(msg)
    return m


def _time(m: re.Match[str]) -> int:
    day, mon, year, hh, mm, ss, sign, oh, om = m.groups()
    month = _MONTHS.get(mon.lower())
    if month is None:
        msg = f"unknown month {mon!r} in the time"
        raise _Bad(msg)
    offset = timedelta(hours=int(oh), minutes=int(om)) * (-1 if sign == "-" else 1)
    try:
        dt = datetime(int(year), month, int(day), int(hh), int(mm), int(ss), tzinfo=timezone(offset))
    except ValueError as exc:
        msg = f"invalid time: {exc}"
        raise _Bad(msg) from None
    return epoch_ms(dt.astimezone(UTC))


def _request(request: str) -> tuple[str | None, str | None, str | None]:
    """``METHOD PATH PROTOCOL``; HTTP/0.9 ``METHOD PATH``; ``-`` or empty: all null."""
    if request in ("", "-"):
        return None, None, None
    parts = request.split(" ")
    if len(parts) == 3:
        return parts[0], parts[1], parts[2]
    if len(parts) == 2:
        return parts[0], parts[1], None
    msg = f"request {request[:60]!r} is not 'METHOD PATH PROTOCOL'"
    raise _Bad(msg)


def _unescape(value: str) -> str:
    return _UNESCAPE.sub(r"\1", value)
