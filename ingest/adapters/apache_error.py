"""Apache HTTP Server error log (2.2 and 2.4 default formats) -> logs events.

Lines look like::

    [Sun Mar 07 16:02:00.123456 2004] [core:error] [pid 1234:tid 5678] [client 1.2.3.4:5678] AH00126: Bad
    [Sun Mar 07 16:02:00 2004] [error] [client 1.2.3.4] File does not exist: /var/www/favicon.ico

and become ``{host, ts, level, component, pid, client_ip, message}``: the
module (``core``) is the component, the level is normalised (``warn`` ->
``WARNING``), ``[pid N:tid M]`` gives the pid and ``[client A:P]`` (or
``[remote A:P]``) the client address without its port. The ``AHnnnnn:``
error code stays at the start of the message. The time has no zone: it is read
in ``LineContext.tz`` (``--tz``, default UTC), as the server's local time.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime

from app.events import format_ts
from ingest.adapters.logbase import LineContext, LineParseError, normalise_level
from ingest.model import Record, epoch_ms

logger = logging.getLogger(__name__)

_HEAD = re.compile(r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}(?:\.\d{1,6})? \d{4})\] ")
_LEVEL = re.compile(r"\[(?:([\w-]*):)?([A-Za-z]+\d?)\]")
_TAG = re.compile(r" \[(pid|client|remote) ([^\]]*)\]")
_PID = re.compile(r"(\d+)(?::tid \d+)?$")
_IPV4_PORT = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}):\d+$")


def parse_record(text: str, ctx: LineContext) -> Record:
    """Parse one error log line; raises LineParseError naming what is missing."""
    head = _HEAD.match(text)
    if head is None:
        msg = "expected '[Www Mmm dd hh:mm:ss[.micros] yyyy] ' at the start"
        raise LineParseError(msg, "ts")
    ts_ms = _time(head.group(1), ctx)
    lvl = _LEVEL.match(text, head.end())
    if lvl is None:
        msg = f"expected '[module:level]' or '[level]' after the time (column {head.end() + 1})"
        raise LineParseError(msg, "level")
    record: Record = {
        "host": ctx.host,
        "ts": format_ts(ts_ms),
        "level": normalise_level(lvl.group(2)),
        "component": lvl.group(1) or None,
    }
    pos = lvl.end()
    while (tag := _TAG.match(text, pos)) is not None:
        name, value = tag.groups()
        if name == "pid":
            pid = _PID.match(value)
            record["pid"] = int(pid.group(1)) if pid else None
        else:
            ip = _IPV4_PORT.match(value)
            record["client_ip"] = ip.group(1) if ip else value
        pos = tag.end()
    record["message"] = text[pos:].strip()
    return record


def _time(text: str, ctx: LineContext) -> int:
    fmt = "%a %b %d %H:%M:%S.%f %Y" if "." in text else "%a %b %d %H:%M:%S %Y"
    try:
        naive = datetime.strptime(text.replace("  ", " 0"), fmt)  # noqa: DTZ007 - zone attached below
    except ValueError as exc:
        msg = f"invalid time {text!r}: {exc}"
        raise LineParseError(msg, "ts") from None
    return epoch_ms(naive.replace(tzinfo=ctx.tz).astimezone(UTC))
