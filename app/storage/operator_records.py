"""Operator records in the alert store: commands, acks, silences and notifications.

A mixin of :class:`app.storage.alert_store.AlertStore` (which owns the connection and the
schema): the write helpers run inside the store's batch transaction, the
queries serve the CLI and the dashboard. Commands are recorded once per
``cmd_id``; a notification's row only moves forward (queued, then delivered
or dead), so replayed or reordered events never roll it back.
"""

from __future__ import annotations

import logging
import sqlite3
from datetime import UTC, datetime
from typing import Any

import orjson

logger = logging.getLogger(__name__)

_NOTIFY_RANK = {"queued": 0, "delivered": 1, "dead": 1}


def _dumps(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _instant(value: str) -> datetime:
    ts = datetime.fromisoformat(value)
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


class OperatorRecords:
    """Needs ``self._conn``; see the module docstring."""

    _conn: sqlite3.Connection

    def _command(self, cmd: dict[str, Any]) -> None:
        cur = self._conn.execute(
            "INSERT OR IGNORE INTO commands VALUES (?,?,?,?)",
            (cmd["cmd_id"], cmd["type"], cmd["at"], _dumps(cmd)),
        )
        if cur.rowcount == 0:
            return
        kind = cmd["type"]
        if kind == "ack":
            self._conn.execute(
                "INSERT OR REPLACE INTO acks VALUES (?,?,?,?,?)",
                (cmd["fingerprint"], cmd.get("starts_at", ""), cmd.get("by", ""), cmd.get("comment", ""),
                 cmd["at"]),
            )  # fmt: skip
        elif kind == "silence":
            self._conn.execute(
                "INSERT OR REPLACE INTO silences VALUES (?,?,?,?,?,?,NULL)",
                (cmd["silence_id"], _dumps(cmd["matchers"]), cmd["starts_at"], cmd["ends_at"],
                 cmd.get("by", ""), cmd.get("comment", "")),
            )  # fmt: skip
        elif kind == "unsilence":
            self._conn.execute(
                "UPDATE silences SET ends_at = MIN(ends_at, ?), ended_by = ? WHERE id = ?",
                (cmd["at"], cmd.get("by", ""), cmd["silence_id"]),
            )

    def _notification(self, ev: dict[str, Any]) -> None:
        status = ev.get("event")
        if status not in _NOTIFY_RANK or "msg_id" not in ev:
            return
        row = self._conn.execute(
            "SELECT status FROM notifications WHERE msg_id=?", (ev["msg_id"],)
        ).fetchone()
        if row is not None and _NOTIFY_RANK[row[0]] >= _NOTIFY_RANK[status]:
            return
        self._conn.execute(
            "INSERT OR REPLACE INTO notifications VALUES (?,?,?,?,?,?,?,?,?,?)",
            (ev["msg_id"], ev.get("receiver", ""), ev.get("group_key", ""), ev.get("notice", ""), status,
             ",".join(ev.get("alert_ids", [])), ev.get("queued_at", ev.get("at", 0.0)), ev.get("at", 0.0),
             ev.get("attempts", 0), ev.get("reason", "")),
        )  # fmt: skip

    def acks(self) -> list[dict[str, Any]]:
        cols = ("fingerprint", "starts_at", "by", "comment", "at")
        return [
            dict(zip(cols, r, strict=True))
            for r in self._conn.execute(f"SELECT {', '.join(cols)} FROM acks")  # noqa: S608
        ]

    def silences(self, active_at: str | None = None) -> list[dict[str, Any]]:
        """Silences, newest end first; only those active at ``active_at`` (RFC 3339) if given."""
        cols = ("id", "matchers", "starts_at", "ends_at", "created_by", "comment", "ended_by")
        rows = [dict(zip(cols, r, strict=True)) for r in self._conn.execute(
            f"SELECT {', '.join(cols)} FROM silences ORDER BY ends_at DESC")]  # fmt: skip  # noqa: S608
        for r in rows:
            r["matchers"] = orjson.loads(r["matchers"])
        if active_at is not None:
            at = _instant(active_at)
            rows = [r for r in rows if _instant(r["starts_at"]) <= at < _instant(r["ends_at"])]
        return rows

    def notifications(
        self, status: str | None = None, alert_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Notifications, latest change first; ``status="dead"`` is the dead-letter list."""
        cols = ("msg_id", "receiver", "group_key", "notice", "status", "alert_ids", "queued_at", "updated_at",
                "attempts", "reason")  # fmt: skip
        where, args = [], []
        if status:
            where.append("status = ?")
            args.append(status)
        if alert_id:
            where.append("alert_ids LIKE ?")
            args.append(f"%{alert_id}%")
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._conn.execute(
            f"SELECT {', '.join(cols)} FROM notifications {clause} ORDER BY updated_at DESC LIMIT ?",  # noqa: S608
            [*args, limit],
        )
        out = [dict(zip(cols, r, strict=True)) for r in rows]
        for r in out:
            r["alert_ids"] = [a for a in r["alert_ids"].split(",") if a]
        return out
