"""argparse ``type`` helpers shared by the ``python -m ingest`` commands.

Each turns one option's text into a typed value or raises
``argparse.ArgumentTypeError`` with the expected form, so bad usage exits 2
with a message naming the option before anything starts.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.errors import IngestDecodeError
from app.events import parse_ts

logger = logging.getLogger(__name__)


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """A ``type`` accepting numbers > 0 of ``kind`` (int or float)."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            msg = f"expected a number > 0, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None
        if value <= 0:
            msg = f"expected a number > 0, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


def timezone(text: str) -> tzinfo:
    """An IANA zone name (``Europe/Berlin``) or ``UTC``."""
    if text.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        msg = f"unknown time zone {text!r}; expected an IANA name such as Europe/Berlin, or UTC"
        raise argparse.ArgumentTypeError(msg) from None


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``PORT`` (then on 127.0.0.1); port 0 picks a free one."""
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        msg = f"expected HOST:PORT or PORT, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return (host.strip("[]") or "127.0.0.1"), number


def timestamp_ms(text: str) -> int:
    """An RFC 3339 time with a zone (``2024-01-01T00:00:00Z``) as epoch ms."""
    try:
        return parse_ts(text, "--start")
    except IngestDecodeError as exc:
        raise argparse.ArgumentTypeError(exc.reason) from None


def now_ms() -> int:
    """The wall clock in epoch ms, whole seconds (a readable default start)."""
    return int(datetime.now(tz=UTC).timestamp()) * 1000
