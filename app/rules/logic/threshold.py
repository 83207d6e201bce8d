"""Threshold rules: ``where`` with ``for``, ``consecutive``, ``keep_firing_for`` and ``clear``.

Per group, in event time:

* the condition holds on an event: the streak starts (``streak_since``) or grows;
  once it has held for ``consecutive`` events and for ``for`` (event time
  since the streak began), the alert fires with ``starts_at = streak_since``
  (:func:`app.rules.lifecycle.match`);
* while firing, the alert resolves on the first event where ``clear`` is
  TRUE (hysteresis) or, without ``clear``, where the condition is not TRUE;
  with ``keep_firing_for`` it stays firing that much longer and resolves at
  ``cleared + keep_firing_for`` unless the condition returns first.
* **pending**: when a streak starts and does not fire at once (``for`` or
  ``consecutive`` not met yet), a ``pending`` transition (``starts_at =
  since``) is emitted; if the condition stops being TRUE before the alert
  fires, the episode ends with an ``inactive`` transition (``ends_at`` = that
  event), as Prometheus drops a pending alert without a resolution. A rule
  without ``for`` and ``consecutive`` fires at once and never pends.
* **no data** (``no_data: {after, state}``): once the partition clock minus
  ``allowed_lateness`` passes the group's last event + ``after`` (silence
  longer than ``after``, measured as absence rules do), the group goes to
  ``state`` at ``D = last + after``: ``no_data`` ends a pending episode
  (``inactive``) and opens a ``no_data`` episode (``starts_at = D``) that
  ends with ``inactive`` at the group's next event; ``alerting`` fires
  (``starts_at`` = the pending streak's start, else ``D``); ``ok`` resolves a
  firing alert (``ends_at = D``) or ends a pending one; ``keep`` changes
  nothing. Missing data never ends a firing alert except with ``ok``. Events
  not newer than ``D`` that arrive after it are late.

Late events (older than the newest event seen for the rule and group) are
skipped. ``pct_change`` columns are computed here, per group, before the
condition runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.alerts import Alert
from app.events import Event
from app.rules import baselines
from app.rules.compile import PctChange
from app.rules.expr import Columns
from app.rules.lifecycle import FIRES, PENDS, match, reset, started
from app.rules.loader import CompiledRule
from app.rules.logic.base import (
    GATE_NO_STATE,
    GATE_NONE,
    LATE,
    ON_TIME,
    Logic,
    Result,
    State,
    StateStore,
    after,
    build_alert,
    group_row,
    leading_not_true,
)


def pct_value(hist: list[list[Any]], pc: PctChange, ts: int, value: Any) -> float | None:
    """Percent change of ``value`` against the newest entry at least the lookback older."""
    if value is None:
        return None
    i = after(hist, ts - pc.lookback_ms) - 1
    if i < 0:
        return None
    old = hist[i][1]
    if old is None or old == 0:
        return None
    return float((value - old) / abs(old) * 100.0)


def remember(hist: list[list[Any]], pc: PctChange, ts: int, value: Any) -> list[list[Any]]:
    """Add (ts, value), in place, and drop entries no future lookup can need. Events come in
    time order (older ones are skipped as late), so ``hist`` stays sorted; the dropped entries
    go in bulk, once they are half of it, so a busy group does not shift its whole lookback
    at every event."""
    if value is not None:
        hist.append([ts, value])
    drop = after(hist, ts - pc.lookback_ms) - 1  # keep the newest one before
    if drop > 0 and drop * 2 >= len(hist):
        del hist[:drop]
    return hist


class ThresholdLogic(Logic):
    def __init__(self, rule: CompiledRule) -> None:
        super().__init__(rule)
        self.folds_runs = True
        r = rule.rule
        self.for_ms = r.for_ms
        self.consecutive = r.consecutive
        self.keep_ms = r.keep_firing_for
        self.clear = rule.parts.clear if rule.parts else None
        self.pct = rule.parts.pct_changes if rule.parts else ()
        #: baseline calls (app.rules.baselines): their state lives beside pct_change's, in "pct_history"
        self.baselines = rule.parts.baselines if rule.parts else ()
        self.columns = sorted((rule.where.columns | rule.where.synthetic) if rule.where else ())
        self.no_data = r.no_data if r.no_data is not None and r.no_data.state != "keep" else None
        self.lateness = r.allowed_lateness
        assert rule.where is not None  # noqa: S101 - threshold rules always have one
        self.where = rule.where.fn
        #: a quiet group (no state) stays quiet on an event where the condition is not TRUE,
        #: unless pct_change history or a no-data deadline must be kept for it
        self.where_gate = (
            GATE_NO_STATE if not self.pct and not self.baselines and self.no_data is None else GATE_NONE
        )

    def _with_pct(
        self, st: State | None, ev: Event, row: Mapping[str, Any]
    ) -> tuple[Mapping[str, Any], dict]:
        hist = st.get("pct_history", {}) if st else {}  # updated in place: the event is stored either way
        if not self.pct and not self.baselines:
            return row, hist
        extra = {}
        for pc in self.pct:
            h = hist.get(pc.column)
            if h is None:
                h = hist[pc.column] = []
            value = row.get(pc.field)
            extra[pc.column] = pct_value(h, pc, ev.ts_ms, value)
            remember(h, pc, ev.ts_ms, value)
        if self.baselines:
            extra.update(baselines.advance(self.baselines, hist, ev.ts_ms, row))
        return {**row, **extra}, hist

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any],
        clock_ms: int = 0,
    ) -> Result:  # fmt: skip
        st = store.get(key)
        if st is not None and (ev.ts_ms < st["last_event"] or ev.ts_ms <= (st.get("no_data_since") or -1)):
            return [], LATE
        hist: dict | None = None
        if self.pct or self.baselines:
            row, hist = self._with_pct(st, ev, row)
        holds = self.where(row) is True
        if st is None:
            if not holds and not hist and self.no_data is None:
                return [], ON_TIME  # nothing to remember for a quiet key
            st = {
                "streak": 0,
                "streak_since": None,
                "firing_since": None,
                "last_event": ev.ts_ms,
                "group": list(group),
            }
        changed = hist is not None or self.no_data is not None  # the no-data deadline moves with last
        st["last_event"] = ev.ts_ms
        if hist is not None:
            st["pct_history"] = hist
        if (
            holds
            and self.no_data is None
            and st["firing_since"] is not None
            and st.get("keep_firing_until") is None
        ):
            if self.clear is None or self.clear(row) is not True:
                st["streak"] += 1  # still firing, nothing else changes (the common case)
                if changed:
                    store.put(key, st)
                return [], ON_TIME
        if (
            not holds
            and st["firing_since"] is None
            and not st["streak"]
            and not changed
            and st.get("no_data_since") is None
        ):
            return [], ON_TIME  # quiet and still quiet: nothing to emit, store or re-arm (the common case)
        alerts: list[Alert] = []
        if st.get("no_data_since") is not None:  # data is back: the no-data episode ends
            alerts.append(
                build_alert(self.rule, "inactive", group, row, st["no_data_since"], ev.ts_ms, ev.ts_ms, {})
            )
            st["no_data_since"] = None
        if (
            st["firing_since"] is not None
            and st.get("keep_firing_until") is not None
            and ev.ts_ms >= st["keep_firing_until"]
        ):
            # kept firing long enough: it ended at kf, before this event
            alerts.append(self._resolve(st, group, row, st["keep_firing_until"], self._values(row)))
            changed = True
        if st["firing_since"] is not None:
            cleared = (self.clear(row) is True) if self.clear is not None else not holds
            if st.get("keep_firing_until") is not None:
                if holds:  # the condition came back before kf: keep firing
                    st["keep_firing_until"], changed = None, True
            elif not cleared:
                pass
            elif self.keep_ms:
                st["keep_firing_until"], changed = ev.ts_ms + self.keep_ms, True
            else:
                alerts.append(self._resolve(st, group, row, ev.ts_ms, self._values(row)))
                changed = True
            if holds and st["firing_since"] is not None:
                st["streak"] += 1
        elif holds:
            found = match(st, ev.ts_ms, ev.ts_ms, self.consecutive, self.for_ms)
            changed = changed or st["streak"] <= self.consecutive or found == FIRES
            if found == FIRES:
                values = self._values(row)
                alerts.append(
                    build_alert(self.rule, "firing", group, row, st["streak_since"], None, ev.ts_ms, values)
                )
            elif found == PENDS:
                values = self._values(row)
                alerts.append(build_alert(self.rule, "pending", group, row, ev.ts_ms, None, ev.ts_ms, values))
        elif st["streak"]:
            alerts.append(self._end_pending(st, group, row, ev.ts_ms, self._values(row)))
            changed = True
        st["due"] = self._due(st)
        if changed:
            store.put(key, st)
        return alerts, ON_TIME

    def fold_many(
        self, store: StateStore, key: str, group: tuple[str, ...], events: list[Event],
        rows: list[Any], clocks: list[int], passes: list[Any] | None,
        begin: int, end: int, _columns: Columns,
    ) -> int:  # fmt: skip
        """The common cases of the run ``[begin, end)`` of one group's events, in one go:
        the leading events that keep a firing group firing, a pending one pending or a
        quiet one quiet (what :meth:`on_event` does for them, without a call per event).
        ``rows``: the events' rows; ``passes``: the condition on each. Returns how many
        it took (0: none, nothing changed).
        """
        if self.pct or self.baselines or self.no_data is not None or passes is None:
            return 0
        clear = self.clear
        st = store.get(key)
        if st is None:  # a quiet group with no state: it stays so while the condition does not hold
            return leading_not_true(passes, begin, end)
        j = begin
        last = st["last_event"]
        if (
            st["firing_since"] is not None and st.get("keep_firing_until") is None
        ):  # firing: stays firing while it holds
            while j < end:
                ts = events[j].ts_ms
                if ts < last or ts < 0 or passes[j] is not True:
                    break
                if clear is not None and clear(rows[j]) is True:
                    break
                last = ts
                j += 1
            st["streak"] += j - begin
        elif (
            st["firing_since"] is None and not st["streak"] and st.get("no_data_since") is None
        ):  # quiet, with state
            while j < end:
                ts = events[j].ts_ms
                if ts < last or ts < 0 or passes[j] is True:
                    break
                last = ts
                j += 1
        elif (
            st["firing_since"] is None and st.get("no_data_since") is None
        ):  # pending: stays so until ready or broken
            n, since, write = st["streak"], st["streak_since"], False
            while j < end:
                ts = events[j].ts_ms
                if ts < last or ts < 0 or passes[j] is not True:
                    break
                if n + 1 >= self.consecutive and ts - since >= self.for_ms:
                    break  # it fires: on_event raises the alert
                n += 1
                write = write or n <= self.consecutive  # as on_event: the streak's count is kept
                last = ts
                j += 1
            st["streak"] = n
            if write:
                st["last_event"] = last
                store.put(key, st)
        st["last_event"] = last
        return j - begin

    def _values(self, row: Mapping[str, Any]) -> dict[str, Any]:
        values = {c: row.get(c) for c in self.columns}
        if self.pct:
            values["pct_change"] = row.get(self.pct[0].column)
        return values

    def _resolve(
        self, st: State, group: tuple[str, ...], row: Mapping[str, Any], at: int, values: dict
    ) -> Alert:
        began = started(st)
        reset(st)
        st["keep_firing_until"] = None
        return build_alert(self.rule, "resolved", group, row, began, at, at, values)

    def _end_pending(
        self, st: State, group: tuple[str, ...], row: Mapping[str, Any], at: int, values: Mapping[str, Any]
    ) -> Alert:
        """The streak broke before firing: its pending episode ends, never notified."""
        began = started(st)
        reset(st)
        return build_alert(self.rule, "inactive", group, row, began, at, at, values)

    def _no_data_due(self, st: State) -> int | None:
        """When the partition clock declares the group silent (None: nothing would change)."""
        nd = self.no_data
        if nd is None or st.get("no_data_since") is not None:
            return None
        firing = st["firing_since"] is not None
        if nd.state == "ok" and not firing and not st["streak"]:
            return None
        if nd.state != "ok" and firing:
            return None
        return int(st["last_event"]) + nd.after + self.lateness + 1

    def _due(self, st: State) -> int | None:
        kf = st.get("keep_firing_until") if st["firing_since"] is not None else None
        nd = self._no_data_due(st)
        return nd if kf is None else kf if nd is None else min(kf, nd)

    def _go_no_data(self, st: State, group: tuple[str, ...]) -> list[Alert]:
        assert self.no_data is not None  # noqa: S101 - only scheduled with a no_data option
        at = int(st["last_event"]) + self.no_data.after
        row = group_row(self.rule, group)
        values = {"no_data": True, "silent_since": st["last_event"]}
        state = self.no_data.state
        if state == "alerting":
            start = st["streak_since"] if st["streak"] else at
            st["firing_since"], st["keep_firing_until"] = start, None
            return [build_alert(self.rule, "firing", group, row, start, None, at, values)]
        if state == "ok" and st["firing_since"] is not None:
            return [self._resolve(st, group, row, at, values)]
        alerts = [self._end_pending(st, group, row, at, values)] if st["streak"] else []
        if state == "no_data":
            st["no_data_since"] = at
            alerts.append(build_alert(self.rule, "no_data", group, row, at, None, at, values))
        return alerts

    def on_timer(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        st = store.get(key)
        if st is None:
            return []
        group = tuple(st["group"])
        alerts: list[Alert] = []
        if (
            st["firing_since"] is not None
            and st.get("keep_firing_until") is not None
            and clock_ms >= st["keep_firing_until"]
        ):
            alerts.append(self._resolve(st, group, group_row(self.rule, group), st["keep_firing_until"], {}))
        due = self._no_data_due(st)
        if due is not None and clock_ms >= due:
            alerts += self._go_no_data(st, group)
        st["due"] = self._due(st)
        if alerts:
            store.put(key, st)
        return alerts
