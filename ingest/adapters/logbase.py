"""Shared vocabulary of the log line parsers: context, parse errors and levels.

``level`` is normalised across formats to one of :data:`LEVELS`, so one rule
can count errors from Apache, the application and syslog alike; syslog's own
severity name stays in ``severity``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, tzinfo

from ingest.model import Record

logger = logging.getLogger(__name__)

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LEVEL_ALIASES = {
    "TRACE": "DEBUG",
    "DEBUG": "DEBUG",
    "FINE": "DEBUG",
    "INFO": "INFO",
    "NOTICE": "INFO",
    "WARN": "WARNING",
    "WARNING": "WARNING",
    "ERR": "ERROR",
    "ERROR": "ERROR",
    "SEVERE": "ERROR",
    "CRIT": "CRITICAL",
    "CRITICAL": "CRITICAL",
    "FATAL": "CRITICAL",
    "ALERT": "CRITICAL",
    "EMERG": "CRITICAL",
    "PANIC": "CRITICAL",
}


class LineParseError(Exception):
    """A line does not have its format's shape; ``reason`` says what was expected."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


@dataclass(frozen=True)
class LineContext:
    """What a line does not say itself: ``host`` for formats without one (or
    when a syslog header has none), ``tz`` for timestamps without a zone, and
    ``received_ms`` (epoch ms) for formats without a year or time."""

    host: str | None = None
    tz: tzinfo = UTC
    received_ms: int = 0


Parser = Callable[[str, LineContext], Record]


def normalise_level(text: str | None) -> str | None:
    """``warn``, ``Err``, ``crit``, ``trace3`` ... -> one of :data:`LEVELS`; None
    for None. An unknown word is kept upper-cased rather than guessed."""
    if text is None:
        return None
    upper = text.strip().upper()
    if upper.startswith("TRACE"):
        return "DEBUG"
    return _LEVEL_ALIASES.get(upper, upper or None)
