"""Read a registry file (CSV or YAML) into table records, all or nothing.

CSV: a header row naming the columns, one row per entity, each with as many
fields as the header (a UTF-8 byte order mark is dropped; a repeated or unknown
column, or a ``;``-separated file, is refused at the header); blank cells are
null. YAML: a list of mappings, or a mapping with one key (``rows:``, or the table
name, e.g. ``devices:``) holding that list. The file is read and each row checked by
:func:`app.tables.checked_table_file`, the reader of a backtest's ``--table`` file and
of the console's map too, so all three take the same rows and name a problem alike; a key
given twice is an error (the file is the table's snapshot, not a log of changes:
``deleted: true`` and ``--delete`` remove a key), and so is a file without rows.

A registry is configuration: a half-loaded one is worse than none. So
:func:`load_rows` collects every problem, as ``FILE:LINE: message`` (YAML:
``FILE:LINE:COL``, the message naming the column), and raises them together; the
caller then publishes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import orjson

from app.tables import checked_table_file
from ingest.model import IngestArgError
from ingest.registry.model import TableSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TableRecord:
    """One record for a compacted table; ``value`` None is a tombstone."""

    key: str
    value: bytes | None
    line: int


def load_rows(path: Path, spec: TableSpec) -> list[TableRecord]:
    """Validated records of ``path`` in file order (a row whose ``deleted`` column is true is
    a tombstone); IngestArgError listing every problem."""
    if path.suffix.lower() not in (".csv", ".yaml", ".yml"):
        msg = f"{path}: expected a .csv, .yaml or .yml file"
        raise IngestArgError(msg)
    try:
        rows, problems = checked_table_file(spec.name, path)
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"{path}: cannot read: {exc}"
        raise IngestArgError(msg) from None
    except ValueError as exc:  # YAML that does not parse or is not a list of rows
        raise IngestArgError(str(exc)) from None
    if not rows and not problems:
        problems.append(
            f"{path}: no rows: nothing to load (a registry file lists every row of the table; "
            "--delete KEY removes one)"
        )
    if problems:
        raise IngestArgError("\n".join(problems))
    return [TableRecord(r.row[spec.key], None if r.deleted else orjson.dumps(r.row), r.line) for r in rows]
