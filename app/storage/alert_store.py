"""The durable SQLite alert store: every transition once, and the current state per alert.

Tables:

- ``transitions``: one row per ``alert_id`` (the primary key), holding the
  whole alert as JSON. Applying an alert whose id is already there changes
  nothing, so replays and redeliveries are harmless.
- ``alerts``: the current state per ``(rule_id, fingerprint)`` (the
  fingerprint alone hashes only the labels, so two rules with equal labels
  would collide).

Ordering rule: a transition replaces the current state only if its
``(starts_at, event_ts, status rank)`` is greater, compared as instants (not
strings) with rank pending < firing = no_data < resolved = inactive. A late, older transition
(say the resolution of the previous episode arriving after the next one
fired) is still recorded in ``transitions`` but never overwrites newer state.

Operator state, for the CLI and the dashboard: ``commands`` (every command
once, by ``cmd_id``), ``acks``, ``silences`` (from the commands topic) and
``notifications`` (each notification's latest state, queued, delivered or
dead, from the notifications topic; ``dead`` rows are the dead-letter
list). ``offsets`` holds the next offset per topic partition, written in
the same transaction as the rows, so store-sync resumes exactly and a lost
store is rebuilt by replaying the topics from the beginning.

Engines: each transition row and each current alert has ``engine``, the engine that produced
it as the record's ``engine`` header says (``spark``; a record without the header is the Faust
worker's, ``faust``). A rule of ``engine: both`` produces each transition twice with one
``alert_id``: the second copy adds its engine, so the row says ``faust,spark`` (names sorted,
comma-separated). Rows recorded before the store kept engines (schema 2) say ``""`` (unknown).
Opening a schema-2 file as the writer adds the column (:func:`migrate`).

Concurrency: WAL mode; one writer process and any number of readers in
other processes (``readonly=True``). Writes run in ``BEGIN IMMEDIATE``
transactions with ``synchronous=FULL``, so once :meth:`AlertStore.apply_many`
returns the batch survives a crash and a power loss. A connection belongs to
the thread that opened it.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from app.alerts import Alert, order_key
from app.storage.operator_records import OperatorRecords
from app.storage.sqlite import create_schema, open_reader, open_writer, select_in, transaction

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 3
#: the engine of an alert record without an ``engine`` header: the Faust worker writes none
DEFAULT_ENGINE = "faust"
#: what a schema-2 row (recorded before engines were kept) says: unknown
UNKNOWN_ENGINE = ""
_SCHEMA = """
CREATE TABLE IF NOT EXISTS transitions (
    alert_id TEXT PRIMARY KEY, rule_id TEXT NOT NULL, fingerprint TEXT NOT NULL,
    status TEXT NOT NULL, severity TEXT NOT NULL, event_us INTEGER NOT NULL,
    recorded_at TEXT NOT NULL, alert TEXT NOT NULL, engine TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS transitions_by_time ON transitions (event_us);
CREATE INDEX IF NOT EXISTS transitions_by_rule ON transitions (rule_id, event_us);
CREATE INDEX IF NOT EXISTS transitions_by_alert ON transitions (rule_id, fingerprint, event_us);
CREATE INDEX IF NOT EXISTS transitions_by_recorded ON transitions (recorded_at, status);
CREATE TABLE IF NOT EXISTS alerts (
    rule_id TEXT NOT NULL, fingerprint TEXT NOT NULL, status TEXT NOT NULL,
    severity TEXT NOT NULL, labels TEXT NOT NULL, annotations TEXT NOT NULL,
    starts_at TEXT NOT NULL, ends_at TEXT, alert_id TEXT NOT NULL, values_json TEXT NOT NULL,
    event_ts TEXT NOT NULL, rule_version TEXT NOT NULL, updated_at TEXT NOT NULL,
    starts_us INTEGER NOT NULL, event_us INTEGER NOT NULL, status_rank INTEGER NOT NULL,
    engine TEXT NOT NULL DEFAULT '', PRIMARY KEY (rule_id, fingerprint));
CREATE INDEX IF NOT EXISTS alerts_by_status ON alerts (status, starts_us);
CREATE INDEX IF NOT EXISTS alerts_by_rule ON alerts (rule_id, status);
CREATE INDEX IF NOT EXISTS alerts_by_severity ON alerts (status, severity);
CREATE INDEX IF NOT EXISTS alerts_by_device ON alerts (json_extract(labels, '$.device_id'));
CREATE TABLE IF NOT EXISTS commands (cmd_id TEXT PRIMARY KEY, type TEXT NOT NULL, at TEXT NOT NULL,
    command TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS acks (fingerprint TEXT NOT NULL, starts_at TEXT NOT NULL, by TEXT NOT NULL,
    comment TEXT NOT NULL, at TEXT NOT NULL, PRIMARY KEY (fingerprint, starts_at));
CREATE TABLE IF NOT EXISTS silences (id TEXT PRIMARY KEY, matchers TEXT NOT NULL, starts_at TEXT NOT NULL,
    ends_at TEXT NOT NULL, created_by TEXT NOT NULL, comment TEXT NOT NULL, ended_by TEXT);
CREATE TABLE IF NOT EXISTS notifications (msg_id TEXT PRIMARY KEY, receiver TEXT NOT NULL,
    group_key TEXT NOT NULL, notice TEXT NOT NULL, status TEXT NOT NULL, alert_ids TEXT NOT NULL,
    queued_at REAL NOT NULL, updated_at REAL NOT NULL, attempts INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS notifications_by_status ON notifications (status, updated_at);
CREATE TABLE IF NOT EXISTS offsets (topic TEXT NOT NULL, partition INTEGER NOT NULL, next INTEGER NOT NULL,
    PRIMARY KEY (topic, partition));
"""

_UPSERT = """
INSERT INTO alerts (rule_id, fingerprint, status, severity, labels, annotations, starts_at, ends_at,
    alert_id, values_json, event_ts, rule_version, updated_at, engine, starts_us, event_us, status_rank)
VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
ON CONFLICT (rule_id, fingerprint) DO UPDATE SET
    status=excluded.status, severity=excluded.severity, labels=excluded.labels,
    annotations=excluded.annotations, starts_at=excluded.starts_at, ends_at=excluded.ends_at,
    alert_id=excluded.alert_id, values_json=excluded.values_json, event_ts=excluded.event_ts,
    rule_version=excluded.rule_version, updated_at=excluded.updated_at, engine=excluded.engine,
    starts_us=excluded.starts_us, event_us=excluded.event_us, status_rank=excluded.status_rank
WHERE (excluded.starts_us, excluded.event_us, excluded.status_rank)
    > (alerts.starts_us, alerts.event_us, alerts.status_rank)
"""


@dataclass(frozen=True)
class CurrentAlert:
    """The latest state of one alert (rule and label set). Times are RFC 3339."""

    rule_id: str
    fingerprint: str
    status: str
    severity: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    ends_at: str | None
    alert_id: str
    values: dict[str, Any]
    event_ts: str
    rule_version: str
    updated_at: str
    #: the engine(s) that produced the current transition (see the module docstring)
    engine: str = UNKNOWN_ENGINE


#: CurrentAlert's fields: the ``alerts`` table's first columns, in order
_CURRENT = tuple(f.name for f in fields(CurrentAlert))
#: the fields stored as JSON text (``values`` in the column ``values_json``)
_AS_JSON = frozenset({"labels", "annotations", "values"})
_CURRENT_COLS = ", ".join("values_json" if name == "values" else name for name in _CURRENT)


@dataclass(frozen=True)
class Counts:
    """Current alerts counted by ``matrix[status][severity]``."""

    matrix: dict[str, dict[str, int]]

    @property
    def by_status(self) -> dict[str, int]:
        return {s: sum(row.values()) for s, row in self.matrix.items()}

    @property
    def by_severity(self) -> dict[str, int]:
        return dict(sum((Counter(row) for row in self.matrix.values()), Counter()))


def _utcnow() -> datetime:
    return datetime.now(tz=UTC)


class AlertStore(OperatorRecords):
    """One connection to the store at ``path``; see the module docstring.

    ``readonly=True`` never creates or changes anything and raises
    FileNotFoundError when the file does not exist yet.
    """

    def __init__(
        self, path: Path | str, readonly: bool = False, *, now: Callable[[], datetime] = _utcnow
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._now = now
        if readonly:
            self._conn = open_reader(self.path, "alert store")
            self._cols = current_columns(self._conn)
            return
        self._conn = open_writer(self.path)
        create_schema(self._conn, _SCHEMA)
        migrate(self._conn)
        self._cols = _CURRENT_COLS

    def apply(self, alert: Alert) -> bool:
        """Record one transition; True if its ``alert_id`` was new."""
        return self.apply_many([alert]) == 1

    def apply_many(self, alerts: Iterable[Alert]) -> int:
        """Record transitions in one durable transaction; return how many were new.

        Raises ValueError (before writing anything) if any alert has an
        unknown status or an unparseable time.
        """
        return self.apply_batch(alerts)

    def apply_batch(
        self,
        alerts: Iterable[Alert] = (),
        commands: Iterable[dict[str, Any]] = (),
        notifications: Iterable[dict[str, Any]] = (),
        offsets: dict[tuple[str, int], int] | None = None,
        engines: Sequence[str] | None = None,
    ) -> int:
        """Record transitions, validated commands, notification events and the consumed
        offsets in one durable transaction; return how many transitions were new.
        ``engines``: the engine of each alert, in order (None: all :data:`DEFAULT_ENGINE`);
        a known transition from another engine adds that engine to its row.
        Raises ValueError (writing nothing) for an alert with a bad status or time, or
        ``engines`` of another length than ``alerts``."""
        listed = list(alerts)
        if engines is None:
            engines = [DEFAULT_ENGINE] * len(listed)
        if len(engines) != len(listed):
            msg = f"{len(engines)} engines for {len(listed)} alerts"
            raise ValueError(msg)
        batch = [(a, order_key(a), e) for a, e in zip(listed, engines, strict=True)]
        cmds, events = list(commands), list(notifications)
        if not (batch or cmds or events or offsets):
            return 0
        stamp = self._now().isoformat()
        new = 0
        with transaction(self._conn):
            for cmd in cmds:
                self._command(cmd)
            for ev in events:
                self._notification(ev)
            for (topic, part), nxt in (offsets or {}).items():
                self._conn.execute("INSERT OR REPLACE INTO offsets VALUES (?,?,?)", (topic, part, nxt))
            for alert, (starts_us, event_us, rank), engine in batch:
                row = (alert.alert_id, alert.rule_id, alert.fingerprint, alert.status, alert.severity)
                cur = self._conn.execute(
                    "INSERT OR IGNORE INTO transitions VALUES (?,?,?,?,?,?,?,?,?)",
                    (*row, event_us, stamp, alert.to_json().decode(), engine),
                )
                if cur.rowcount == 0:
                    self._add_engine(alert, engine)
                    continue
                new += 1
                self._conn.execute(_UPSERT, (*_state(alert, stamp), engine, starts_us, event_us, rank))
        return new

    def _add_engine(self, alert: Alert, engine: str) -> None:
        """A known transition produced again by ``engine``: add it to the row's engines (and to
        the current alert's, when this transition is its current state)."""
        (known,) = self._conn.execute(
            "SELECT engine FROM transitions WHERE alert_id = ?", (alert.alert_id,)
        ).fetchone()
        merged = merge_engines(known, engine)
        if merged == known:
            return
        self._conn.execute("UPDATE transitions SET engine = ? WHERE alert_id = ?", (merged, alert.alert_id))
        self._conn.execute(
            "UPDATE alerts SET engine = ? WHERE rule_id = ? AND fingerprint = ? AND alert_id = ?",
            (merged, alert.rule_id, alert.fingerprint, alert.alert_id),
        )

    def engines_of(self, alert_ids: Iterable[str]) -> dict[str, str]:
        """The engine(s) of each of ``alert_ids`` that is recorded."""
        return dict(
            select_in(self._conn, "SELECT alert_id, engine FROM transitions WHERE alert_id IN", alert_ids)
        )

    def offsets(self) -> dict[tuple[str, int], int]:
        """The next offset to consume per (topic, partition), as kept with the data."""
        return {(t, p): n for t, p, n in self._conn.execute("SELECT topic, partition, next FROM offsets")}

    def find(self, ident: str) -> list[CurrentAlert]:
        """Current alerts whose fingerprint or alert id starts with ``ident`` (or whose
        transition history holds that alert id)."""
        like = ident.replace("%", "").replace("_", "") + "%"
        rows = self._conn.execute(
            f"SELECT {self._cols} FROM alerts WHERE fingerprint LIKE ? OR alert_id LIKE ? "  # noqa: S608
            "OR fingerprint IN (SELECT fingerprint FROM transitions WHERE alert_id LIKE ?) LIMIT 20",
            (like, like, like),
        ).fetchall()
        return [_current(r) for r in rows]

    def transitions_of(self, rule_id: str, fingerprint: str, limit: int = 100) -> list[Alert]:
        rows = self._conn.execute(
            "SELECT alert FROM transitions WHERE rule_id=? AND fingerprint=? "
            "ORDER BY event_us DESC, rowid DESC LIMIT ?",
            (rule_id, fingerprint, limit),
        ).fetchall()
        return [Alert.from_json(r[0]) for r in rows]

    def current(self, status: str | None = None, limit: int = 500) -> list[CurrentAlert]:
        """Current alerts, most recently started first; only ``status`` if given."""
        where, args = ("WHERE status = ?", [status]) if status else ("", [])
        rows = self._conn.execute(
            f"SELECT {self._cols} FROM alerts {where} ORDER BY starts_us DESC LIMIT ?",  # noqa: S608
            [*args, limit],
        ).fetchall()
        return [_current(r) for r in rows]

    def history(self, limit: int = 100, rule_id: str | None = None) -> list[Alert]:
        """Recorded transitions, newest event time first (ties: latest recorded first)."""
        where, args = ("WHERE rule_id = ?", [rule_id]) if rule_id else ("", [])
        rows = self._conn.execute(
            f"SELECT alert FROM transitions {where} ORDER BY event_us DESC, rowid DESC LIMIT ?",  # noqa: S608
            [*args, limit],
        ).fetchall()
        return [Alert.from_json(r[0]) for r in rows]

    def counts(self) -> Counts:
        """Current alerts counted by status and severity."""
        matrix: dict[str, dict[str, int]] = {}
        for status, severity, n in self._conn.execute(
            "SELECT status, severity, COUNT(*) FROM alerts GROUP BY status, severity"
        ):
            matrix.setdefault(status, {})[severity] = n
        return Counts(matrix)

    def close(self) -> None:
        """Close the connection. Idempotent."""
        self._conn.close()

    def __enter__(self) -> AlertStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def migrate(conn: sqlite3.Connection) -> None:
    """Bring a store written by an older version to :data:`SCHEMA_VERSION`, in one transaction:
    schema 2 -> 3 adds ``engine`` (default ``""``, unknown) to ``transitions`` and ``alerts``.
    A file of a newer schema than this build knows is refused with a ValueError."""
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version > SCHEMA_VERSION:
        msg = f"the alert store has schema {version}; this version reads up to {SCHEMA_VERSION}"
        raise ValueError(msg)
    with transaction(conn):
        for table in ("transitions", "alerts"):
            columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if "engine" not in columns:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN engine TEXT NOT NULL DEFAULT ''")
                logger.info("alert store: %s has an engine column now (older rows: unknown)", table)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def current_columns(conn: sqlite3.Connection) -> str:
    """What to select for a :class:`CurrentAlert`: a reader of a schema-2 file (not yet
    migrated by its writer) reads ``""`` (unknown) as the engine."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(alerts)")}
    return _CURRENT_COLS if "engine" in columns else _CURRENT_COLS.replace("engine", "'' AS engine")


def merge_engines(known: str, engine: str) -> str:
    """``known`` (comma-separated engine names, "" unknown) with ``engine`` added, sorted."""
    names = {n for n in known.split(",") if n} | ({engine} if engine else set())
    return ",".join(sorted(names))


def _state(a: Alert, stamp: str) -> tuple[Any, ...]:
    """The ``alerts`` row of ``a`` in column order up to ``updated_at``: without the engine
    and the ordering columns."""
    row = []
    for name in _CURRENT:
        if name == "engine":
            continue
        value = stamp if name == "updated_at" else getattr(a, name)
        row.append(_dumps(value) if name in _AS_JSON else value)
    return tuple(row)


def _current(row: tuple[Any, ...]) -> CurrentAlert:
    """The CurrentAlert of a row selected as ``_CURRENT_COLS``."""
    values = zip(_CURRENT, row, strict=True)
    return CurrentAlert(*(orjson.loads(value) if name in _AS_JSON else value for name, value in values))


def _dumps(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
