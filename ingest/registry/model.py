"""Rows of the compacted reference tables, checked against the core's table schemas.

The columns of ``tables.devices`` and ``tables.watchlists`` are defined once,
in :mod:`app.tables` (the worker validates the rows it joins with the same
schema), so a row this loader publishes is always one the worker accepts.
A file row becomes a table record: ``key -> JSON object of the set columns``
(blank cells left out), or a tombstone (``None``) when its ``deleted`` column
is true.

File cells are text (CSV) or typed (YAML); text is converted by the column's
type (``double``, ``long``, ``boolean``, ``string``). On top of the types,
device rows must have latitudes in -90..90 and longitudes in -180..180 (the table's
``bounds``, the same as the events'), ``lat``/``lon`` and ``depot_lat``/``depot_lon``
in pairs, and a positive ``geofence_km``. Every problem of a row is reported, not
just the first.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from app.errors import IngestDecodeError
from app.events import MAX_KEY_LEN, Bound
from app.tables import DELETED, FALSE_WORDS, TRUE_WORDS, TableSchema
from app.tables import TABLES as SCHEMAS

logger = logging.getLogger(__name__)

_TRUE, _FALSE = TRUE_WORDS, FALSE_WORDS
_PAIRS = (("lat", "lon"), ("depot_lat", "depot_lon"))


class RowError(Exception):
    """Every problem of one row, as ``(column, message)`` pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{c}: {m}" for c, m in problems))
        self.problems = problems


@dataclass(frozen=True)
class TableSpec:
    """A reference table by its command-line name; ``source`` labels its metrics."""

    name: str
    schema: TableSchema
    source: str

    @property
    def topic(self) -> str:
        return self.schema.topic

    @property
    def key(self) -> str:
        return self.schema.key

    def columns(self) -> list[str]:
        """Every column a file may have, key first, ``deleted`` last."""
        return [self.key, *self.schema.columns, DELETED]

    def parse_row(self, raw: object) -> tuple[str, bytes | None]:
        """``(key, value)`` of one file row (value None: a tombstone); RowError otherwise."""
        if not isinstance(raw, dict):
            raise RowError([("row", f"expected a mapping of column to value, got {type(raw).__name__}")])
        cells = {str(k).strip(): _blank_to_none(v) for k, v in raw.items()}
        cells = {k: v for k, v in cells.items() if v is not None}
        problems: list[tuple[str, str]] = []
        deleted = _boolean(cells.pop(DELETED, False), DELETED, problems)
        row: dict[str, Any] = {}
        for column, value in cells.items():
            ftype = "string" if column == self.key else self.schema.columns.get(column)
            if ftype is None:
                problems.append((column, f"unknown column; expected one of: {', '.join(self.columns())}"))
                continue
            row[column] = _convert(value, ftype, column, problems)
        key = row.get(self.key)
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_LEN:
            problems.append(
                (self.key, f"the key must be a non-empty string of at most {MAX_KEY_LEN} characters")
            )
        _check_places(row, self.schema.bounds, problems)
        if not problems:
            try:
                row = self.schema.validate(row)
            except IngestDecodeError as exc:
                problems.append((exc.field or "row", exc.reason))
        if problems:
            raise RowError(problems)
        return row[self.key], None if deleted else orjson.dumps(row)


def _blank_to_none(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip()
        return value or None
    return value


def _boolean(value: Any, column: str, problems: list[tuple[str, str]]) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    problems.append((column, f"expected true or false, got {value!r}"))
    return False


def _convert(value: Any, ftype: str, column: str, problems: list[tuple[str, str]]) -> Any:
    """Cell text to the column's type (typed YAML values pass through to the schema, but
    NaN and infinities, which events cannot hold either, are refused here)."""
    if not isinstance(value, str):
        if ftype in ("double", "long") and isinstance(value, float) and not math.isfinite(value):
            problems.append((column, f"expected a finite number, got {value!r}"))
            return None
        return value
    try:
        if ftype == "double":
            number = float(value)
            if not math.isfinite(number):
                problems.append((column, f"expected a finite number, got {value!r}"))
                return None
            return number
        if ftype == "long":
            return int(value)
    except ValueError:
        problems.append(
            (column, f"expected a {'number' if ftype == 'double' else 'whole number'}, got {value!r}")
        )
        return None
    if ftype == "boolean":
        return _boolean(value, column, problems)
    return value


def _check_places(row: dict[str, Any], bounds: Mapping[str, Bound], problems: list[tuple[str, str]]) -> None:
    for column, bound in bounds.items():
        value = row.get(column)
        if isinstance(value, int | float) and not bound.holds(value):
            problems.append((column, f"must be within {bound.low:g}..{bound.high:g}, got {value}"))
    for a, b in _PAIRS:
        if (a in row) != (b in row):
            problems.append((a if a not in row else b, f"{a} and {b} go together: give both or neither"))
    geofence = row.get("geofence_km")
    if isinstance(geofence, int | float) and geofence <= 0:
        problems.append(("geofence_km", f"must be > 0, got {geofence}"))


TABLES: dict[str, TableSpec] = {
    "devices": TableSpec("devices", SCHEMAS["devices"], "sensors"),
    "watchlists": TableSpec("watchlists", SCHEMAS["watchlists"], "finance"),
}
