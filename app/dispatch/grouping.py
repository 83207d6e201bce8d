"""Aggregation groups: alerts of one route with equal group labels, flushed on timers.

As in Alertmanager, per group and in the dispatcher's clock:

- a new group waits ``group_wait`` before its first flush, to batch alerts
  that start together;
- after every flush the next one is ``group_interval`` later, whatever it
  sent (the notification log decides whether a flush notifies at all, and
  ``repeat_interval`` is checked there);
- after a flush, resolved alerts that have not changed since are removed,
  and an empty group is deleted.

Alertmanager also flushes at once when an alert's ``startsAt`` is older than
``group_wait``; ours are event times (a replay may be years old), so that
rule is not applied. A group holds the latest transition per fingerprint.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.alerts import Alert, order_key
from app.dispatch.base import Table
from app.dispatch.routes import Route

logger = logging.getLogger(__name__)


@dataclass
class Group:
    """One aggregation group. Mutated in place; call ``Groups.table.touch`` after."""

    key: str
    route_key: str
    receiver: str
    labels: dict[str, str]
    next_flush: float
    alerts: dict[str, Alert] = field(default_factory=dict)
    flushes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "route_key": self.route_key, "receiver": self.receiver, "labels": self.labels,
            "next_flush": self.next_flush, "flushes": self.flushes,
            "alerts": {fp: a.to_dict() for fp, a in self.alerts.items()},
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Group:
        alerts = {fp: Alert.from_dict(a) for fp, a in d["alerts"].items()}
        return cls(
            d["key"], d["route_key"], d["receiver"], d["labels"], d["next_flush"], alerts, d["flushes"]
        )


class Groups:
    """All aggregation groups, keyed by group key (which includes the route key)."""

    def __init__(self) -> None:
        self.table: Table[Group] = Table("groups", Group.to_dict, Group.from_dict)

    def insert(self, route: Route, alert: Alert, now: float) -> Group:
        """Put ``alert`` in its group on ``route`` (creating the group); an older
        transition than the one held is ignored."""
        key = route.group_key(alert.labels)
        group = self.table.get(key)
        if group is None:
            group = Group(
                key, route.key, route.receiver, route.group_labels(alert.labels), now + route.group_wait
            )
        held = group.alerts.get(alert.fingerprint)
        if held is None or order_key(alert) > order_key(held):
            group.alerts[alert.fingerprint] = alert
        self.table.put(key, group)
        return group

    def due(self, now: float) -> list[Group]:
        """Groups whose flush time has come, oldest deadline first."""
        return sorted((g for g in self.table.values() if g.next_flush <= now), key=lambda g: g.next_flush)

    def next_timer(self) -> float | None:
        return min((g.next_flush for g in self.table.values()), default=None)

    def flushed(self, group: Group, sent: Sequence[Alert], route: Route | None, now: float) -> None:
        """After a flush of ``sent``: drop unchanged resolved alerts, re-arm or delete."""
        for a in sent:
            held = group.alerts.get(a.fingerprint)
            if held is not None and held.status == "resolved" and held.alert_id == a.alert_id:
                del group.alerts[a.fingerprint]
        group.flushes += 1
        if not group.alerts or route is None:
            self.table.delete(group.key)
            return
        group.next_flush = now + route.group_interval
        self.table.put(group.key, group)
