"""Event-time order (``order: event_time``) for threshold, change and sequence rules.

These kinds' state machines (``for``, ``consecutive``, pending and firing; a
field's previous value; the steps of a sequence) depend on the order of a group's
events, so by default they take them as they arrive and skip one older than the
newest they have seen. A source written out of order (a merged access log: 94 % of
the real one's lines are older than an earlier line) then loses most of its events.

With ``order: event_time`` the rule runs on the **watermark's time axis**: each
event waits in the group's state until the watermark W (the partition clock minus
``allowed_lateness``) passes it; the rule's own logic (built with no lateness of its
own) then takes the waiting events in event-time order (arrival order among equal
times), and its timers (``keep_firing_for``, ``no_data``, ``resolve_after``, an
absent step, forgetting) run when W passes them, each before the first released
event at or after its time, as they would in the stream sorted by time. Alerts come
``allowed_lateness`` later in processing time; their times, values and ids are
those of the sorted stream.

An event already behind W when it arrives is evaluated at once if nothing newer was
evaluated for its group, and is late otherwise. The evaluator runs a rule's due
timers before each event, so every waiting event W has passed is released before a
newer one is looked at.

State (:class:`~app.rules.state.OrderedState`): ``queue`` the waiting ``[ts, row]``
pairs in order, ``inner`` the logic's own state (or None), ``newest`` the time of the
newest event evaluated, ``due`` when W reaches the
first waiting event or the logic's own timer. Both engines run this code (the
Spark engine on its stream path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from app.alerts import Alert
from app.events import Event
from app.rules.loader import CompiledRule
from app.rules.logic.base import LATE, ON_TIME, Logic, Result, State, StateStore, after


class _Inner:
    """The wrapped logic's view of its state: ``inner`` inside the reordering state."""

    __slots__ = ("st",)

    def __init__(self, st: State) -> None:
        self.st = st

    def get(self, _key: str) -> State | None:
        inner: State | None = self.st["inner"]
        return inner

    def put(self, _key: str, value: State) -> None:
        self.st["inner"] = value

    def delete(self, _key: str) -> None:
        self.st["inner"] = None


#: most timer runs of the wrapped logic at one instant (each must move its timer on)
MAX_TIMER_RUNS = 10_000


class EventTimeOrder(Logic):
    """A rule fed its group's events in event-time order (see the module)."""

    def __init__(self, rule: CompiledRule, make: Callable[[CompiledRule], Logic | None]) -> None:
        super().__init__(rule)
        self.lateness = rule.rule.allowed_lateness
        # the wrapped logic lives on the watermark's axis: no lateness of its own
        plain = rule.rule.model_copy(update={"allowed_lateness": 0, "order": "arrival"})
        inner = make(dataclasses.replace(rule, rule=plain))
        if inner is None:
            msg = f"rule {rule.id}: order: event_time needs a stateful kind"
            raise ValueError(msg)
        self.inner: Logic = inner

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any],
        clock_ms: int = 0,
    ) -> Result:  # fmt: skip
        st = store.get(key)
        existed = st is not None
        if st is None:
            st = {"group": list(group), "queue": [], "inner": None, "newest": None}
        newest = st["newest"]
        if newest is not None and ev.ts_ms < newest:
            return [], LATE  # a newer event of the group was evaluated already
        watermark = clock_ms - self.lateness
        if ev.ts_ms <= watermark:  # the watermark passed it: its turn is now
            alerts = self._evaluate(st, key, group, ev.ts_ms, row, watermark)
        else:
            queue = st["queue"]
            queue.insert(after(queue, ev.ts_ms), [ev.ts_ms, dict(row)])
            alerts = []
        self._save(store, key, st, existed)
        return alerts, ON_TIME

    def forget_memory(self) -> None:
        self.inner.forget_memory()

    def on_timer(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        st = store.get(key)
        if st is None:
            return []
        watermark = clock_ms - self.lateness
        group = tuple(st["group"])
        queue = st["queue"]
        alerts: list[Alert] = []
        taken = 0
        while taken < len(queue) and queue[taken][0] <= watermark:
            ts, row = queue[taken]
            taken += 1
            alerts += self._evaluate(st, key, group, ts, row, ts)
        st["queue"] = queue[taken:]
        alerts += self._timers(st, key, watermark)
        self._save(store, key, st, existed=True)
        return alerts

    def _timers(self, st: State, key: str, clock: int) -> list[Alert]:
        """The wrapped logic's timers due at ``clock`` (on the watermark's axis)."""
        alerts: list[Alert] = []
        inner = _Inner(st)
        for _ in range(MAX_TIMER_RUNS):
            due = None if st["inner"] is None else st["inner"].get("due")
            if due is None or due > clock:
                break
            alerts += self.inner.on_timer(inner, key, clock)
            if st["inner"] is not None and st["inner"].get("due") == due:
                break  # the timer did not move: it would run again forever
        return alerts

    def _evaluate(
        self, st: State, key: str, group: tuple[str, ...], ts: int, row: Mapping[str, Any], clock: int
    ) -> list[Alert]:
        """One event through the wrapped logic at ``clock``, after its timers due by then."""
        alerts = self._timers(st, key, clock)
        inner = _Inner(st)
        ev = Event("", ts, dict(row))
        found, _late = self.inner.on_event(inner, key, group, ev, ev.fields, clock)
        st["newest"] = ts
        return alerts + found

    def _save(self, store: StateStore, key: str, st: State, existed: bool) -> None:
        queue = st["queue"]
        if not queue and st["inner"] is None:  # nothing waits and the logic keeps nothing: quiet
            if existed:
                store.delete(key)
            return
        times = [queue[0][0]] if queue else []
        inner_due = None if st["inner"] is None else st["inner"].get("due")
        if inner_due is not None:
            times.append(int(inner_due))
        st["due"] = min(times) + self.lateness if times else None
        store.put(key, st)
