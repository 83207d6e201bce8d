"""Event-time order for threshold rules (``order: event_time``).

A threshold's lifecycle (``for``, ``consecutive``, pending, firing, resolved) depends
on the order of its group's events, so by default it takes them as they arrive and
skips one older than the newest it has seen. A source written out of order (a merged
access log: 94 % of the real one's lines are older than an earlier line) then loses
most of its events. With ``order: event_time`` each event waits in the group's state
until the partition's watermark (clock minus ``allowed_lateness``) passes it, and the
threshold then takes the waiting events in event-time order (arrival order among
equal times). Alerts come ``allowed_lateness`` later in processing time; their event
times, values and ids are those of the ordered stream.

An event already behind the watermark when it arrives is evaluated at once if nothing
newer was evaluated for its group, and is late otherwise. The evaluator runs a rule's
due timers before each event, so every waiting event the watermark has passed is
released before a newer one is looked at.

State: ``q`` the waiting ``[ts, row]`` pairs in order, ``s`` the threshold's own
state (or None), ``t`` the time of the newest event evaluated, ``due`` when the
watermark passes the first waiting event. Both engines run this code (the Spark
engine on its stream path).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.alerts import Alert
from app.events import Event
from app.rules.loader import CompiledRule
from app.rules.logic.base import Result, State, StateStore, after
from app.rules.logic.threshold import ThresholdLogic


class _Inner:
    """The threshold's view of its state: ``s`` inside the reordering state."""

    __slots__ = ("st",)

    def __init__(self, st: State) -> None:
        self.st = st

    def get(self, _key: str) -> State | None:
        inner: State | None = self.st["s"]
        return inner

    def put(self, _key: str, value: State) -> None:
        self.st["s"] = value

    def delete(self, _key: str) -> None:
        self.st["s"] = None


class EventTimeOrder:
    """A threshold rule fed its group's events in event-time order (see the module)."""

    def __init__(self, rule: CompiledRule) -> None:
        self.rule = rule
        self.inner = ThresholdLogic(rule)
        self.lateness = rule.rule.allowed_lateness

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any],
        clock_ms: int = 0,
    ) -> Result:  # fmt: skip
        st = store.get(key)
        existed = st is not None
        if st is None:
            st = {"g": list(group), "q": [], "s": None, "t": None}
        newest = st["t"]
        if newest is not None and ev.ts_ms < newest:
            return [], True  # a newer event of the group was evaluated already
        if ev.ts_ms <= clock_ms - self.lateness:  # the watermark passed it: its turn is now
            alerts = self._evaluate(st, key, group, [(ev.ts_ms, row)])
        else:
            queue = st["q"]
            queue.insert(after(queue, ev.ts_ms), [ev.ts_ms, dict(row)])
            alerts = []
        self._save(store, key, st, existed)
        return alerts, False

    def on_clock(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        st = store.get(key)
        if st is None or not st["q"]:
            return []
        queue = st["q"]
        ready = after(queue, clock_ms - self.lateness)
        if not ready:
            return []
        st["q"] = queue[ready:]
        alerts = self._evaluate(st, key, tuple(st["g"]), queue[:ready])
        self._save(store, key, st, existed=True)
        return alerts

    def _evaluate(self, st: State, key: str, group: tuple[str, ...], events: Any) -> list[Alert]:
        """The threshold over ``events`` (``(ts, row)`` in order), on its own state."""
        inner = _Inner(st)
        alerts: list[Alert] = []
        for ts, row in events:
            found, _late = self.inner.on_event(inner, key, group, Event("", ts, row), row)
            alerts += found
            st["t"] = ts
        return alerts

    def _save(self, store: StateStore, key: str, st: State, existed: bool) -> None:
        queue = st["q"]
        if not queue and st["s"] is None:  # nothing waits and the threshold keeps nothing: quiet
            if existed:
                store.delete(key)
            return
        st["due"] = queue[0][0] + self.lateness if queue else None
        store.put(key, st)
