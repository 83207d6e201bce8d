"""Absence, change, new term and sequence rules.

* **Absence** (``absent_for: T``): a group fires when the partition clock
  minus ``allowed_lateness`` passes its last event + T (``starts_at`` = that
  instant) and resolves on its next event. With ``expect_from: devices``,
  registry keys never seen start their wait when the evaluator first learns
  of them.
* **Change** (``change: field``): an event alert when the field's value
  differs from the group's previous non-NULL value.
* **New term** (``new_term: {field, horizon}``): an event alert when a
  value was not seen in the group within ``horizon``; the first ``horizon``
  after a group's first event only learns, so the start of the history does
  not flag every value as new. Order-insensitive: an out-of-order event is
  still a sighting.
* **Sequence**: steps in order within ``within`` of the first step's first
  event (other events in between are ignored); a final ``absent: true`` step
  fires when ``within`` passes without it. A group that is neither firing nor
  waiting for an absent step is forgotten once the partition clock has moved
  ``within`` + ``allowed_lateness`` past where it stood at the group's last
  event: an event that could still continue its sequence, or that it would
  skip as older than its last, is then more than ``allowed_lateness`` behind
  the clock. (A rule grouped by client IP would otherwise keep a state for
  every address it ever saw.) Such an event, arriving after, counts as a new
  group's first.

Event alerts resolve ``resolve_after`` after their last trigger. For change
and sequence rules, order matters: late events (older than the newest one
seen for the rule and group) are skipped. Absence and new term use them
(an old event does not move ``last`` back).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.alerts import Alert
from app.events import Event
from app.rules.expr import Columns
from app.rules.lifecycle import OneShot
from app.rules.loader import CompiledRule
from app.rules.logic.base import (
    GATE_ALWAYS,
    ON_TIME,
    Logic,
    Result,
    State,
    StateStore,
    build_alert,
    group_row,
    scattered_events,
)

MAX_TERMS = 100_000


class AbsenceLogic(Logic):
    def __init__(self, rule: CompiledRule) -> None:
        super().__init__(rule)
        self.where_gate = GATE_ALWAYS  # on_event returns first when where is not TRUE
        self.folds_runs = self.folds_scattered = True
        self.expects_registry = rule.rule.expect_from is not None
        self.absent_ms = int(rule.rule.absent_for or 0)
        self.lateness = rule.rule.allowed_lateness

    def expect(self, store: StateStore, key: str, group: tuple[str, ...], since_ms: int) -> None:
        """Start waiting for a key known from the registry but never seen."""
        if store.get(key) is None:
            store.put(
                key,
                {
                    "group": list(group),
                    "last_event": since_ms,
                    "firing_since": None,
                    "due": self._due(since_ms),
                },
            )

    def _due(self, last: int) -> int:
        """Silence must last longer than ``absent_for``: an event exactly at the deadline is on time."""
        return last + self.absent_ms + self.lateness + 1

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any],
        clock_ms: int = 0,
    ) -> Result:  # fmt: skip
        if self.rule.where is not None and self.rule.where(row) is not True:
            return [], ON_TIME
        st = store.get(key)
        alerts: list[Alert] = []
        if st is not None and st["firing_since"] is not None and ev.ts_ms >= st["firing_since"]:
            values = {"silent_since": st["last_event"]}
            alerts.append(
                build_alert(self.rule, "resolved", group, row, st["firing_since"], ev.ts_ms, ev.ts_ms, values)
            )
            st["firing_since"] = None
        if st is not None and ev.ts_ms <= st["last_event"] and not alerts:
            return [], ON_TIME  # an old event: nothing moves
        last = max(ev.ts_ms, st["last_event"]) if st is not None else ev.ts_ms
        fire = st["firing_since"] if st is not None else None
        # still firing: this event is older than the silence's start (it arrived behind
        # the partition clock); the silence ends with the first event at or after it
        due = None if fire is not None else self._due(last)
        store.put(key, {"group": list(group), "last_event": last, "firing_since": fire, "due": due})
        return alerts, ON_TIME

    def fold_many(
        self, store: StateStore, key: str, group: tuple[str, ...], events: list[Event],
        rows: list[Any], clocks: list[int], passes: list[Any] | None,
        begin: int, end: int, _columns: Columns,
    ) -> int:  # fmt: skip
        """The run ``[begin, end)`` of one group's events while it is not silent (see
        ``Logic.fold_many``): only the newest event time counts, so the run is one write.
        It stops before the event whose clock reaches the silence deadline, where the
        timer must run first."""
        st = store.get(key)
        if st is not None and st["firing_since"] is not None:
            return 0  # silent: the first event resolves it, one by one
        last = None if st is None else st["last_event"]
        due = None if last is None else self._due(last)
        j = begin
        while j < end:
            if due is not None and clocks[j] >= due:
                break
            ts = events[j].ts_ms
            if (passes is None or passes[j] is True) and (last is None or ts > last):
                last = ts
                due = self._due(last)
            j += 1
        if last is not None and (st is None or last != st["last_event"]):
            store.put(key, {"group": list(group), "last_event": last, "firing_since": None, "due": due})
        return j - begin

    def fold_scattered(
        self, store: StateStore, rule_id: str, keys: list[tuple[tuple[str, ...], str] | None],
        events: list[Event], rows: list[Any], clocks: list[int],
        passes: list[Any] | None, begin: int, end: int,
    ) -> int:  # fmt: skip
        """From ``begin``, the leading events of ``[begin, end)``, of any groups, that find
        their group known and not silent (see ``Logic.fold_scattered``): each moves the
        group's last time and silence deadline later, as ``on_event`` would. The timer
        already set stays: :meth:`on_timer` at that time finds the group not silent yet
        and the evaluator re-arms it at the state's ``due``."""
        get, put = store.get, store.put
        for j, key, group in scattered_events(keys, passes, store, rule_id, begin, end):
            st = get(key)
            if st is None or st["firing_since"] is not None:
                return j - begin  # a new group (a timer to set) or a silent one (to resolve): on_event
            ts = events[j].ts_ms
            if ts > st["last_event"]:
                put(key, {"group": list(group), "last_event": ts, "firing_since": None, "due": self._due(ts)})
        return end - begin

    def on_timer(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        st = store.get(key)
        if st is None or st["firing_since"] is not None or clock_ms < self._due(st["last_event"]):
            return []
        group = tuple(st["group"])
        start = st["last_event"] + self.absent_ms
        st["firing_since"], st["due"] = start, None
        store.put(key, st)
        values = {"silent_since": st["last_event"]}
        return [
            build_alert(self.rule, "firing", group, group_row(self.rule, group), start, None, start, values)
        ]


class _EventAlert(Logic):
    def __init__(self, rule: CompiledRule) -> None:
        super().__init__(rule)
        self.oneshot = OneShot(rule)

    def _state(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event
    ) -> tuple[State | None, bool]:
        st = store.get(key)
        if st is not None and ev.ts_ms < st["last_event"]:
            return st, True
        return st or {"group": list(group), "last_event": ev.ts_ms, "firing_since": None}, False

    def _save(self, store: StateStore, key: str, st: State) -> None:
        st["due"] = OneShot.due(st)
        store.put(key, st)

    def on_timer(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        st = store.get(key)
        if st is None:
            return []
        alerts = self.oneshot.expire(st, tuple(st["group"]), clock_ms)
        if alerts:
            self._save(store, key, st)
        return alerts


class ChangeLogic(_EventAlert):
    def __init__(self, rule: CompiledRule) -> None:
        super().__init__(rule)
        self.where_gate = GATE_ALWAYS
        self.field = str(rule.rule.change)

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any],
        clock_ms: int = 0,
    ) -> Result:  # fmt: skip
        if self.rule.where is not None and self.rule.where(row) is not True:
            return [], ON_TIME
        st, late = self._state(store, key, group, ev)
        if late or st is None:
            return [], late
        value = row.get(self.field)
        if value is None:
            return [], ON_TIME
        previous = st.get("previous_value")
        st["last_event"], st["previous_value"] = ev.ts_ms, value
        alerts: list[Alert] = []
        if previous is not None and previous != value:
            values = {self.field: value, "previous": previous}
            alerts = self.oneshot.trigger(st, group, row, ev.ts_ms, ev.ts_ms, values)
        if alerts or previous != value:
            self._save(store, key, st)
        return alerts, ON_TIME


class NewTermLogic(_EventAlert):
    def __init__(self, rule: CompiledRule) -> None:
        super().__init__(rule)
        self.where_gate = GATE_ALWAYS
        assert rule.rule.new_term is not None  # noqa: S101
        self.field = rule.rule.new_term.field
        self.horizon = rule.rule.new_term.horizon

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any],
        clock_ms: int = 0,
    ) -> Result:  # fmt: skip
        if self.rule.where is not None and self.rule.where(row) is not True:
            return [], ON_TIME
        st = store.get(key) or {"group": list(group), "last_event": ev.ts_ms, "firing_since": None}
        value = row.get(self.field)
        if value is None:
            return [], ON_TIME
        term = str(value)
        terms: dict[str, int] = st.setdefault("terms", {})
        first = st.setdefault("first_event", ev.ts_ms)
        seen = terms.get(term)
        st["last_event"] = max(st["last_event"], ev.ts_ms)
        alerts: list[Alert] = []
        learning = ev.ts_ms < first + self.horizon
        if not learning and (seen is None or ev.ts_ms - seen > self.horizon):
            alerts = self.oneshot.trigger(st, group, row, ev.ts_ms, ev.ts_ms, {self.field: value})
        terms[term] = max(ev.ts_ms, seen or ev.ts_ms)
        if seen is None and (len(terms) > MAX_TERMS or len(terms) % 1000 == 0):
            # a new term made it 1,000 more (or over the cap): drop those beyond the horizon, and
            # beyond the cap the least recent (a group that stays at a multiple of 1,000 terms
            # used to re-sort them at every event)
            cutoff = ev.ts_ms - self.horizon
            kept = {t: s for t, s in terms.items() if s >= cutoff}
            if len(kept) > MAX_TERMS:  # the most recent 90 %: the next sort is 10,000 new terms away
                kept = dict(sorted(kept.items(), key=lambda x: -x[1])[: MAX_TERMS * 9 // 10])
            st["terms"] = kept
        self._save(store, key, st)
        return alerts, ON_TIME


class SequenceLogic(_EventAlert):
    """State (:class:`~app.rules.state.SequenceState`): ``step`` (the step under way),
    ``step_matches`` (its matches so far), ``first_event`` (the first step's first event
    time), ``last_event``, ``clock_at_last`` (the partition clock at the
    last event) and the one-shot alert's keys."""

    def __init__(self, rule: CompiledRule) -> None:
        super().__init__(rule)
        assert rule.parts is not None  # noqa: S101
        self.steps = rule.rule.sequence
        self.conds = rule.parts.steps
        self.within = int(rule.rule.within or 0)
        self.negative = self.steps[-1].absent
        #: a group neither firing nor waiting is forgotten when the clock has moved this far
        self.forget_ms = self.within + rule.rule.allowed_lateness

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any],
        clock_ms: int = 0,
    ) -> Result:  # fmt: skip
        st, late = self._state(store, key, group, ev)
        if late or st is None:
            return [], late
        st["last_event"], st["clock_at_last"] = ev.ts_ms, max(clock_ms, ev.ts_ms)
        step, count, first = st.get("step", 0), st.get("step_matches", 0), st.get("first_event")
        if first is not None and ev.ts_ms - first > self.within:
            step, count, first = 0, 0, None  # too slow: start over
        alerts: list[Alert] = []
        waiting = self.negative and step == len(self.steps) - 1
        if waiting:
            if self.conds[-1](row) is True:
                step, count, first = 0, 0, None  # it did follow in time: no alert
        elif self.conds[step](row) is True:
            if step == 0 and count == 0:
                first = ev.ts_ms
            count += 1
            if count >= self.steps[step].times:
                step, count = step + 1, 0
            if step == len(self.steps):  # every (positive) step completed
                values = {"steps": ",".join(s.name for s in self.steps), "first_at": first}
                alerts = self.oneshot.trigger(st, group, row, int(first or ev.ts_ms), ev.ts_ms, values)
                step, count, first = 0, 0, None
        st.update(step=step, step_matches=count, first_event=first)
        # a group's forget timer stays where it is: on_timer moves it on, so an event
        # does not push a timer of its own
        st["due"] = self._due(st) or st.get("due") or st["clock_at_last"] + self.forget_ms
        store.put(key, st)
        return alerts, ON_TIME

    def _waiting(self, st: State) -> bool:
        return self.negative and st.get("step") == len(self.steps) - 1 and st.get("first_event") is not None

    def _due(self, st: State) -> int | None:
        """The resolution of a firing alert or the deadline of an absent step, the sooner."""
        times = [d] if (d := OneShot.due(st)) is not None else []
        if self._waiting(st):
            times.append(st["first_event"] + self.within)
        return min(times) if times else None

    def on_timer(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        st = store.get(key)
        if st is None:
            return []
        group = tuple(st["group"])
        alerts = self.oneshot.expire(st, group, clock_ms)
        if self._waiting(st):
            deadline = st["first_event"] + self.within
            if clock_ms >= deadline:
                values = {"missing": self.steps[-1].name, "first_at": st["first_event"]}
                row = group_row(self.rule, group)
                alerts += self.oneshot.trigger(st, group, row, st["first_event"], deadline, values)
                st.update(step=0, step_matches=0, first_event=None)
        due = self._due(st)
        if due is None:  # neither firing nor waiting: forget the group once nothing on time can match
            seen = st.get("clock_at_last")
            due = int(st["last_event"] if seen is None else seen) + self.forget_ms
            if clock_ms >= due:
                store.delete(key)
                return alerts
        st["due"] = due
        store.put(key, st)
        return alerts
