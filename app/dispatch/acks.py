"""Acknowledgements, and escalation of firing alerts nobody acknowledged in time.

An ack names an alert (fingerprint) and optionally one episode
(``starts_at``); without an episode it covers every episode until it is
cleared. While acked, an alert's *firing* notifications (repeats included)
are muted; its resolution is still sent.

Escalation: when a route with ``escalate: {after, to}`` first notifies a
firing alert, an escalation is armed for ``now + after``. When it comes due
and the alert is still firing in the same episode, unacked and not muted,
receiver ``to`` is notified (once per episode); when that alert later
resolves, ``to`` gets the resolution too. Acks and resolutions disarm it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from app.alerts import Alert
from app.dispatch.base import Table

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ack:
    fingerprint: str
    starts_at: str  # "" = every episode
    by: str
    comment: str
    at: float

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ack:
        return cls(**d)


class Acks:
    """The acks in force; a Muter of firing alerts."""

    def __init__(self) -> None:
        self.table: Table[Ack] = Table("acks", asdict, Ack.from_dict)

    def add(self, ack: Ack) -> None:
        self.table.put(f"{ack.fingerprint}|{ack.starts_at}", ack)

    def acked(self, alert: Alert) -> Ack | None:
        return self.table.get(f"{alert.fingerprint}|{alert.starts_at}") or self.table.get(
            f"{alert.fingerprint}|"
        )

    def mutes(self, alert: Alert, now: float) -> bool:
        return alert.status == "firing" and self.acked(alert) is not None

    def forget_episode(self, alert: Alert) -> None:
        """Drop the episode ack of a resolved alert (episode-less acks stay)."""
        self.table.delete(f"{alert.fingerprint}|{alert.starts_at}")


@dataclass(frozen=True)
class Escalation:
    route_key: str
    fingerprint: str
    starts_at: str
    due: float
    to: str
    sent: bool = False

    @property
    def key(self) -> str:
        return f"{self.route_key}|{self.fingerprint}"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Escalation:
        return cls(**d)


class Escalations:
    """Armed and sent escalations, keyed by route and fingerprint."""

    def __init__(self) -> None:
        self.table: Table[Escalation] = Table("escalations", asdict, Escalation.from_dict)

    def arm(self, route_key: str, alert: Alert, after: float, to: str, now: float) -> bool:
        """Arm for this episode unless already armed or sent for it; True if armed now."""
        esc = Escalation(route_key, alert.fingerprint, alert.starts_at, now + after, to)
        cur = self.table.get(esc.key)
        if cur is not None and cur.starts_at == alert.starts_at:
            return False
        self.table.put(esc.key, esc)
        return True

    def due(self, now: float) -> list[Escalation]:
        return sorted((e for e in self.table.values() if not e.sent and e.due <= now), key=lambda e: e.due)

    def next_timer(self) -> float | None:
        return min((e.due for e in self.table.values() if not e.sent), default=None)

    def mark_sent(self, esc: Escalation) -> None:
        self.table.put(esc.key, Escalation(**{**asdict(esc), "sent": True}))

    def drop(self, esc: Escalation) -> None:
        self.table.delete(esc.key)

    def for_alert(self, fingerprint: str) -> list[Escalation]:
        return [e for e in self.table.values() if e.fingerprint == fingerprint]
