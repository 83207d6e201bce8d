"""Join multi-line stack traces into the message of the event they follow.

:class:`Joiner` turns a stream of log lines into a stream of parsed results, in
input order. For a format with ``multiline=True``, a *continuation line* right
after an event is appended to that event's ``message`` (joined with ``\\n``)
instead of being parsed on its own. A continuation line is one that

- starts with whitespace (Java ``\\tat ...``, Python ``  File ...``), or
- is ``Traceback (most recent call last):``, ``Caused by: ...``,
  ``... N more``, ``During handling of the above exception...``,
  ``The above exception was the direct cause...``, or
- names an exception: ``ValueError: bad``, ``java.lang.IllegalStateException``.

Blank lines inside a trace (Python's chained exceptions) are kept when another
continuation follows, and dropped otherwise. Any other line starts a new event
(or is a ConvertError, dead-lettered on its own), so a malformed line is never
hidden inside the previous message. A joined message is capped at
:data:`app.events.MAX_STRING_LEN` characters; the lines beyond it are counted
in a ``... [N more lines truncated]`` marker rather than rejected.

Each result carries the position ``P`` of the last input line it consumed
(the tailer passes file offsets), so a caller can persist progress only up to
what was delivered. The pending event is released by the next event, by
:meth:`Joiner.flush` (end of input, idle timeout) or by an error line.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Generic, TypeVar

from app.events import MAX_STRING_LEN
from ingest.adapters.logbase import LineContext
from ingest.adapters.logformats import LogFormat, parse_log_line
from ingest.model import ConvertError, ConvertResult, Record, decode_line

logger = logging.getLogger(__name__)

P = TypeVar("P")

CONTINUATION = re.compile(
    r"\s"
    r"|Traceback \(most recent call last\):"
    r"|Caused by: "
    r"|\.\.\. \d+ (?:more|common frames omitted)"
    r"|During handling of the above exception"
    r"|The above exception was the direct cause"
    r"|(?:[A-Za-z_][\w$]*\.)*[A-Za-z_][\w$]*(?:Error|Exception|Exit|Interrupt|Warning|Throwable)\b(?::|$)"
)
_RESERVE = 64  # room for the truncation marker


@dataclass(frozen=True, slots=True)
class Parsed(Generic[P]):
    """One result and the position just after the last line it consumed."""

    result: ConvertResult
    pos: P


class Joiner(Generic[P]):
    """Line-at-a-time parser with stack-trace joining. Not thread-safe."""

    def __init__(self, fmt: LogFormat, ctx: LineContext, max_chars: int = MAX_STRING_LEN) -> None:
        self.fmt, self.ctx = fmt, ctx
        self._max = max_chars - _RESERVE
        self._pending: Record | None = None
        self._pending_pos: P | None = None
        self._parts: list[str] = []
        self._size = 0
        self._blanks = 0
        self._truncated = 0

    @property
    def pending(self) -> bool:
        """True while an event waits for possible continuation lines."""
        return self._pending is not None

    def feed(self, number: int, raw: bytes, pos: P, ctx: LineContext | None = None) -> list[Parsed[P]]:
        """Consume one line (no line ending); return the results now complete.
        ``ctx`` overrides the joiner's context for this line (receive time)."""
        text = decode_line(self.fmt.name, number, raw)
        if isinstance(text, ConvertError):
            return [*self.flush(), Parsed(text, pos)]
        if not text.strip():
            if self._pending is not None:
                self._blanks += 1
            return []
        if self._pending is not None and CONTINUATION.match(text):
            self._append(text)
            self._pending_pos = pos
            return []
        out = self.flush()
        result = parse_log_line(self.fmt, text, ctx or self.ctx, number, raw)
        if self.fmt.multiline and not isinstance(result, ConvertError):
            self._pending, self._pending_pos = result, pos
            self._size = len(result.get("message") or "")
        else:
            out.append(Parsed(result, pos))
        return out

    def flush(self) -> list[Parsed[P]]:
        """Release the pending event, if any, with its joined message."""
        record, pos = self._pending, self._pending_pos
        if record is None or pos is None:
            return []
        if self._parts or self._truncated:
            marker = f"\n... [{self._truncated} more lines truncated]" if self._truncated else ""
            message = "\n".join([record.get("message") or "", *self._parts])
            record["message"] = message[: self._max + _RESERVE - len(marker)] + marker
        self._pending, self._pending_pos = None, None
        self._parts, self._size, self._blanks, self._truncated = [], 0, 0, 0
        return [Parsed(record, pos)]

    def _append(self, text: str) -> None:
        lines = [""] * self._blanks + [text]
        self._blanks = 0
        for line in lines:
            if self._truncated or self._size + len(line) + 1 > self._max:
                self._truncated += 1
                continue
            self._parts.append(line)
            self._size += len(line) + 1
