"""The log line formats the tailer, ``convert`` and ``replay`` understand, by name.

A :class:`LogFormat` parses one line (without its ending) into a logs record,
given a :class:`LineContext` (the default host, the zone of timestamps that
carry none, and the receive time). Parsers raise :class:`LineParseError` with a
one-line reason; :func:`parse_log_line` turns that, and a record the logs schema
rejects, into a :class:`~ingest.model.ConvertError`.

``level`` is normalised (:func:`ingest.adapters.logbase.normalise_level`).
Formats with ``multiline=True`` have a ``message`` that continuation lines
(stack traces) are joined into; see :mod:`ingest.adapters.multiline`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.errors import IngestDecodeError
from app.events import LOGS, check_unique_keys
from ingest.adapters.apache import parse_record as access
from ingest.adapters.apache_error import parse_record as apache_error
from ingest.adapters.applog import parse_record as applog
from ingest.adapters.logbase import LineContext, LineParseError, Parser
from ingest.adapters.syslog import parse_record as syslog
from ingest.model import ConvertError, ConvertResult, IngestArgError, Record, checked

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogFormat:
    """One log line format: its parser, whether ``--host`` is required (the
    line carries no host) and whether continuation lines join its message."""

    name: str
    parse: Parser
    needs_host: bool
    multiline: bool
    description: str = field(default="", compare=False)


def parse_log_line(fmt: LogFormat, text: str, ctx: LineContext, number: int, raw: bytes) -> ConvertResult:
    """Parse and validate one line; a ConvertError (adapter = format name) on failure."""
    try:
        record = fmt.parse(text, ctx)
    except LineParseError as exc:
        return ConvertError(fmt.name, number, raw, exc.reason, exc.field)
    return checked(LOGS, fmt.name, number, raw, record)


def require_host(fmt: LogFormat, host: str | None) -> None:
    """IngestArgError when ``fmt`` needs ``--host`` and it is missing or blank."""
    if fmt.needs_host and not (host and host.strip()):
        msg = f"--format {fmt.name} lines carry no host: --host is required"
        raise IngestArgError(msg)


def _jsonl(text: str, ctx: LineContext) -> Record:
    try:
        obj: Any = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        msg = f"not valid JSON: {exc}"
        raise LineParseError(msg) from None
    if not isinstance(obj, dict):
        msg = f"a JSON lines log event must be an object, got {type(obj).__name__}"
        raise LineParseError(msg)
    try:
        check_unique_keys(text, obj)
    except IngestDecodeError as exc:
        raise LineParseError(exc.reason, exc.field) from None
    if "host" not in obj and ctx.host:
        obj["host"] = ctx.host
    return obj


def _formats() -> dict[str, LogFormat]:
    items = (
        LogFormat("apache", access, True, False, "Apache combined/common access log"),
        LogFormat("nginx", access, True, False, "nginx access log, default `combined` format"),
        LogFormat("apache-error", apache_error, True, True, "Apache 2.2/2.4 error log"),
        LogFormat(
            "applog", applog, True, True, "[LEVEL] [reqid] [yyyy/mm/dd hh:mm:ss ms] [Component line] message"
        ),
        LogFormat("syslog", syslog, False, True, "RFC 3164 or RFC 5424 lines, PRI optional"),
        LogFormat("jsonl", _jsonl, False, False, "a logs event object per line (--host: default host)"),
    )
    return {f.name: f for f in items}


#: Every log line format by name.
LOG_FORMATS: dict[str, LogFormat] = _formats()


def log_format(name: str) -> LogFormat:
    """The format called ``name``; IngestArgError naming the choices otherwise."""
    try:
        return LOG_FORMATS[name]
    except KeyError:
        msg = f"unknown log format {name!r}; expected one of: {', '.join(LOG_FORMATS)}"
        raise IngestArgError(msg) from None
