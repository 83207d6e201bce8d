"""Read a registry file (CSV or YAML) into table records, all or nothing.

CSV: a header row naming the columns, one row per entity, each with as many
fields as the header (a UTF-8 byte order mark is dropped; a repeated or unknown
column, or a ``;``-separated file, is refused at the header); blank cells are
null. YAML: a list of mappings, or a mapping with one key (the table name,
e.g. ``devices:``) holding that list. Each row is validated with the table's
schema (:mod:`ingest.registry.model`); a key given twice is an error (the file
is the table's snapshot, not a log of changes: ``deleted: true`` and ``--delete``
remove a key), and so is a file without rows.

A registry is configuration: a half-loaded one is worse than none. So
:func:`load_rows` collects every problem, as ``FILE:LINE: message`` (the message
naming the column, in the words a backtest's table file uses), and raises them
together; the caller then publishes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.rules.yamlpos import YamlProblem, load_with_positions
from app.tables import read_csv_rows, repeated_key
from ingest.model import IngestArgError
from ingest.registry.model import RowError, TableSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TableRecord:
    """One record for a compacted table; ``value`` None is a tombstone."""

    key: str
    value: bytes | None
    line: int


def read_file(path: Path, spec: TableSpec) -> list[tuple[int, Any]]:
    """``(line, row)`` pairs of a CSV (``.csv``, :func:`app.tables.read_csv_rows`: the header
    checked, every row as many fields as the header) or YAML (``.yaml``/``.yml``) file;
    IngestArgError listing the problems of the file's shape."""
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".yaml", ".yml"):
        msg = f"{path}: expected a .csv, .yaml or .yml file"
        raise IngestArgError(msg)
    try:
        if suffix == ".csv":
            rows, problems = read_csv_rows(path, spec.columns(), spec.key)
            if problems:
                raise IngestArgError("\n".join(f"{path}:{p.line}: {p.message}" for p in problems))
            return list(rows)
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"{path}: cannot read: {exc}"
        raise IngestArgError(msg) from None
    try:
        data, positions = load_with_positions(text)
    except YamlProblem as exc:
        msg = f"{path}:{exc.line}:{exc.col}: {exc.message}"
        raise IngestArgError(msg) from None
    prefix: tuple[str, ...] = ()
    if isinstance(data, dict) and list(data) == [spec.name]:
        data, prefix = data[spec.name], (spec.name,)
    if not isinstance(data, list):
        msg = f"{path}: expected a list of rows, or '{spec.name}:' holding one"
        raise IngestArgError(msg)
    return [(positions.get((*prefix, i), (0, 0))[0], row) for i, row in enumerate(data)]


def load_rows(path: Path, spec: TableSpec) -> list[TableRecord]:
    """Validated records of ``path`` in file order; IngestArgError listing every problem."""
    problems: list[str] = []
    records: list[TableRecord] = []
    seen: dict[str, int] = {}
    for line, raw in read_file(path, spec):
        key = raw.get(spec.key) if isinstance(raw, dict) else None
        if isinstance(key, str) and key.strip():
            key = key.strip()
            if key in seen:
                problems.append(f"{path}:{line}: {repeated_key(spec.key, key, seen[key])}")
                continue
            seen[key] = line
        try:
            key, value = spec.parse_row(raw)
        except RowError as exc:
            problems += [f"{path}:{line}: {p.message}" for p in exc.problems]
            continue
        records.append(TableRecord(key, value, line))
    if not records and not problems:
        problems.append(
            f"{path}: no rows: nothing to load (a registry file lists every row of the table; "
            "--delete KEY removes one)"
        )
    if problems:
        raise IngestArgError("\n".join(problems))
    return records
