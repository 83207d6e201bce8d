"""The notification log: what each receiver was last told about each group, for dedup.

One entry per ``(group key, receiver)``: the alert ids notified as firing and
as resolved, when, and a sequence number that grows with every notification
(it goes into the message id, so a repeat of the same alerts is a new
message while a retry of one message keeps its id). :func:`needs_update` is
Alertmanager's DedupStage decision, on alert ids instead of fingerprints so
that a new episode of the same alert counts as new.

The log is persisted with the rest of the dispatcher state and also
published (as ``queued``/``absorbed`` events on the ``notifications``
topic), which is how it is rebuilt when the state file is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.dispatch.base import Table

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    firing: frozenset[str]
    resolved: frozenset[str]
    at: float
    seq: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "firing": sorted(self.firing),
            "resolved": sorted(self.resolved),
            "at": self.at,
            "seq": self.seq,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Entry:
        return cls(frozenset(d["firing"]), frozenset(d["resolved"]), d["at"], d["seq"])


def needs_update(
    entry: Entry | None,
    firing: Collection[str],
    resolved: Collection[str],
    *,
    repeat_s: float,
    send_resolved: bool,
    now: float,
) -> bool:
    """Whether a group with these firing/resolved alert ids must be notified now.

    New firing ids always notify; "everything resolved" notifies when the
    receiver was last told about firing alerts (even without send_resolved, so
    the log forgets them); new resolved ids notify with send_resolved;
    otherwise only a repeat after ``repeat_s`` does. A group never notified
    is notified only if something fires.
    """
    if entry is None:
        return len(firing) > 0
    if not set(firing) <= entry.firing:
        return True
    if not firing:
        return len(entry.firing) > 0
    if send_resolved and not set(resolved) <= entry.resolved:
        return True
    return entry.at <= now - repeat_s


def why_not(
    entry: Entry | None,
    firing: Collection[str],
    resolved: Collection[str],
    *,
    repeat_s: float,
    send_resolved: bool,
) -> str:
    """Why :func:`needs_update` said no, for the log: what the receiver was last told."""
    if entry is None:
        return "nothing is firing, and the receiver was never told about this group"
    told = f"notification {entry.seq} at {_when(entry.at)}"
    if not firing:
        return f"everything is resolved and the receiver has heard nothing firing since ({told})"
    if not send_resolved and not set(resolved) <= entry.resolved:
        return f"the firing alerts were already sent ({told}); the receiver does not take resolutions"
    return (
        f"the firing alerts were already sent ({told}); they repeat after repeat_interval {repeat_s:g}s, "
        f"at {_when(entry.at + repeat_s)}"
    )


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def log_key(group_key: str, receiver: str) -> str:
    return f"{group_key}|{receiver}"


class NotificationLog:
    """Entries by ``log_key``; pruned after ``retention_s`` (Alertmanager keeps 120 h)."""

    def __init__(self, retention_s: float = 120 * 3600.0) -> None:
        self.table: Table[Entry] = Table("nflog", Entry.to_dict, Entry.from_dict)
        self.retention_s = retention_s

    def get(self, key: str) -> Entry | None:
        return self.table.get(key)

    def record(self, key: str, firing: Collection[str], resolved: Collection[str], now: float) -> Entry:
        """Store a notification and return the new entry (its ``seq`` is the previous + 1)."""
        prev = self.table.get(key)
        entry = Entry(frozenset(firing), frozenset(resolved), now, (prev.seq if prev else 0) + 1)
        self.table.put(key, entry)
        return entry

    def restore_entry(self, key: str, entry: Entry) -> None:
        """Adopt an entry read back from the log topic if it is newer than ours."""
        prev = self.table.get(key)
        if prev is None or entry.seq > prev.seq:
            self.table.put(key, entry)

    def prune(self, now: float) -> None:
        for key, e in self.table.items():
            if now - e.at > self.retention_s:
                self.table.delete(key)
