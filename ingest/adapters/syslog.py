"""Syslog messages, RFC 5424 and RFC 3164 (BSD), -> logs events.

RFC 5424: ``<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID [SD] MSG``.
RFC 3164: ``<PRI>Mmm dd hh:mm:ss HOSTNAME TAG[PID]: MSG``; the ``HOSTNAME`` may
be missing (messages from a local socket), then ``TAG[PID]:`` follows the time.
``<PRI>`` is optional, as in files written by a syslog daemon.

Fields: ``host`` (HOSTNAME; when nil or missing, ``LineContext.host``, i.e. the
sender's address on the network), ``ts``, ``program`` (APP-NAME / TAG), ``pid``
(PROCID when it is a number), ``facility`` and ``severity`` by name (``local0``,
``err``), ``level`` normalised from the severity, and ``message``.
MSGID and STRUCTURED-DATA have no field in the logs schema and are dropped.

Time rules. RFC 5424 timestamps carry a zone. RFC 3164 timestamps carry neither
year nor zone: they are read in ``LineContext.tz`` (``--tz``, default UTC) in
the latest year that does not put them more than one day after the receive
time: ``Dec 31 23:59:59`` received on 1 January belongs to the old year,
``Jan 1 00:00:01`` from a sender whose clock runs ahead, received on 31
December, to the new one, and a file line from February read in November to
this year.

A message with no time of its own (no recognisable timestamp, e.g. no header
at all, or an RFC 5424 nil TIMESTAMP) is treated by where it comes from:

- :func:`parse_received`, for a message received live from the network (the
  syslog server): it keeps its text whole as the message and gets the receive
  time, as a relay does (RFC 3164 section 4.3.3; RFC 5424 section 6.2.3.1);
- :func:`parse_record`, for a line of a file (``convert``, ``replay``,
  ``tail``: the log formats of :mod:`ingest.adapters.logformats`): it is a
  LineParseError on ``ts``. The time a file is read is not when its line was
  written, so stamping it would invent the event's time; the line is counted
  invalid (listed with its line number, or dead-lettered) like other bad lines.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime

from app.events import format_ts
from ingest.adapters.logbase import LineContext, LineParseError, normalise_level
from ingest.model import Record, epoch_ms

logger = logging.getLogger(__name__)

FACILITIES = (
    "kern user mail daemon auth syslog lpr news uucp cron authpriv ftp ntp security console solaris-cron "
    "local0 local1 local2 local3 local4 local5 local6 local7"
).split()
SEVERITIES = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")

_PRI = re.compile(r"<(\d{1,3})>")
_V5424 = re.compile(r"1 ")
_BSD_TIME = re.compile(r"([A-Z][a-z]{2}) ([ \d]?\d) (\d{2}):(\d{2}):(\d{2}) ")
_ISO_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}T\S+) ")
_TAG = re.compile(r"([^\s\[\]:]+)(?:\[([^\]]*)\])?: ?")
_DAY_MS = 86_400_000
_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), start=1)}


def parse_record(text: str, ctx: LineContext) -> Record:
    """Parse one syslog line of a file (either RFC); raises LineParseError for a
    line without a timestamp (no syslog header), a bad ``<PRI>``, an RFC 5424
    header with missing parts or structured data that is not closed, and a
    line without a host when ``ctx.host`` is None."""
    return _parse(text, ctx, received=False)


def parse_received(text: str, ctx: LineContext) -> Record:
    """Parse one syslog message received from the network: as :func:`parse_record`,
    but a message without a timestamp gets ``ctx.received_ms``, as relays stamp it."""
    return _parse(text, ctx, received=True)


def _parse(text: str, ctx: LineContext, *, received: bool) -> Record:
    record: Record = {"host": None, "ts": None}
    pos = 0
    pri = _PRI.match(text)
    if pri is not None:
        value = int(pri.group(1))
        if value > 191:
            msg = f"PRI <{value}> is out of range 0..191"
            raise LineParseError(msg, "facility")
        record["facility"], record["severity"] = FACILITIES[value >> 3], SEVERITIES[value & 7]
        record["level"] = normalise_level(record["severity"])
        pos = pri.end()
    rfc5424 = pri is not None and _V5424.match(text, pos) is not None
    if rfc5424:
        _rfc5424(text, pos + 2, ctx, record)
    else:
        _rfc3164(text, pos, ctx, record)
    if record["ts"] is None and not received:
        msg = (
            "RFC 5424 TIMESTAMP is '-' (nil): a line of a file needs its own time"
            if rfc5424
            else "no syslog header (no timestamp): expected 'Mmm dd hh:mm:ss HOST TAG: MSG' (RFC 3164) "
            "or '<PRI>1 TIMESTAMP HOST APP PROCID MSGID SD MSG' (RFC 5424) after the optional <PRI>; "
            "a line of a file needs its own time"
        )
        raise LineParseError(msg, "ts")
    record["host"] = record["host"] or ctx.host
    if not record["host"]:
        msg = "the message has no HOSTNAME and no sender address is known"
        raise LineParseError(msg, "host")
    record["ts"] = record["ts"] or format_ts(ctx.received_ms)
    return record


def _rfc5424(text: str, pos: int, ctx: LineContext, record: Record) -> None:
    parts = text[pos:].split(" ", 5)
    if len(parts) < 6:
        msg = "RFC 5424 header needs TIMESTAMP HOSTNAME APP-NAME PROCID MSGID STRUCTURED-DATA"
        raise LineParseError(msg)
    stamp, host, app, procid, _msgid, rest = parts
    if stamp != "-":
        try:
            dt = datetime.fromisoformat(stamp)
        except ValueError:
            dt = None
        if dt is None or dt.tzinfo is None:
            msg = f"RFC 5424 TIMESTAMP {stamp[:40]!r} is not RFC 3339 with a zone"
            raise LineParseError(msg, "ts")
        record["ts"] = format_ts(epoch_ms(dt))
    record["host"] = None if host == "-" else host
    record["program"] = None if app == "-" else app
    record["pid"] = int(procid) if procid.isdigit() else None
    message = _skip_structured_data(rest)
    record["message"] = message.removeprefix("\ufeff")


def _skip_structured_data(rest: str) -> str:
    """The MSG after STRUCTURED-DATA (``-`` or ``[id k="v" ...]...``)."""
    if rest.startswith("-"):
        return rest[2:] if rest.startswith("- ") else rest[1:]
    i, n = 0, len(rest)
    while i < n and rest[i] == "[":
        i += 1
        in_quotes = False
        while i < n and (in_quotes or rest[i] != "]"):
            if rest[i] == "\\" and in_quotes:
                i += 1
            elif rest[i] == '"':
                in_quotes = not in_quotes
            i += 1
        if i >= n:
            msg = "STRUCTURED-DATA element is not closed with ']'"
            raise LineParseError(msg)
        i += 1
    if i == 0:
        msg = "expected STRUCTURED-DATA ('-' or '[...]') after MSGID"
        raise LineParseError(msg)
    return rest[i + 1 :] if rest[i : i + 1] == " " else rest[i:]


def _rfc3164(text: str, pos: int, ctx: LineContext, record: Record) -> None:
    bsd, iso = _BSD_TIME.match(text, pos), _ISO_TIME.match(text, pos)
    if bsd is not None and bsd.group(1) in _MONTHS:
        record["ts"] = format_ts(_bsd_time(bsd, ctx))
        pos = bsd.end()
    elif iso is not None:
        try:
            dt = datetime.fromisoformat(iso.group(1))
        except ValueError:
            dt = None
        if dt is not None:
            dt = dt if dt.tzinfo is not None else dt.replace(tzinfo=ctx.tz)
            record["ts"] = format_ts(epoch_ms(dt))
            pos = iso.end()
    if record["ts"] is None:
        record["message"] = text[pos:]
        return
    if _TAG.match(text, pos) is None:  # not 'TAG[PID]:' right away, so a HOSTNAME comes first
        host = text[pos:].partition(" ")[0]
        record["host"] = host or None
        pos += len(host) + 1
    tag = _TAG.match(text, pos)
    if tag is not None:
        record["program"] = tag.group(1)
        pid = tag.group(2)
        record["pid"] = int(pid) if pid and pid.isdigit() else None
        pos = tag.end()
    record["message"] = text[pos:]


def _bsd_time(m: re.Match[str], ctx: LineContext) -> int:
    month, day = _MONTHS[m.group(1)], int(m.group(2))
    hh, mm, ss = (int(x) for x in m.group(3, 4, 5))
    received = datetime.fromtimestamp(ctx.received_ms / 1000, tz=ctx.tz)
    latest = ctx.received_ms + _DAY_MS
    best: int | None = None
    for year in range(received.year + 1, received.year - 8, -1):  # 29 Feb: the latest leap year
        try:
            ms = epoch_ms(datetime(year, month, day, hh, mm, ss, tzinfo=ctx.tz).astimezone(UTC))
        except ValueError:  # 29 Feb outside a leap year, or 31 Apr
            continue
        if ms <= latest:
            best = ms
            break
    if best is None:
        msg = f"invalid date {m.group(0).strip()!r}"
        raise LineParseError(msg, "ts")
    return best
