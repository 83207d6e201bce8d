"""The dispatcher's view of every alert: the latest transition per label fingerprint.

Inhibition needs the firing alerts, escalation and manual resolution need the
current state of one alert, and duplicates must be recognised. A transition
replaces the current one only when it is newer by the alert store's ordering
rule (``starts_at``, ``event_ts``, pending < firing < resolved), so replays
and reordered records never roll an alert back. Resolved and inactive
alerts are forgotten ``retention_s`` after they arrived.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from app.alerts import Alert, order_key
from app.dispatch.base import Table

logger = logging.getLogger(__name__)

Applied = Literal["new", "duplicate", "stale"]
#: Statuses that end an episode: a resolved alert, or a pending or no-data one that became inactive.
ENDED = ("resolved", "inactive")


@dataclass(frozen=True)
class Known:
    alert: Alert
    received_at: float


def _dump(k: Known) -> dict[str, Any]:
    return {"alert": k.alert.to_dict(), "received_at": k.received_at}


def _load(d: dict[str, Any]) -> Known:
    return Known(Alert.from_dict(d["alert"]), d["received_at"])


class AlertRegistry:
    """Latest transition per fingerprint; see the module docstring."""

    def __init__(self, retention_s: float = 86400.0) -> None:
        self.table: Table[Known] = Table("alerts", _dump, _load)
        self.retention_s = retention_s
        self.version = 0  # bumped on every change, so caches (inhibition) know when to rebuild

    def apply(self, alert: Alert, now: float) -> Applied:
        """Record ``alert``; ``duplicate`` if its id is the current one, ``stale`` if older.
        Raises ValueError for an alert whose times or status do not parse."""
        key = order_key(alert)
        cur = self.table.get(alert.fingerprint)
        if cur is not None:
            if cur.alert.alert_id == alert.alert_id:
                return "duplicate"
            if key <= order_key(cur.alert):
                return "stale"
        self.table.put(alert.fingerprint, Known(alert, now))
        self.version += 1
        return "new"

    def get(self, fingerprint: str) -> Alert | None:
        known = self.table.get(fingerprint)
        return None if known is None else known.alert

    def firing(self) -> list[Alert]:
        return [k.alert for k in self.table.values() if k.alert.status == "firing"]

    def prune(self, now: float) -> int:
        """Forget ended (resolved, inactive) alerts older than the retention; return how many."""
        old = [
            fp
            for fp, k in self.table.items()
            if k.alert.status in ENDED and now - k.received_at > self.retention_s
        ]
        for fp in old:
            self.table.delete(fp)
        return len(old)
