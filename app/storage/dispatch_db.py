"""The dispatcher's SQLite file (``$APP_DATA_DIR/dispatch.sqlite3``): state, offsets and the outbox.

Tables:

- ``state(ns, key, value)``: every :class:`~app.dispatch.base.Table` row (groups, nflog,
  silences, acks, escalations, flapping, storms, alert registry);
- ``offsets(topic, partition, next)``: the next offset to consume per input partition;
- ``outbox``: one row per notification (``pending``, ``delivered`` or ``dead``), with the
  body and message id fixed at enqueue time, attempts, next attempt time and last error;
- ``publish``: records waiting to be produced to Kafka (notification-log events, manual
  resolutions), in order, deleted once the broker acknowledged them.

:meth:`DispatchDB.commit` writes state changes, offsets, new outbox rows and
records to publish in one ``BEGIN IMMEDIATE`` transaction with
``synchronous=FULL``: after a crash the dispatcher resumes from exactly the
offsets whose effects it kept, so nothing is lost and nothing is decided twice.
One process owns the file (an exclusive ``flock`` on ``<file>.lock``);
readers (the CLI) open it read-only. A connection belongs to one thread.
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from app.dispatch.messages import OutboxMessage
from app.errors import ConfigError
from app.storage.sqlite import create_schema, open_reader, open_writer, transaction

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS state (ns TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (ns, key));
CREATE TABLE IF NOT EXISTS offsets (topic TEXT NOT NULL, partition INTEGER NOT NULL, next INTEGER NOT NULL,
    PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS outbox (msg_id TEXT PRIMARY KEY, receiver TEXT NOT NULL, group_key TEXT NOT NULL,
    created_at REAL NOT NULL, body BLOB NOT NULL, alert_ids TEXT NOT NULL, notice TEXT NOT NULL,
    status TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL,
    last_error TEXT NOT NULL DEFAULT '', done_at REAL);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (receiver, status, created_at);
CREATE TABLE IF NOT EXISTS publish (seq INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL,
    key BLOB, value BLOB NOT NULL);
"""
_ROW = (
    "msg_id, receiver, group_key, created_at, body, alert_ids, notice, status, attempts, next_at, last_error"
)


@dataclass(frozen=True)
class OutboxRow:
    """A stored outbox message with its delivery bookkeeping."""

    message: OutboxMessage
    status: str
    attempts: int
    next_at: float
    last_error: str


def _row(r: tuple[Any, ...]) -> OutboxRow:
    msg = OutboxMessage(r[0], r[1], r[2], r[3], bytes(r[4]), tuple(filter(None, r[5].split(","))), r[6])
    return OutboxRow(msg, r[7], r[8], r[9], r[10])


class DispatchDB:
    """See the module docstring. ``readonly=True`` takes no lock and writes nothing."""

    def __init__(self, path: Path | str, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self._lock: TextIO | None = None
        if readonly:
            self._conn = open_reader(self.path, "dispatcher state")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(f"{self.path}.lock", "w")  # held for the object's life
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            msg = f"{self.path} is in use by another dispatcher; run one dispatcher per data dir"
            raise ConfigError(msg) from None
        self.fresh = not self.path.exists()
        self._conn = open_writer(self.path)
        create_schema(self._conn, _SCHEMA)
        if not self.fresh:
            self.fresh = self._conn.execute("SELECT COUNT(*) FROM offsets").fetchone()[0] == 0

    def close(self) -> None:
        self._conn.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # -- state and offsets ---------------------------------------------------------------------
    def load(self, ns: str) -> list[tuple[str, bytes]]:
        return [
            (k, bytes(v)) for k, v in self._conn.execute("SELECT key, value FROM state WHERE ns=?", (ns,))
        ]

    def offsets(self) -> dict[tuple[str, int], int]:
        return {(t, p): n for t, p, n in self._conn.execute("SELECT topic, partition, next FROM offsets")}

    def commit(
        self,
        changes: Iterable[tuple[str, str, bytes | None]],
        offsets: dict[tuple[str, int], int],
        outbox: Iterable[OutboxMessage] = (),
        publish: Iterable[tuple[str, bytes | None, bytes]] = (),
    ) -> None:
        """One durable transaction: state ``(ns, key, json|None)``, offsets, outbox rows, records."""
        with transaction(self._conn):
            for ns, key, value in changes:
                if value is None:
                    self._conn.execute("DELETE FROM state WHERE ns=? AND key=?", (ns, key))
                else:
                    self._conn.execute("INSERT OR REPLACE INTO state VALUES (?,?,?)", (ns, key, value))
            self._conn.executemany(
                "INSERT OR REPLACE INTO offsets VALUES (?,?,?)", [(t, p, n) for (t, p), n in offsets.items()]
            )
            self._conn.executemany(
                "INSERT OR IGNORE INTO outbox (msg_id, receiver, group_key, created_at, body, alert_ids,"
                " notice, status, next_at) VALUES (?,?,?,?,?,?,?,'pending',?)",
                [(m.msg_id, m.receiver, m.group_key, m.created_at, m.body, ",".join(m.alert_ids), m.notice,
                  m.created_at) for m in outbox],
            )  # fmt: skip
            self._conn.executemany("INSERT INTO publish (topic, key, value) VALUES (?,?,?)", list(publish))

    # -- outbox --------------------------------------------------------------------------------
    def next_pending(self, receiver: str) -> OutboxRow | None:
        """The oldest pending message of ``receiver`` (FIFO per receiver), due or not."""
        r = self._conn.execute(
            f"SELECT {_ROW} FROM outbox WHERE receiver=? AND status='pending' "  # noqa: S608
            "ORDER BY created_at, rowid LIMIT 1",
            (receiver,),
        ).fetchone()
        return None if r is None else _row(r)

    def finish(
        self,
        msg_id: str,
        status: str,
        now: float,
        error: str = "",
        publish: Iterable[tuple[str, bytes | None, bytes]] = (),
    ) -> None:
        """Mark a message ``delivered`` or ``dead`` and queue its log event, in one transaction."""
        with transaction(self._conn):
            self._conn.execute(
                "UPDATE outbox SET status=?, done_at=?, attempts=attempts+1, last_error=? WHERE msg_id=?",
                (status, now, error, msg_id),
            )
            self._conn.executemany("INSERT INTO publish (topic, key, value) VALUES (?,?,?)", list(publish))

    def reschedule(self, msg_id: str, next_at: float, error: str) -> None:
        with transaction(self._conn):
            self._conn.execute(
                "UPDATE outbox SET attempts=attempts+1, next_at=?, last_error=? WHERE msg_id=?",
                (next_at, error, msg_id),
            )

    def outbox(self, status: str | None = None, limit: int = 100) -> list[OutboxRow]:
        """Messages newest first, optionally of one status (``dead`` lists the dead letters)."""
        where, args = ("WHERE status=?", [status]) if status else ("", [])
        rows = self._conn.execute(
            f"SELECT {_ROW} FROM outbox {where} ORDER BY created_at DESC, rowid DESC LIMIT ?",  # noqa: S608
            [*args, limit],
        )
        return [_row(r) for r in rows]

    def counts(self) -> dict[str, int]:
        return dict(self._conn.execute("SELECT status, COUNT(*) FROM outbox GROUP BY status").fetchall())

    def prune_delivered(self, before: float) -> int:
        with transaction(self._conn):
            cur = self._conn.execute("DELETE FROM outbox WHERE status='delivered' AND done_at < ?", (before,))
        return cur.rowcount

    # -- records to publish --------------------------------------------------------------------
    def to_publish(self, limit: int = 500) -> list[tuple[int, str, bytes | None, bytes]]:
        rows = self._conn.execute("SELECT seq, topic, key, value FROM publish ORDER BY seq LIMIT ?", (limit,))
        return [(s, t, None if k is None else bytes(k), bytes(v)) for s, t, k, v in rows]

    def published(self, up_to_seq: int) -> None:
        with transaction(self._conn):
            self._conn.execute("DELETE FROM publish WHERE seq <= ?", (up_to_seq,))

    def retarget(self, topic: str, to: str, convert: Callable[[bytes], bytes]) -> int:
        """Move the records queued for ``topic`` to ``to``, each value through ``convert``, in
        their place in the queue; how many."""
        with transaction(self._conn):
            rows = self._conn.execute("SELECT seq, value FROM publish WHERE topic = ?", (topic,)).fetchall()
            for seq, value in rows:
                self._conn.execute(
                    "UPDATE publish SET topic = ?, value = ? WHERE seq = ?", (to, convert(bytes(value)), seq)
                )
        return len(rows)
