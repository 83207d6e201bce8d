"""Flapping detection: an alert that changes state too often is muted, with one notice instead.

A state change is a firing <-> resolved transition of one alert (label
fingerprint), measured in event time so a fast replay flaps exactly as the
live system would. When ``changes`` or more of them fall within ``window``,
the alert starts flapping: the Dispatcher mutes its own notifications and
routes one *flapping notice* instead, a synthetic firing alert with the
alert's labels plus ``flapping="true"``.

It stops flapping once it has been stable for ``window``: either a change
arrives at least ``window`` (event time) after the previous one, or
``window`` passes on the dispatcher's clock without any change (an alert
that went quiet). The notice then resolves and the alert's current state is
notified normally again by its group.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from app.alerts import Alert
from app.dispatch.base import Table, iso, parse_iso
from app.dispatch.config import FlappingConfig
from app.rules.durations import format_duration

logger = logging.getLogger(__name__)

FLAPPING_LABEL = "flapping"
Change = Literal["started", "stopped"]


@dataclass
class FlapState:
    """Per fingerprint: event times (s) of recent changes, the last status, and the notice if flapping."""

    status: str
    changes: list[float] = field(default_factory=list)
    received_at: float = 0.0
    notice: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "changes": self.changes, "received_at": self.received_at,
                "notice": self.notice}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FlapState:
        return cls(d["status"], d["changes"], d["received_at"], d["notice"])


def is_notice(alert: Alert) -> bool:
    return alert.labels.get(FLAPPING_LABEL) == "true"


class FlapDetector:
    """A Muter for flapping alerts, and the source of flapping notices."""

    def __init__(self, config: FlappingConfig) -> None:
        self.config = config
        self.table: Table[FlapState] = Table("flapping", FlapState.to_dict, FlapState.from_dict)

    def mutes(self, alert: Alert, now: float) -> bool:
        st = self.table.get(alert.fingerprint)
        return st is not None and st.notice is not None and not is_notice(alert)

    def observe(self, alert: Alert, now: float) -> Alert | None:
        """Account for a transition; return a notice (firing or resolved) when flapping starts or stops."""
        if self.config.changes == 0 or alert.status not in ("firing", "resolved") or is_notice(alert):
            return None
        fp, ts = alert.fingerprint, parse_iso(alert.event_ts)
        st = self.table.get(fp)
        if st is None:
            self.table.put(fp, FlapState(alert.status, [], now))
            return None
        if st.status == alert.status:
            return None
        window = self.config.window
        out: Alert | None = None
        if st.notice is not None and st.changes and ts - st.changes[-1] >= window:
            out = self._stop(st, alert.event_ts)
        st.status, st.received_at = alert.status, now
        st.changes = [t for t in st.changes if t > ts - window] + [ts]
        if st.notice is None and len(st.changes) >= self.config.changes:
            out = self._start(st, alert)
        self.table.put(fp, st)
        return out

    def due(self, now: float) -> list[Alert]:
        """Resolved notices of alerts that have been quiet for ``window`` on the clock."""
        out = []
        for fp, st in self.table.items():
            if st.notice is not None and now - st.received_at >= self.config.window:
                out.append(self._stop(st, iso(now)))
                self.table.put(fp, st)
        return out

    def next_timer(self) -> float | None:
        times = [st.received_at + self.config.window for st in self.table.values() if st.notice is not None]
        return min(times, default=None)

    def prune(self, now: float) -> None:
        """Forget stable alerts with no change for ``window``."""
        for fp, st in self.table.items():
            if st.notice is None and now - st.received_at > 2 * self.config.window:
                self.table.delete(fp)

    def _start(self, st: FlapState, alert: Alert) -> Alert:
        n, window = len(st.changes), format_duration(int(self.config.window * 1000))
        name = alert.labels.get("alertname", alert.rule_id)
        notice = Alert.build(
            rule_id=alert.rule_id,
            rule_version=alert.rule_version,
            status="firing",
            severity=alert.severity,
            labels={**alert.labels, FLAPPING_LABEL: "true"},
            annotations={
                "summary": f"{name} is flapping: {n} state changes within {window}",
                "description": f"Its notifications are suppressed until it is stable for {window}.",
            },
            starts_at=iso(st.changes[0]),
            ends_at=None,
            source=alert.source,
            event_ts=alert.event_ts,
            values={"state_changes": n},
        )
        st.notice = notice.to_dict()
        logger.warning("alert %s (%s) is flapping: %d changes within %s", alert.fingerprint, name, n, window)
        return notice

    def _stop(self, st: FlapState, at: str) -> Alert:
        assert st.notice is not None  # noqa: S101 - callers check
        firing = Alert.from_dict(st.notice)
        st.notice = None
        st.changes = []
        at = max(at, firing.event_ts, key=parse_iso)  # clock time may lie before event time
        return Alert.build(
            rule_id=firing.rule_id,
            rule_version=firing.rule_version,
            status="resolved",
            severity=firing.severity,
            labels=firing.labels,
            annotations={**firing.annotations, "description": "The alert is stable again."},
            starts_at=firing.starts_at,
            ends_at=at,
            source=firing.source,
            event_ts=at,
            values=firing.values,
        )
