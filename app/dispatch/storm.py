"""Storm control: more than N alerts a minute on one route collapse into one incident notice.

Every firing transition that enters a route with ``storm_threshold: N`` (N > 0)
is counted over a sliding ``window`` (60 s) of the dispatcher's clock. When
the count exceeds N the route is *storming*: one incident notice (a
synthetic ``AlertStorm`` alert, firing) goes straight to the route's
receiver, and every flush of the route's groups is absorbed (recorded in the
notification log, so nothing floods out afterwards) instead of sent. When a
whole window has passed since the storm began and the count is back at or
below N, the storm ends: the notice resolves, carrying how many alerts were
collapsed, and the route notifies normally again. Counting is paused while
the dispatcher rebuilds its state from the topics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from app.alerts import Alert
from app.dispatch.base import Table, iso
from app.dispatch.routes import Route

logger = logging.getLogger(__name__)

STORM_ALERTNAME = "AlertStorm"


@dataclass
class StormState:
    hits: list[float] = field(default_factory=list)
    since: float | None = None
    absorbed: int = 0
    peak: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"hits": self.hits, "since": self.since, "absorbed": self.absorbed, "peak": self.peak}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StormState:
        return cls(d["hits"], d["since"], d["absorbed"], d["peak"])


class StormControl:
    """Per-route alert rates and storm state."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.table: Table[StormState] = Table("storms", StormState.to_dict, StormState.from_dict)

    def observe(self, route: Route, now: float) -> Alert | None:
        """Count one firing alert on ``route``; return the firing notice if a storm starts."""
        if route.storm_threshold <= 0:
            return None
        st = self.table.get(route.key) or StormState()
        st.hits = [t for t in st.hits if t > now - self.window_s] + [now]
        st.peak = max(st.peak, len(st.hits)) if st.since is not None else len(st.hits)
        notice = None
        if st.since is None and len(st.hits) > route.storm_threshold:
            st.since, st.absorbed, st.peak = now, 0, len(st.hits)
            notice = storm_notice(route, st, "firing", now)
            logger.warning(
                "alert storm on route %s: %d alerts within %.0fs", route.name, len(st.hits), self.window_s
            )
        if len(st.hits) > route.storm_threshold + 1:
            st.hits = st.hits[-(route.storm_threshold + 1) :]  # enough to know we are above N
        self.table.put(route.key, st)
        return notice

    def active(self, route_key: str) -> bool:
        st = self.table.get(route_key)
        return st is not None and st.since is not None

    def absorb(self, route_key: str, count: int) -> None:
        st = self.table.get(route_key)
        if st is not None:
            st.absorbed += count
            self.table.put(route_key, st)

    def due(self, routes: dict[str, Route], now: float) -> list[tuple[Route, Alert]]:
        """Storms that are over, with their resolved notices."""
        out = []
        for key, st in self.table.items():
            route = routes.get(key)
            if st.since is None:
                if not st.hits or st.hits[-1] <= now - self.window_s:
                    self.table.delete(key)
                continue
            recent = [t for t in st.hits if t > now - self.window_s]
            if route is None or (now - st.since >= self.window_s and len(recent) <= route.storm_threshold):
                if route is not None:
                    out.append((route, storm_notice(route, st, "resolved", now)))
                    logger.warning(
                        "alert storm on route %s is over: %d alerts collapsed", route.name, st.absorbed
                    )
                self.table.put(key, StormState(hits=recent))
        return out

    def next_timer(self) -> float | None:
        times = [st.since + self.window_s for st in self.table.values() if st.since is not None]
        return min(times, default=None)


def storm_notice(route: Route, st: StormState, status: str, now: float) -> Alert:
    """The incident notice of the storm ``st`` on ``route`` (firing or resolved)."""
    assert st.since is not None  # noqa: S101 - only for active storms
    return Alert.build(
        rule_id="alert-storm",
        rule_version="1",
        status=status,  # type: ignore[arg-type]
        severity="critical",
        labels={
            "alertname": STORM_ALERTNAME,
            "severity": "critical",
            "route": route.name,
            "receiver": route.receiver,
        },
        annotations={
            "summary": f"Alert storm on route {route.name}: over {route.storm_threshold} alerts a minute",
            "description": "Individual notifications on this route are collapsed into this notice "
            "until the rate falls back.",
        },
        starts_at=iso(st.since),
        ends_at=iso(now) if status == "resolved" else None,
        source="dispatcher",
        event_ts=iso(now),
        values={"alerts_in_window": st.peak, "threshold": route.storm_threshold, "collapsed": st.absorbed},
    )
