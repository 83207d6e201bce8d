"""Registry tables for stream-table enrichment: their schemas and an in-memory view.

Tables live in compacted topics (``tables.devices`` keyed by device_id,
``tables.watchlists`` keyed by symbol). A record's value is a flat JSON row;
a null value (tombstone) deletes the key. Rules join with them through
``enrich:`` and see the columns as ``<as>.<column>``.

A table file (``backtest --table``, the console's fleet registry) is read by
:func:`read_table_file` as a snapshot of valid rows, every problem named by
file, line and column; its CSV reader :func:`read_csv_rows` and its row checker
:func:`check_row` are also the ingest registry loader's (:mod:`ingest.registry`),
so both name a problem in the same words.
"""

from __future__ import annotations

import csv
import difflib
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from app.errors import IngestDecodeError
from app.events import LATITUDE, LONGITUDE, MAX_KEY_LEN, Bound, FieldType, Schema, check_value
from app.rules.yamlpos import Positions, YamlProblem, load_with_positions, position_of
from app.topics import DEVICES_TABLE, WATCHLISTS_TABLE

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableSchema:
    """A registry table: its name, compacted topic, key and typed columns; ``bounds`` names the
    double columns whose values outside a :class:`~app.events.Bound` are impossible (the
    events' own bounds: one definition for both). ``pairs`` names columns given together or not
    at all, ``positive`` columns that must be above 0 (with their unit)."""

    name: str
    topic: str
    key: str
    columns: Mapping[str, FieldType]
    bounds: Mapping[str, Bound] = field(default_factory=dict)
    pairs: tuple[tuple[str, str], ...] = ()
    positive: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def _rows(self) -> Schema:
        bounds = tuple(self.bounds.items())
        return Schema(source=self.name, key=self.key, fields=self.columns, timed=False, bounds=bounds)

    def file_columns(self) -> list[str]:
        """Every column a table file may have: the key first, :data:`DELETED` last."""
        return [self.key, *self.columns, DELETED]

    def validate(self, obj: object) -> dict[str, Any]:
        """A row with its key, typed; IngestDecodeError for a key that is not a non-empty
        string or is longer than :data:`~app.events.MAX_KEY_LEN`, an unknown column, a
        mistyped value, a value outside its column's bound, a NaN or infinite number, one of
        ``pairs`` without the other or a ``positive`` column at or below 0: what the registry
        loader refuses in a file (:func:`check_row`), so a row another producer wrote on the
        table's topic is refused alike. Checked as an event is (:meth:`Schema.validate
        <app.events.Schema.validate>`), without ``ts``; JSON has no NaN, so only rows from
        elsewhere (YAML, CSV, code) can hold one."""
        row = self._rows.validate(obj).fields
        for column, value in row.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise IngestDecodeError(_non_finite(column, value), column)
        key = row[self.key]
        if len(key) > MAX_KEY_LEN:
            msg = f"column '{self.key}' (the key) is longer than {MAX_KEY_LEN} characters"
            raise IngestDecodeError(msg, self.key)
        given = {column: value for column, value in row.items() if value is not None}
        problems = _pair_and_sign_problems(self, given, row)
        if problems:
            raise IngestDecodeError("; ".join(p.message for p in problems), problems[0].column)
        return row


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
    {"lat": LATITUDE, "lon": LONGITUDE, "depot_lat": LATITUDE, "depot_lon": LONGITUDE},
    pairs=(("lat", "lon"), ("depot_lat", "depot_lon")),
    positive={"geofence_km": "km"},
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
        """Apply one record of a table topic: a row, or a tombstone (None). IngestDecodeError
        (or ValueError, not JSON) for a row :meth:`TableSchema.validate` refuses, or one whose
        record key is not its key column's value: compaction keeps the last record per record
        key, and the tombstone of that key would leave the row in place."""
        self.version += 1
        if value is None:
            self.rows[table].pop(key, None)
            return
        schema = TABLES[table]
        row = schema.validate(orjson.loads(value))
        if row[schema.key] != key:
            own = row[schema.key]
            msg = f"the record's key {key[:80]!r} is not the row's column '{schema.key}' ({own[:80]!r})"
            raise IngestDecodeError(msg, schema.key)
        self.rows[table][key] = row

    def load_rows(self, table: str, rows: Iterable[Mapping[str, Any]]) -> None:
        self.version += 1
        for r in rows:
            row = TABLES[table].validate(dict(r))
            self.rows[table][row[TABLES[table].key]] = row


def refused_row(topic: str, partition: int, offset: int, exc: Exception) -> str:
    """The log line of a table topic's record :meth:`Tables.apply` refused, in the worker's and
    the Spark engine's registry followers alike."""
    reason = exc.reason if isinstance(exc, IngestDecodeError) else f"not a JSON row: {exc}"
    where = f"{topic} (partition {partition}, offset {offset})"
    return f"refused a row of {where}, the table keeps its earlier one: {reason}"


#: The column of a table file that marks a row deleted: with a true value (``true``,
#: ``yes``, ``1``, ``on``) the key is left out of the table (the registry loader sends a
#: tombstone for it), so one file serves ``ingest registry`` and ``backtest --table``.
DELETED = "deleted"
TRUE_WORDS, FALSE_WORDS = frozenset({"true", "yes", "1", "on"}), frozenset({"false", "no", "0", "off"})


class TableFileProblem(NamedTuple):
    """One problem of a registry file: its 1-based line (the row's first) and what is wrong,
    in words that name the column when there is one."""

    line: int
    message: str


#: Separators a spreadsheet may have used instead of the comma, named for the hint.
_OTHER_SEPARATORS = {";": "';'", "\t": "tab", "|": "'|'"}


def read_csv_rows(
    path: Path, columns: Sequence[str], key: str
) -> tuple[list[tuple[int, dict[str, str]]], list[TableFileProblem]]:
    """``(line, {column: cell})`` of each row of a CSV registry file, and its problems.

    The first non-blank line is the header; a UTF-8 byte order mark (Excel's "CSV UTF-8")
    is dropped, names and cells are stripped, and lines of empty cells are skipped. The
    header is refused with an empty, repeated or unknown name (not in ``columns``), without
    ``key``, or when it is one name holding ``;``, tabs or ``|`` (a hint at the separator);
    then no row is read. A row with more or fewer fields than the header is a problem, not
    padded. An empty file is a problem; a header without rows is not (the caller decides).
    Raises UnicodeDecodeError and OSError as :meth:`Path.open` and reading do."""
    problems: list[TableFileProblem] = []
    rows: list[tuple[int, dict[str, str]]] = []
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        names: list[str] | None = None
        last = 0  # the line the previous record ended on
        try:
            for record in reader:
                line, last = last + 1, reader.line_num
                if not any(cell.strip() for cell in record):
                    continue
                if names is None:
                    names = [name.strip() for name in record]
                    problems += _header_problems(line, names, columns, key)
                    if problems:
                        return [], problems
                    continue
                if len(record) != len(names):
                    problems.append(TableFileProblem(line, _ragged(line, record, names)))
                    continue
                rows.append((line, {n: cell.strip() for n, cell in zip(names, record, strict=True)}))
        except csv.Error as exc:  # a NUL byte, a field past the csv module's size limit
            problems.append(TableFileProblem(reader.line_num, f"not valid CSV: {exc}"))
    if names is None:
        expected = ",".join([key, *[c for c in columns if c != key][:2]])
        problems.append(
            TableFileProblem(1, f"the file is empty: expected a header naming the columns (e.g. {expected})")
        )
    return rows, problems


def _header_problems(line: int, names: list[str], columns: Sequence[str], key: str) -> list[TableFileProblem]:
    if len(names) == 1:
        for sep, what in _OTHER_SEPARATORS.items():
            if sep in names[0]:
                msg = (
                    f"the header is one column {names[0][:80]!r}: the file looks {what}-separated; "
                    "save it as CSV with commas (Excel: CSV UTF-8 (Comma delimited))"
                )
                return [TableFileProblem(line, msg)]
    out: list[TableFileProblem] = []
    seen: dict[str, int] = {}
    for i, name in enumerate(names, 1):
        if not name:
            out.append(TableFileProblem(line, f"column {i} of the header has no name"))
        elif name in seen:
            msg = f"column '{name}' appears twice in the header (columns {seen[name]} and {i})"
            out.append(TableFileProblem(line, msg))
        elif name not in columns:
            out.append(TableFileProblem(line, unknown_column(name, columns, f" (column {i} of the header)")))
        seen.setdefault(name, i)
    if key not in seen:
        out.append(TableFileProblem(line, f"the header has no '{key}' column (the key of every row)"))
    return out


def unknown_column(name: str, columns: Sequence[str], where: str = "") -> str:
    """``unknown column 'max_tmp'<where>; did you mean 'max_temp'? expected one of: ...``."""
    close = difflib.get_close_matches(name, columns, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"unknown column '{name[:80]}'{where}; {hint}expected one of: {', '.join(columns)}"


def _ragged(line: int, record: list[str], names: list[str]) -> str:
    n, m = len(record), len(names)
    if n > m:
        detail = f"field {m + 1} ({record[m].strip()[:40]!r}) has no column"
    else:
        detail = f"no field for {', '.join(repr(c) for c in names[n:])}"
    return f"line {line} has {n} field{'s' * (n != 1)}, the header has {m}: {detail}"


def read_table_file(table: str, path: Path) -> list[dict[str, Any]]:
    """The rows of a registry file for a backtest or rule test, every one valid
    (:func:`table_file_rows`); ValueError listing every problem, one a line, when any is not."""
    rows, problems = table_file_rows(table, path)
    if problems:
        raise ValueError("\n".join(problems))
    return rows


class FileRow(NamedTuple):
    """A valid row of a table file (:func:`checked_table_file`): typed, whether its
    :data:`DELETED` column is true, and the line it starts on."""

    row: dict[str, Any]
    deleted: bool
    line: int


def checked_table_file(table: str, path: Path) -> tuple[list[FileRow], list[str]]:
    """Every valid row of a table file, in file order, and its problems: the one reader of a
    registry file, for the registry loader (``ingest registry``), a backtest's ``--table`` and
    the console's map. CSV with a header (:func:`read_csv_rows`; an empty cell is NULL), or
    YAML (a list of rows, or ``{rows: [...]}``, or ``{<table>: [...]}``).

    Every key once, every row a valid row of the table (:func:`check_row`). Each problem is
    ``FILE:LINE: ...`` (YAML: ``FILE:LINE:COL: ...``), naming its column; an invalid row is
    left out, and so is a repeated key's later row (a CSV file whose header is not valid has
    no rows). YAML that does not parse, or is not a list of rows, raises ValueError;
    UnicodeDecodeError and OSError are raised as reading the file raises them."""
    schema = TABLES[table]
    problems: list[str] = []
    # each row as (its line, a function placing a column of it: FILE:LINE or FILE:LINE:COL, its cells)
    found: list[tuple[int, Callable[[str | None], str], object]] = []
    if path.suffix.lower() == ".csv":
        rows, structure = read_csv_rows(path, schema.file_columns(), schema.key)
        problems += [f"{path}:{p.line}: {p.message}" for p in structure]
        found = [(line, partial(_csv_place, f"{path}:{line}"), cells) for line, cells in rows]
    else:
        data, positions = _read_yaml(path)
        prefix: tuple[str, ...] = ()
        if isinstance(data, dict) and len(data) == 1 and next(iter(data)) in ("rows", table):
            prefix = (str(next(iter(data))),)
            data = data[prefix[0]]
        if not isinstance(data, list):
            msg = f"{path}: expected a list of rows, or 'rows:' or '{table}:' holding one"
            raise ValueError(msg)
        for i, raw in enumerate(data):
            at: tuple[str | int, ...] = (*prefix, i)
            found.append((position_of(positions, at)[0], partial(_yaml_place, path, positions, at), raw))
    first: dict[str, int] = {}  # each key's first line, valid row or not
    valid: list[FileRow] = []
    for line, place, raw in found:
        key = _cells(raw).get(schema.key) if isinstance(raw, Mapping) else None
        if isinstance(key, str) and key:
            if key in first:  # the row's other problems wait until the key is given once
                problems.append(f"{place(schema.key)}: {_repeated_key(schema.key, key, first[key])}")
                continue
            first[key] = line
        row, deleted, wrong = check_row(schema, raw)
        problems += [f"{place(p.column)}: {p.message}" for p in wrong]
        if row is not None:
            valid.append(FileRow(row, deleted, line))
    return valid, problems


def table_file_rows(table: str, path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a table file as a snapshot (:func:`checked_table_file`), and its problems:
    a row whose :data:`DELETED` column is true is left out, as the registry loader deletes
    its key, and a file must have at least one row (an empty table needs no file)."""
    valid, problems = checked_table_file(table, path)
    if not problems and not valid:
        msg = f"{path}: no rows (a table file lists the table's rows; an empty table needs no file)"
        problems.append(msg)
    return [r.row for r in valid if not r.deleted], problems


def _repeated_key(key: str, value: str, line: int) -> str:
    """A key a table file gives on two rows: ``device_id 'm1' is already on line 2; ...``."""
    return f"{key} {value!r} is already on line {line}; a table file lists each key once"


def _csv_place(at: str, _column: str | None) -> str:
    """``FILE:LINE`` of a CSV row, whatever the column (the message names it)."""
    return at


def _yaml_place(path: Path, positions: Positions, row: tuple[str | int, ...], column: str | None) -> str:
    """``FILE:LINE:COL`` of a YAML row's ``column`` (of the row itself for None)."""
    line, col = position_of(positions, row if column is None else (*row, column))
    return f"{path}:{line}:{col}"


class RowProblem(NamedTuple):
    """One problem of a table row: the column it is about (None: the row as a whole) and what
    is wrong, in words that name the column; the reader adds where the row is."""

    column: str | None
    message: str


class CheckedRow(NamedTuple):
    """A row as :func:`check_row` found it: typed (None when it has a problem), whether its
    :data:`DELETED` column is true, and every problem."""

    row: dict[str, Any] | None
    deleted: bool
    problems: list[RowProblem]


def check_row(schema: TableSchema, raw: object) -> CheckedRow:
    """One row of a table file (``raw``: a mapping of column to cell, text from CSV, typed from
    YAML) typed by ``schema``, with every problem: the one check of a row for a backtest's or
    the console's table file (:func:`table_file_rows`) and the registry loader
    (:mod:`ingest.registry.model`).

    Names and text are stripped, and a None cell or empty text is NULL (left out), so a file
    gives a backtest the rows the registry loader publishes from it. Text is converted by
    its column's type (a number; a whole number; true or false as :data:`TRUE_WORDS` and
    :data:`FALSE_WORDS`), and every value is checked as an event's field is
    (:func:`~app.events.check_value`), numbers finite and within their column's bound. The
    key is required, of at most :data:`~app.events.MAX_KEY_LEN` characters (as an event's);
    :data:`DELETED` is true or false (text as the words); ``schema.pairs`` are given
    together and ``schema.positive`` columns are above 0."""
    if not isinstance(raw, Mapping):
        problem = RowProblem(None, f"a row must be a mapping of column: value, got {type(raw).__name__}")
        return CheckedRow(None, False, [problem])
    cells = _cells(raw)
    problems: list[RowProblem] = []
    deleted = cells.pop(DELETED, False)
    if isinstance(deleted, str) and deleted.lower() in TRUE_WORDS | FALSE_WORDS:
        deleted = deleted.lower() in TRUE_WORDS
    if not isinstance(deleted, bool):
        message = f"column '{DELETED}' must be true or false, got {_given(deleted)}"
        problems.append(RowProblem(DELETED, message))
        deleted = False
    row: dict[str, Any] = {}
    for column, value in cells.items():
        ftype = "string" if column == schema.key else schema.columns.get(column)
        if ftype is None:
            problems.append(RowProblem(column, unknown_column(column, schema.file_columns())))
            continue
        try:
            row[column] = _cell(column, ftype, value, schema.bounds.get(column))
        except IngestDecodeError as exc:
            problems.append(RowProblem(column, exc.reason))
    key, name = row.get(schema.key), f"column '{schema.key}' (the key)"
    if schema.key not in cells:
        problems.append(RowProblem(None, f"{name} is missing or empty"))
    elif isinstance(key, str) and not key.strip():
        problems.append(RowProblem(schema.key, f"{name} is blank"))
    elif isinstance(key, str) and len(key) > MAX_KEY_LEN:
        problems.append(RowProblem(schema.key, f"{name} is longer than {MAX_KEY_LEN} characters"))
    problems += _pair_and_sign_problems(schema, cells, row)
    if problems:
        return CheckedRow(None, deleted, problems)
    try:
        return CheckedRow(schema.validate(row), deleted, [])
    except IngestDecodeError as exc:  # every check above passed: not expected
        return CheckedRow(None, deleted, [RowProblem(exc.field, exc.reason)])


def _cells(raw: Mapping[Any, Any]) -> dict[str, Any]:
    """The cells of a row by column name, names and text stripped, NULL and blank ones left
    out (see :func:`check_row`)."""
    cells = {str(c).strip(): v.strip() if isinstance(v, str) else v for c, v in raw.items()}
    return {c: v for c, v in cells.items() if v is not None and v != ""}


def _cell(column: str, ftype: FieldType, value: Any, bound: Bound | None) -> object:
    """A cell as its column holds it; IngestDecodeError naming the column otherwise."""
    given = value
    if isinstance(value, str) and ftype in ("double", "long", "boolean"):
        value = _from_text(column, ftype, value)
    if isinstance(value, float) and ftype in ("double", "long") and not math.isfinite(value):
        raise IngestDecodeError(_non_finite(column, given), column)
    value = check_value(column, ftype, value, "column")
    if isinstance(value, float) and bound is not None and not bound.holds(value):
        raise IngestDecodeError(bound.refusal(column, value, "column"), column)
    return value


def _from_text(column: str, ftype: FieldType, text: str) -> object:
    """A CSV cell's (or quoted YAML) text as a number, a whole number or true or false."""
    if ftype == "boolean":
        if text.lower() in TRUE_WORDS | FALSE_WORDS:
            return text.lower() in TRUE_WORDS
        msg = f"column '{column}' must be true or false, got {_given(text)}"
        raise IngestDecodeError(msg, column)
    try:
        return float(text) if ftype == "double" else int(text)
    except ValueError:
        what = "a number" if ftype == "double" else "a whole number"
        msg = f"column '{column}' must be {what}, got {_given(text)}"
        raise IngestDecodeError(msg, column) from None


def _pair_and_sign_problems(
    schema: TableSchema, cells: Mapping[str, Any], row: Mapping[str, Any]
) -> list[RowProblem]:
    """``schema.pairs`` given together (by the cells
    given, typed or not), ``schema.positive`` columns above 0."""
    out: list[RowProblem] = []
    for a, b in schema.pairs:
        if (a in cells) != (b in cells):
            missing = b if a in cells else a
            message = f"column '{missing}' is missing: '{a}' and '{b}' go together, give both or neither"
            out.append(RowProblem(missing, message))
    for column, unit in schema.positive.items():
        value = row.get(column)
        if isinstance(value, float) and value <= 0:
            out.append(RowProblem(column, f"column '{column}' must be above 0 ({unit}), got float {value!r}"))
    return out


def _given(value: object) -> str:
    """A cell as a message shows it: text quoted as the file has it, another value with its
    type (as :func:`~app.events.check_value` shows a value)."""
    if isinstance(value, str):
        return repr(value[:80])
    return f"{type(value).__name__} {value!r:.40}"


def _non_finite(column: str, value: object) -> str:
    return (
        f"column '{column}' must be a finite number, got {_given(value)} "
        "(as in events, NaN and infinities are refused)"
    )


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
