"""The small typed vocabulary shared by converters, the publisher and replay.

A converter is a generator of :data:`ConvertResult`: either a flat event dict
ready for :meth:`app.events.Schema.validate`, or a :class:`ConvertError` for an
input line that could not be converted. Errors are yielded in place, in input
order, so a caller can report or dead-letter them without losing their position;
a converter never drops a line silently.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

from app.errors import ConfigError, IngestDecodeError
from app.events import Schema

logger = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


class IngestArgError(ConfigError):
    """An ingest command or converter was given arguments it cannot use
    (unknown field, symbol, topic or format; a missing option). The message
    names the option and the accepted values."""


@dataclass(frozen=True, slots=True)
class ConvertError:
    """One input line a converter could not turn into an event.

    ``line`` is 1-based in the input file (0 when the input has no lines),
    ``raw`` is the line as read, without its line ending, ``reason`` a one-line
    explanation, ``field`` the offending event field when there is one.
    """

    adapter: str
    line: int
    raw: bytes
    reason: str
    field: str | None = None

    def describe(self, source_name: str) -> str:
        """The ``FILE:LINE: reason`` form printed by the CLI."""
        return f"{source_name}:{self.line}: {self.reason}"


Record: TypeAlias = dict[str, Any]
ConvertResult: TypeAlias = Record | ConvertError
Converter: TypeAlias = Iterator[ConvertResult]


def epoch_ms(dt: datetime) -> int:
    """A timezone-aware datetime as whole epoch milliseconds (UTC).

    Raises ValueError for a naive datetime: the caller decides which zone a
    naive timestamp is in.
    """
    if dt.tzinfo is None:
        msg = "naive datetime: attach a timezone before converting"
        raise ValueError(msg)
    return (dt - _EPOCH) // _MS


def read_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, raw_line)`` for each line of a file, 1-based, with
    the ``\\n`` / ``\\r\\n`` ending removed. Bytes, not text: each converter
    decides how to report a line that is not UTF-8."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            yield number, line.rstrip(b"\r\n")


def decode_line(adapter: str, number: int, raw: bytes) -> str | ConvertError:
    """The line as text, or a ConvertError naming the first byte that is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ConvertError(adapter, number, raw, f"line is not valid UTF-8 at byte {exc.start}")


def checked(schema: Schema, adapter: str, number: int, raw: bytes, record: Record) -> ConvertResult:
    """The record normalised by ``schema``, or a ConvertError with the schema's
    reason. Converters pass every record through this, so whatever they yield
    as a dict validates against its source schema."""
    try:
        return schema.validate(record).fields
    except IngestDecodeError as exc:
        return ConvertError(adapter, number, raw, exc.reason, exc.field)
