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

Concurrency: WAL mode; one writer process and any number of readers in
other processes (``readonly=True``). Writes run in ``BEGIN IMMEDIATE``
transactions with ``synchronous=FULL``, so once :meth:`AlertStore.apply_many`
returns the batch survives a crash and a power loss. A connection belongs to
the thread that opened it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from app.alerts import Alert, order_key
from app.storage.operator_records import OperatorRecords
from app.storage.sqlite import create_schema, open_reader, open_writer, transaction

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS transitions (
    alert_id TEXT PRIMARY KEY, rule_id TEXT NOT NULL, fingerprint TEXT NOT NULL,
    status TEXT NOT NULL, severity TEXT NOT NULL, event_us INTEGER NOT NULL,
    recorded_at TEXT NOT NULL, alert TEXT NOT NULL);
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
    PRIMARY KEY (rule_id, fingerprint));
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
INSERT INTO alerts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
ON CONFLICT (rule_id, fingerprint) DO UPDATE SET
    status=excluded.status, severity=excluded.severity, labels=excluded.labels,
    annotations=excluded.annotations, starts_at=excluded.starts_at, ends_at=excluded.ends_at,
    alert_id=excluded.alert_id, values_json=excluded.values_json, event_ts=excluded.event_ts,
    rule_version=excluded.rule_version, updated_at=excluded.updated_at,
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
            return
        self._conn = open_writer(self.path)
        create_schema(self._conn, f"{_SCHEMA};PRAGMA user_version={SCHEMA_VERSION}")

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
    ) -> int:
        """Record transitions, validated commands, notification events and the consumed
        offsets in one durable transaction; return how many transitions were new.
        Raises ValueError (writing nothing) for an alert with a bad status or time."""
        batch = [(a, order_key(a)) for a in alerts]
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
            for alert, (starts_us, event_us, rank) in batch:
                row = (alert.alert_id, alert.rule_id, alert.fingerprint, alert.status, alert.severity)
                cur = self._conn.execute(
                    "INSERT OR IGNORE INTO transitions VALUES (?,?,?,?,?,?,?,?)",
                    (*row, event_us, stamp, alert.to_json().decode()),
                )
                if cur.rowcount == 0:
                    continue
                new += 1
                self._conn.execute(_UPSERT, (*_state(alert, stamp), starts_us, event_us, rank))
        return new

    def offsets(self) -> dict[tuple[str, int], int]:
        """The next offset to consume per (topic, partition), as kept with the data."""
        return {(t, p): n for t, p, n in self._conn.execute("SELECT topic, partition, next FROM offsets")}

    def find(self, ident: str) -> list[CurrentAlert]:
        """Current alerts whose fingerprint or alert id starts with ``ident`` (or whose
        transition history holds that alert id)."""
        like = ident.replace("%", "").replace("_", "") + "%"
        rows = self._conn.execute(
            f"SELECT {_CURRENT_COLS} FROM alerts WHERE fingerprint LIKE ? OR alert_id LIKE ? "  # noqa: S608
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
            f"SELECT {_CURRENT_COLS} FROM alerts {where} ORDER BY starts_us DESC LIMIT ?",  # noqa: S608
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


def _state(a: Alert, stamp: str) -> tuple[Any, ...]:
    """The ``alerts`` row of ``a`` in column order, without the ordering columns."""
    row = []
    for name in _CURRENT:
        value = stamp if name == "updated_at" else getattr(a, name)
        row.append(_dumps(value) if name in _AS_JSON else value)
    return tuple(row)


def _current(row: tuple[Any, ...]) -> CurrentAlert:
    """The CurrentAlert of a row selected as ``_CURRENT_COLS``."""
    values = zip(_CURRENT, row, strict=True)
    return CurrentAlert(*(orjson.loads(value) if name in _AS_JSON else value for name, value in values))


def _dumps(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
