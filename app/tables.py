"""Registry tables for stream-table enrichment: their schemas and an in-memory view.

Tables live in compacted topics (``tables.devices`` keyed by device_id,
``tables.watchlists`` keyed by symbol). A record's value is a flat JSON row;
a null value (tombstone) deletes the key. Rules join with them through
``enrich:`` and see the columns as ``<as>.<column>``.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from app.events import FieldType, Schema
from app.rules.yamlpos import Positions, YamlProblem, load_with_positions, position_of
from app.topics import DEVICES_TABLE, WATCHLISTS_TABLE

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableSchema:
    """A registry table: its name, compacted topic, key and typed columns."""

    name: str
    topic: str
    key: str
    columns: Mapping[str, FieldType]

    @cached_property
    def _rows(self) -> Schema:
        return Schema(source=self.name, key=self.key, fields=self.columns, timed=False)

    def validate(self, obj: object) -> dict[str, Any]:
        """A row with its key, typed; IngestDecodeError for a key that is not a non-empty
        string, an unknown column or a mistyped value. Checked as an event is
        (:meth:`Schema.validate <app.events.Schema.validate>`), without ``ts``."""
        return self._rows.validate(obj).fields


DEVICES = TableSchema(
    "devices",
    DEVICES_TABLE,
    "device_id",
    {
        "site": "string",
        "owner": "string",
        "kind": "string",
        "lat": "double",
        "lon": "double",
        "depot_lat": "double",
        "depot_lon": "double",
        "geofence_km": "double",
        "max_temp": "double",
        "min_temp": "double",
        "battery_min": "double",
    },
)

WATCHLISTS = TableSchema(
    "watchlists",
    WATCHLISTS_TABLE,
    "symbol",
    {
        "list": "string",
        "owner": "string",
        "note": "string",
        "max_trade_amount": "double",
        "min_pct_move": "double",
    },
)

TABLES: dict[str, TableSchema] = {t.name: t for t in (DEVICES, WATCHLISTS)}


def enriched_fields(schema: Schema, enrich: Iterable[Any]) -> dict[str, FieldType]:
    """The fields a rule may name: the source's plus ``<as>.<column>`` of each join."""
    fields = schema.all_fields()
    for spec in enrich:
        table = TABLES[spec.table]
        fields[f"{spec.as_}.{table.key}"] = "string"
        for col, ftype in table.columns.items():
            fields[f"{spec.as_}.{col}"] = ftype
    return fields


@dataclass
class Tables:
    """The current rows of every table, as the worker or a backtest sees them."""

    rows: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {n: {} for n in TABLES})
    version: int = 0  # bumped on every change, so readers know to look again

    def get(self, table: str, key: str) -> dict[str, Any] | None:
        return self.rows.get(table, {}).get(key)

    def keys(self, table: str) -> list[str]:
        return sorted(self.rows.get(table, {}))

    def apply(self, table: str, key: str, value: bytes | None) -> None:
        """Apply one record of a table topic: a row, or a tombstone (None)."""
        self.version += 1
        if value is None:
            self.rows[table].pop(key, None)
            return
        row = TABLES[table].validate(orjson.loads(value))
        self.rows[table][row[TABLES[table].key]] = row

    def load_rows(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
        self.version += 1
        for r in rows:
            row = TABLES[table].validate(dict(r))
            self.rows[table][row[TABLES[table].key]] = row


def read_table_file(table: str, path: Path) -> list[dict[str, Any]]:
    """Rows of a registry file for a backtest or rule test: CSV with a header, or YAML
    (a list of rows, or ``{rows: [...]}``). CSV cells are converted by column type;
    an empty cell is NULL. Raises ValueError naming the file and line."""
    schema = TABLES[table]
    if path.suffix.lower() == ".csv":
        rows: list[dict[str, Any]] = []
        with path.open(newline="", encoding="utf-8") as f:
            for lineno, raw in enumerate(csv.DictReader(f), 2):
                row: dict[str, Any] = {}
                for col, cell in raw.items():
                    ftype = schema.columns.get(col) if col != schema.key else "string"
                    if cell is None or cell == "":
                        continue
                    try:
                        row[col] = float(cell) if ftype == "double" else cell
                    except ValueError:
                        msg = f"{path}:{lineno}: column '{col}' must be a number, got {cell!r}"
                        raise ValueError(msg) from None
                rows.append(row)
        return rows
    data, positions = _read_yaml(path)
    prefix: tuple[str, ...] = ()
    if isinstance(data, dict):
        data, prefix = data.get("rows"), ("rows",)
    if not isinstance(data, list):
        msg = f"{path}: expected a list of rows (or rows: [...])"
        raise ValueError(msg)
    for i, r in enumerate(data):
        if not isinstance(r, dict):
            line, col = position_of(positions, (*prefix, i))
            msg = f"{path}:{line}:{col}: a row must be a mapping of column: value"
            raise ValueError(msg)
    return [dict(r) for r in data]


#: The largest YAML registry file a backtest or rule test reads (CSV has no such limit).
MAX_YAML_TABLE_BYTES = 4 * 1024 * 1024


def _read_yaml(path: Path) -> tuple[Any, Positions]:
    """A YAML registry file through the rule files' bounded reader (:mod:`app.rules.yamlpos`:
    no anchors or aliases, bounded nesting and size); a ValueError as ``file:line:col: ...``."""
    with path.open("rb") as fh:
        raw = fh.read(MAX_YAML_TABLE_BYTES + 1)
    if len(raw) > MAX_YAML_TABLE_BYTES:
        msg = f"{path}:1:1: larger than {MAX_YAML_TABLE_BYTES} bytes (the limit for YAML); use CSV"
        raise ValueError(msg)
    try:
        return load_with_positions(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        msg = f"{path}:1:1: not UTF-8: {exc.reason}"
        raise ValueError(msg) from None
    except YamlProblem as exc:
        msg = f"{path}:{exc.line}:{exc.col}: {exc.message}"
        raise ValueError(msg) from None
    except (RecursionError, MemoryError) as exc:  # past every limit of the reader: still the file's
        msg = f"{path}:1:1: the file is too large or nests too deeply to load ({type(exc).__name__})"
        raise ValueError(msg) from None
