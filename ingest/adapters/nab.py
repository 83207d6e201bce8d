"""Numenta Anomaly Benchmark CSV (``timestamp,value``) -> sensors events.

Each data row becomes ``{"device_id": DEVICE, "ts": ..., FIELD: value}``.
Rows stay in file order: NAB files contain real out-of-order and duplicated
timestamps (``machine_temperature_system_failure.csv`` jumps back 55 minutes
at line 10151), and those are exactly what downstream code must cope with.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from datetime import UTC, datetime

from app.events import SENSORS, format_ts
from ingest.model import (
    Converter,
    ConvertError,
    ConvertResult,
    IngestArgError,
    checked,
    decode_line,
    epoch_ms,
    read_lines,
)

logger = logging.getLogger(__name__)

ADAPTER = "nab"
HEADER = ("timestamp", "value")


def numeric_sensor_fields() -> list[str]:
    """Names of the sensors schema's double fields, the valid ``--field`` values."""
    return sorted(name for name, ftype in SENSORS.fields.items() if ftype == "double")


def check_options(device: str, field: str, kind: str | None = None) -> None:
    """Raise IngestArgError unless ``device`` is a usable key, ``field`` a
    double field of the sensors schema and ``kind`` (when given) not blank."""
    if kind is not None and not kind.strip():
        msg = "--kind must name what the series measures, e.g. temperature; got an empty value"
        raise IngestArgError(msg)
    if not device.strip():
        msg = "--device must be a non-empty device id"
        raise IngestArgError(msg)
    if SENSORS.fields.get(field) != "double":
        msg = (
            f"--field {field!r} is not a numeric field of the sensors schema; "
            f"expected one of: {', '.join(numeric_sensor_fields())}"
        )
        raise IngestArgError(msg)


def nab_events(path: str, *, device: str, field: str, kind: str | None = None) -> Converter:
    """Convert a NAB CSV file, row by row, in file order.

    Arguments are checked before the file is opened (IngestArgError). The first
    line must be the ``timestamp,value`` header, otherwise it yields a
    ConvertError for line 1 and still converts the rows after it. Naive
    timestamps are UTC; a timestamp with an offset is converted to UTC. A row
    whose timestamp or value does not parse, or whose value is not finite,
    yields a ConvertError carrying its line number and raw text, as does a row
    the sensors schema rejects (a timestamp outside 1970..2100). Blank lines
    are skipped.

    With ``kind``, each event also carries the reading as ``value`` and ``kind``: the
    shape the anomaly pack reads (``rules/anomaly.yaml``), beside ``field``'s.
    """
    check_options(device, field, kind)
    return (result for _number, result in _convert(path, device, field, kind))


def numbered_nab_events(
    path: str, *, device: str, field: str, kind: str | None = None
) -> Iterator[tuple[int, ConvertResult]]:
    """:func:`nab_events` with the 1-based line number of each result."""
    check_options(device, field, kind)
    return _convert(path, device, field, kind)


def _convert(path: str, device: str, field: str, kind: str | None) -> Iterator[tuple[int, ConvertResult]]:
    for number, raw in read_lines(path):
        text = decode_line(ADAPTER, number, raw)
        if isinstance(text, ConvertError):
            yield number, text
            continue
        if number == 1:
            header = tuple(c.strip().lower() for c in text.lstrip("\ufeff").split(","))
            if header != HEADER:
                reason = f"expected the header 'timestamp,value', got {text[:80]!r}"
                yield number, ConvertError(ADAPTER, number, raw, reason)
            continue
        if not text.strip():
            continue
        yield number, _row(number, raw, text, device, field, kind)


def _row(number: int, raw: bytes, text: str, device: str, field: str, kind: str | None) -> ConvertResult:
    cells = text.split(",")
    if len(cells) != 2:
        return ConvertError(ADAPTER, number, raw, f"expected 2 columns 'timestamp,value', got {len(cells)}")
    ts_text, value_text = (c.strip() for c in cells)
    try:
        dt = datetime.fromisoformat(ts_text)
    except ValueError:
        return ConvertError(ADAPTER, number, raw, f"timestamp {ts_text[:40]!r} is not ISO 8601", "ts")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    try:
        value = float(value_text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        return ConvertError(ADAPTER, number, raw, f"value {value_text[:40]!r} is not a finite number", field)
    record: dict[str, object] = {"device_id": device, "ts": format_ts(epoch_ms(dt)), field: value}
    if kind is not None:
        record["value"], record["kind"] = value, kind
    return checked(SENSORS, ADAPTER, number, raw, record)
