"""The application log format of the seed -> logs events.

A line is ``[LEVEL] [reqid] [yyyy/mm/dd hh:mm:ss ms] [Component line] message``::

    [ERROR] [req-7f3a] [2024/05/01 12:00:03 042] [PaymentService 88] charge failed: card declined

and becomes ``{host, ts, level, request_id, component, line, message}``. The
milliseconds follow the seconds after a space (``.``, ``,`` and ``:`` are
accepted too, 1 to 3 digits, as written: ``5`` is 5 ms). A request id of ``-``
or empty is null; ``[Component]`` without a line number gives a null ``line``;
``Component:88`` is accepted as well. The time has no zone: it is read in
``LineContext.tz`` (``--tz``, default UTC). Stack traces that follow a line
are joined into its message by :mod:`ingest.adapters.multiline`.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime

from app.events import format_ts
from ingest.adapters.logbase import LineContext, LineParseError, normalise_level
from ingest.model import Record, epoch_ms

logger = logging.getLogger(__name__)

_LINE = re.compile(
    r"\[(?P<level>[A-Za-z]+)\]\s+"
    r"\[(?P<reqid>[^\]]*)\]\s+"
    r"\[(?P<date>\d{4}/\d{2}/\d{2}) (?P<time>\d{2}:\d{2}:\d{2})[ .,:](?P<ms>\d{1,3})\]\s+"
    r"\[(?P<component>[^\]]*?)(?:[ :](?P<line>\d+))?\]"
    r"(?: (?P<message>.*)|$)",
    re.DOTALL,
)
_PARTS = (
    ("level", r"\[LEVEL\]"),
    ("request_id", r"\[reqid\]"),
    ("ts", r"\[yyyy/mm/dd hh:mm:ss ms\]"),
    ("component", r"\[Component line\]"),
)


def parse_record(text: str, ctx: LineContext) -> Record:
    """Parse one application log line; raises LineParseError naming the first
    bracketed part that does not have the expected shape."""
    m = _LINE.fullmatch(text)
    if m is None:
        raise _explain(text)
    year, month, day = (int(x) for x in m["date"].split("/"))
    hh, mm, ss = (int(x) for x in m["time"].split(":"))
    try:
        local = datetime(year, month, day, hh, mm, ss, tzinfo=ctx.tz)
    except ValueError as exc:
        msg = f"invalid time {m['date']} {m['time']}: {exc}"
        raise LineParseError(msg, "ts") from None
    ts_ms = epoch_ms(local.astimezone(UTC)) + int(m["ms"])
    reqid = m["reqid"].strip()
    return {
        "host": ctx.host,
        "ts": format_ts(ts_ms),
        "level": normalise_level(m["level"]),
        "request_id": None if reqid in ("", "-") else reqid,
        "component": m["component"].strip() or None,
        "line": int(m["line"]) if m["line"] else None,
        "message": m["message"] or "",
    }


def _explain(text: str) -> LineParseError:
    """Which of the four bracketed parts is the first one missing or malformed."""
    prefixes = (
        r"\[[A-Za-z]+\]\s+",
        r"\[[^\]]*\]\s+",
        r"\[\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}[ .,:]\d{1,3}\]\s+",
        r"\[[^\]]*\]",
    )
    pos = 0
    for (field, shape), prefix in zip(_PARTS, prefixes, strict=True):
        m = re.compile(prefix).match(text, pos)
        if m is None:
            msg = f"expected {shape.replace(chr(92), '')} at column {pos + 1}"
            return LineParseError(msg, field)
        pos = m.end()
    return LineParseError(f"expected a space then the message at column {pos + 1}", "message")
