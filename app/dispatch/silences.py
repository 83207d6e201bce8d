"""Silences: matchers, a start, an end, a creator and a comment; they mute matching alerts.

A silence is active from ``starts_at`` (inclusive) to ``ends_at`` (exclusive),
in the dispatcher's clock; ``unsilence`` ends it early. It mutes an alert
when every matcher matches the alert's labels as notified (with
``alertname`` and ``severity``). Silences come from the commands topic,
which is their source of truth; expired ones are kept ``retention_s`` for
the record, then forgotten.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from app.alerts import Alert
from app.dispatch.base import Table
from app.dispatch.matchers import Matcher, matches_all, parse_matchers
from app.notify.payload import alert_labels

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Silence:
    """One silence. Times are epoch seconds."""

    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    created_by: str
    comment: str

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "matchers": [str(m) for m in self.matchers],
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "created_by": self.created_by,
            "comment": self.comment,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Silence:
        return cls(
            d["id"],
            parse_matchers(d["matchers"]),
            d["starts_at"],
            d["ends_at"],
            d["created_by"],
            d["comment"],
        )


class Silencer:
    """The set of silences; a Muter."""

    def __init__(self, retention_s: float = 7 * 86400.0) -> None:
        self.table: Table[Silence] = Table("silences", Silence.to_dict, Silence.from_dict)
        self.retention_s = retention_s

    def add(self, silence: Silence) -> None:
        """Add or replace (same id) a silence."""
        self.table.put(silence.id, silence)

    def expire(self, silence_id: str, at: float) -> bool:
        """End a silence at ``at`` (if it ends later); False if unknown."""
        s = self.table.get(silence_id)
        if s is None:
            return False
        if s.ends_at > at:
            self.table.put(silence_id, replace(s, ends_at=max(at, s.starts_at)))
        return True

    def mutes(self, alert: Alert, now: float) -> bool:
        return self.silenced_by(alert, now) is not None

    def silenced_by(self, alert: Alert, now: float) -> str | None:
        """The id of an active silence matching ``alert``, or None."""
        labels = alert_labels(alert)
        for s in self.table.values():
            if s.active(now) and matches_all(s.matchers, labels):
                return s.id
        return None

    def prune(self, now: float) -> None:
        for key, s in self.table.items():
            if now - s.ends_at > self.retention_s:
                self.table.delete(key)
