"""Windowed aggregates in event time: tumbling, hopping, sliding and session windows.

The watermark of a rule is the partition clock minus ``allowed_lateness``.

* **Tumbling/hopping**: each event adds to the accumulators of every window
  containing it. A window is evaluated once the watermark reaches its end
  (``late_policy: amend`` evaluates it at its end and again for each late
  event until end + lateness, and may then raise an alert it did not raise
  on time). ``having`` over the aggregates (and ``prev(x)``, the previous
  window's value) drives the same lifecycle as a threshold rule, one window
  at a time: ``starts_at`` is the first active window's start, ``ends_at`` the
  last active window's end. A firing group whose next window has no events
  is evaluated on an empty window (count 0, other aggregates NULL).
* **Sliding**: the trailing ``size`` is evaluated at every change point (each
  event time and each expiry time) in time order, once the watermark passes
  it, so arrival order within the lateness does not matter.
* **Session**: events closer than ``gap`` form a session; when the watermark
  passes its last event + gap it is evaluated, and a match raises an event
  alert (see :class:`~app.rules.lifecycle.OneShot`).

Events older than the watermark for every window they belong to are late.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.alerts import Alert
from app.events import Event
from app.rules import baselines
from app.rules.aggregates import ADDERS, MANY_ADDERS, AggSpec, SlidingAggregates
from app.rules.expr import Columns
from app.rules.lifecycle import FIRES, NOTHING, PENDS, OneShot, ending, in_episode, match, reset, started
from app.rules.loader import CompiledRule
from app.rules.logic.base import (
    GATE_ALWAYS,
    LATE,
    ON_TIME,
    Logic,
    Result,
    State,
    StateStore,
    VersionedStore,
    after,
    build_alert,
    group_row,
    leading_not_true,
)

MAX_EMPTY_STEPS = 10_000
#: sliding windows kept in memory between timer runs, per rule (beyond it they are rebuilt)
MAX_LIVE_WINDOWS = 100_000
#: no change point left (above every time in ms)
_NO_POINT = 2**62
#: what a state without ``due`` (a fresh one) reads for it
_UNKNOWN: Any = object()


class _Aggregating(Logic):
    def __init__(self, rule: CompiledRule) -> None:
        assert rule.parts is not None and rule.parts.having is not None  # noqa: S101
        assert rule.rule.window is not None  # noqa: S101
        super().__init__(rule)
        self.where_gate = GATE_ALWAYS  # every kind's on_event returns first when where is not TRUE
        self.aggs: tuple[AggSpec, ...] = rule.parts.aggs
        self.having = rule.parts.having
        self.where = rule.where.fn if rule.where is not None else None
        self.window = rule.rule.window
        self.lateness = rule.rule.allowed_lateness
        # per aggregate: (input expression's function or None, fold function), looked up once
        self._folds = [(None if a.arg is None else a.arg.fn, ADDERS[a.func]) for a in self.aggs]
        self._many = [(a.arg, MANY_ADDERS[a.func]) for a in self.aggs]
        #: per aggregate: its input's field when the input is just a field (see fold_range)
        self._fields = [None if a.arg is None else a.arg.field for a in self.aggs]
        #: each aggregate's name and its previous window's column in ``having`` (``prev(x)``),
        #: when ``having`` reads any (its only synthetic columns are ``prev.<name>``)
        self._prev_names = [(a.name, f"prev.{a.name}") for a in self.aggs] if self.having.synthetic else []
        #: ``having`` reads aggregates only (no group field, no ``prev(x)``, no baseline): it
        #: runs on the results as they are, without a row built for it at every evaluation
        self._having_on_results = not self.having.synthetic and self.having.columns.isdisjoint(
            rule.facts.group_by
        )
        #: the results of an empty window (``prev(x)`` when the previous window had no event);
        #: shared, read only
        self._empty_results = self.results(self.empty())
        #: baseline calls of ``having`` (tumbling and hopping only): state in "baselines", learnt at
        #: each window evaluated in order (see _evaluate); elsewhere their columns read NULL
        self._baselines = rule.parts.having_baselines

    def results(self, states: list[Any]) -> dict[str, Any]:
        return {a.name: a.result(s) for a, s in zip(self.aggs, states)}

    def empty(self) -> list[Any]:
        return [a.init() for a in self.aggs]

    def fold(self, states: list[Any], row: Mapping[str, Any]) -> list[Any]:
        return [add(s, None if fn is None else fn(row)) for (fn, add), s in zip(self._folds, states)]

    def fold_range(
        self,
        states: list[Any],
        rows: list[Any],
        columns: Columns,
        keep: list[int] | None,
        begin: int,
        end: int,
    ) -> list[Any]:
        """:meth:`fold` of each of ``rows[begin:end]`` in turn (``keep``: only the rows at these
        indexes), an aggregate at a time. An input that is a plain field is read from
        ``columns``, the batch's field columns, which the rules reading these rows share:
        each field is read from the rows once per batch, not once per rule and run."""
        out: list[Any] = []
        for (arg, add), name, s in zip(self._many, self._fields, states):
            values: list[Any]
            if name is not None:
                col = columns.get(name)
                if col is None:  # as a field's column-wise form reads it (a skipped row: None)
                    col = columns[name] = [None if r is None else r.get(name) for r in rows]
                values = col[begin:end] if keep is None else [col[k] for k in keep]
            else:
                values = rows[begin:end] if keep is None else [rows[k] for k in keep]
                if arg is not None:
                    values = arg.over(values, {})
            out.append(add(s, values))
        return out

    def active(
        self, group: tuple[str, ...], aggs: Mapping[str, Any], prev: Mapping[str, Any] | None,
        extra: Mapping[str, Any] | None = None,
    ) -> bool:  # fmt: skip
        if self._having_on_results and not extra:
            return self.having(aggs) is True
        row = group_row(self.rule, group)
        row.update(aggs)
        if extra:
            row.update(extra)
        for name, prev_name in self._prev_names:
            row[prev_name] = None if prev is None else prev.get(name)
        return self.having(row) is True

    def passes(self, row: Mapping[str, Any]) -> bool:
        return self.where is None or self.where(row) is True

    @staticmethod
    def failing(passes: list[Any] | None, begin: int, end: int) -> int:
        """How many leading events of the run ``[begin, end)`` ``where`` drops (``passes``:
        its value on each): ``on_event`` does nothing for them, so ``fold_many`` takes
        them as they are."""
        return 0 if passes is None else leading_not_true(passes, begin, end)


class TumblingLogic(_Aggregating):
    """Tumbling and hopping windows (tumbling: advance = size)."""

    def __init__(self, rule: CompiledRule) -> None:
        super().__init__(rule)
        self.size = int(self.window.size or 0)
        self.step = self.window.step
        self.tumbling = self.step == self.size
        self.folds_runs = True
        self.folds_scattered = self.tumbling
        self.amend = rule.rule.late_policy == "amend"
        self.for_ms = rule.rule.for_ms
        self.consecutive = rule.rule.consecutive

    def _starts(self, ts: int) -> list[int]:
        last = ts - ts % self.step
        if self.step == self.size:
            return [last]  # tumbling
        return [last - k * self.step for k in range(self.size // self.step)]

    def _eval_at(self, start: int) -> int:
        """When a window is first evaluated (watermark at its end)."""
        return start + self.size + (0 if self.amend else self.lateness)

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any],
        clock_ms: int = 0,
    ) -> Result:  # fmt: skip
        where = self.where
        if where is not None and where(row) is not True:
            return [], ON_TIME
        st = store.get(key)
        if st is not None and self.tumbling and "due" in st:  # the common case: fold into an open window
            start = ev.ts_ms - ev.ts_ms % self.step
            if start + self.size + self.lateness <= clock_ms:
                return [], LATE  # its only window is closed for good: late
            opened: dict[str, Any] = st["windows"]  # typed: a native dict lookup in the compiled build
            w = opened.get(str(start))
            if w is not None and not w["evaluated"]:  # no window opens or fires: the same due
                w["accumulators"] = self.fold(w["accumulators"], row)
                store.put(key, st)
                return [], ON_TIME
        if st is None:
            st = {
                "group": list(group),
                "windows": {},
                "firing_since": None,
                "streak": 0,
                "streak_since": None,
                "last_active": None,
            }
        alerts: list[Alert] = []
        added = reshaped = False
        windows: dict[str, Any] = st["windows"]
        for start in self._starts(ev.ts_ms):
            end = start + self.size
            if end + self.lateness <= clock_ms:
                continue  # closed for good
            w = windows.get(str(start))
            if w is None:
                w = {"accumulators": self.empty(), "evaluated": self.amend and end <= clock_ms}
                windows[str(start)] = w
                reshaped = True
            w["accumulators"] = self.fold(w["accumulators"], row)
            added = True
            if w["evaluated"] and st["firing_since"] is None:  # amend: a late event may raise the alert
                aggs = self.results(w["accumulators"])
                if self.active(group, aggs, self._prev(st, start)):
                    alerts += self._fire(st, group, start, aggs, force=True)
        if not added:
            return [], LATE
        if reshaped or alerts or "due" not in st:  # otherwise no window opened or fired: same due
            st["due"] = self._due(st)
        store.put(key, st)
        return alerts, ON_TIME

    def fold_many(
        self, store: StateStore, key: str, group: tuple[str, ...], events: list[Event],
        rows: list[Any], clocks: list[int], passes: list[Any] | None,
        begin: int, end: int, columns: Columns,
    ) -> int:  # fmt: skip
        """The common cases of the run ``[begin, end)`` of one group's events (``clocks``:
        the clock at each; ``passes``: the ``where`` on each; ``columns``: the batch's field
        columns, see :meth:`fold_range`): the leading ones ``where``
        drops, or the leading ones that fold into one tumbling window of the group, open
        or opened by the run (not with the amend policy), folded in one go. Returns how
        many it took (0: none, nothing changed).
        """
        if skipped := self.failing(passes, begin, end):
            return skipped
        if not self.tumbling:
            return 0
        st = store.get(key)
        if st is None or "due" not in st:
            return 0
        step = self.step
        first = events[begin].ts_ms
        start = first - first % step
        if start + self.size + self.lateness <= clocks[end - 1]:
            return 0  # late at some point of the run: one by one
        windows: dict[str, Any] = st["windows"]
        w = windows.get(str(start))
        due = None  # the state's timer, when this run opens its window
        if w is None:  # the run opens its window, as on_event would for its first event
            if self.amend:
                return 0
            w = windows[str(start)] = {"accumulators": self.empty(), "evaluated": False}
            due = self._due(st)
        elif w["evaluated"]:
            return 0
        stop = start + step
        j = begin
        while j < end:
            ts = events[j].ts_ms
            if not start <= ts < stop or (due is not None and clocks[j] >= due):
                break
            j += 1
        if j == begin:  # (not expected: the window ends after the run's clocks) nothing changes
            if due is not None:
                del windows[str(start)]
            return 0
        keep = None if passes is None else [k for k in range(begin, j) if passes[k] is True]
        if due is not None:
            st["due"] = due
        if keep is None or keep:
            w["accumulators"] = self.fold_range(w["accumulators"], rows, columns, keep, begin, j)
            store.put(key, st)
        elif due is not None:
            store.put(key, st)
        return j - begin

    def fold_scattered(
        self, store: StateStore, rule_id: str, keys: list[tuple[tuple[str, ...], str] | None],
        events: list[Event], rows: list[Any], clocks: list[int],
        passes: list[Any] | None, begin: int, end: int,
    ) -> int:  # fmt: skip
        """From ``begin``, the leading events of ``[begin, end)``, of any groups, that each
        fold into their group's open tumbling window (``on_event``'s common case: no
        window opens, fires or is late, so no timer moves), each folded as ``on_event``
        would; and those it ignores (``where`` not TRUE, no registry row). No timer of the
        rule is due before ``end``. Returns how many it took (see ``Logic.fold_scattered``)."""
        if not self.tumbling:
            return 0
        # the evaluator's view, called natively when compiled (through the StateStore
        # protocol, each get and put was a bound-method object and a generic call)
        view = store if isinstance(store, VersionedStore) else None
        get, put = store.get, store.put
        step, span, folds, fields = self.step, self.size + self.lateness, self._folds, self._fields
        n = len(folds)
        last_start, last_name = -1, ""  # the window's name (its start as text), for a run of one window
        for j in range(begin, end):  # scattered_events, inlined: this loop is most of a fleet's time
            found = keys[j]
            if found is None or (passes is not None and passes[j] is not True):
                continue
            if view is not None:
                key = view.key(found[1])
                st = view.get(key)
            else:
                key = rule_id + found[1]
                st = get(key)
            if st is None or "due" not in st:
                return j - begin
            ts = events[j].ts_ms
            start = ts - ts % step
            if start + span <= clocks[j]:
                return j - begin  # late (not expected: its window closed at a timer before end): on_event
            if start != last_start:
                last_start, last_name = start, str(start)
            opened: dict[str, Any] = st["windows"]
            w = opened.get(last_name)
            if w is None or w["evaluated"]:
                return j - begin
            row = rows[j]
            accs: list[Any] = []
            try:
                before: list[Any] = w["accumulators"]
                for i in range(n):
                    fn, add = folds[i]
                    name = fields[i]
                    if name is not None and isinstance(row, dict):
                        value = row.get(name)  # a plain field: what its getter returns, read natively
                    else:
                        value = None if fn is None else fn(row)
                    accs.append(add(before[i], value))
            except Exception:  # on_event takes this event and reports the error
                return j - begin
            w["accumulators"] = accs
            if view is not None:
                view.put(key, st)
            else:
                put(key, st)
        return end - begin

    def _prev(self, st: State, start: int) -> Mapping[str, Any] | None:
        """The results of the window before ``start`` (read only), when ``having`` reads them."""
        if not self._prev_names:
            return None
        prev = st.get("previous_window")
        if prev is not None and prev[0] == start - self.step:
            found: Mapping[str, Any] = prev[1]
            return found
        return self._empty_results

    def _fire(
        self, st: State, group: tuple[str, ...], start: int, aggs: dict, force: bool = False
    ) -> list[Alert]:
        end = start + self.size
        st["last_active"] = start
        found = match(st, start, end, self.consecutive, self.for_ms, force)
        if found == NOTHING:
            return []
        values = {**aggs, "window_start": start, "window_end": end}
        row = group_row(self.rule, group)
        if found == FIRES:
            return [build_alert(self.rule, "firing", group, row, st["streak_since"], None, end, values)]
        return [build_alert(self.rule, "pending", group, row, start, None, end, values)]

    def _evaluate(self, st: State, group: tuple[str, ...], start: int, accs: list[Any]) -> list[Alert]:
        return self.evaluate_results(st, group, start, self.results(accs))

    def evaluate_results(
        self, st: State, group: tuple[str, ...], start: int, aggs: dict[str, Any]
    ) -> list[Alert]:
        """Evaluate the closed window at ``start`` from its aggregates' results ``aggs`` (the
        Spark backtest's native windows compute them in Spark SQL: ``jobs.windows``)."""
        alerts: list[Alert] = []
        extra = None
        if self._baselines:  # the window's start is the baseline's time
            extra = baselines.advance(self._baselines, st.setdefault("baselines", {}), start, aggs)
        if self.active(group, aggs, self._prev(st, start), extra):
            alerts = self._fire(st, group, start, aggs)
        elif (status := ending(st)) is not None:
            # firing: resolved; pending (the streak broke before it fired): inactive, never notified
            values = {**aggs, "window_start": start, "window_end": start + self.size}
            row = group_row(self.rule, group)
            ended = st["last_active"] + self.size
            alerts = [
                build_alert(self.rule, status, group, row, started(st), ended, start + self.size, values)
            ]
            reset(st)
        st["previous_window"] = [start, aggs]
        return alerts

    def _due(self, st: State) -> int | None:
        """The earliest of: each open window's first evaluation, each amended window's end of
        lateness, and the next window's evaluation while the group fires or pends."""
        windows: dict[str, Any] = st["windows"]
        due, found = 0, False
        for s, w in windows.items():
            start = int(s)
            at = start + self.size + self.lateness if w["evaluated"] else self._eval_at(start)
            if not found or at < due:
                due, found = at, True
        if in_episode(st) and st["last_active"] is not None:
            at = self._eval_at(st["last_active"] + self.step)
            if not found or at < due:
                due, found = at, True
        return due if found else None

    def on_timer(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        st = store.get(key)
        if st is None:
            return []
        group = tuple(st["group"])
        alerts: list[Alert] = []
        windows: dict[str, Any] = st["windows"]
        ready: list[tuple[int, str, dict[str, Any]]] = []  # (start, its name, window); starts are unique
        gone: list[str] = []
        for s, w in windows.items():
            start = int(s)
            if not w["evaluated"]:
                if self._eval_at(start) <= clock_ms:
                    ready.append((start, s, w))
            elif start + self.size + self.lateness <= clock_ms:
                gone.append(s)
        ready.sort()
        for start, s, w in ready:
            if in_episode(st):
                alerts += self._empty_until(st, group, start, clock_ms)
            alerts += self._evaluate(st, group, start, w["accumulators"])
            if self.amend:
                w["evaluated"] = True
                if start + self.size + self.lateness <= clock_ms:
                    gone.append(s)
            else:
                del windows[s]
        if in_episode(st):
            alerts += self._empty_until(st, group, None, clock_ms)
        for s in gone:
            del windows[s]
        st["due"] = self._due(st)
        if not windows and not in_episode(st) and not st.get("baselines"):
            store.delete(key)
        else:
            store.put(key, st)
        return alerts

    def _empty_until(
        self, st: State, group: tuple[str, ...], before: int | None, clock_ms: int
    ) -> list[Alert]:
        """Evaluate the empty windows after the last active one while the group fires or pends."""
        alerts: list[Alert] = []
        for _ in range(MAX_EMPTY_STEPS):
            if not in_episode(st) or st["last_active"] is None:
                break
            nxt = st["last_active"] + self.step
            if (
                (before is not None and nxt >= before)
                or self._eval_at(nxt) > clock_ms
                or str(nxt) in st["windows"]
            ):
                break
            alerts += self._evaluate(st, group, nxt, self.empty())
        return alerts


class _Buffered(_Aggregating):
    """Kinds that buffer events and process them in time order up to the watermark.

    ``buffer`` holds ``[ts, aggregate inputs]`` sorted by time; ``through`` is how far
    they were processed. An event at or before ``through`` is late.
    """

    def fresh(self, group: tuple[str, ...]) -> State:
        raise NotImplementedError

    def _due(self, st: State) -> int | None:
        raise NotImplementedError

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any],
        clock_ms: int = 0,
    ) -> Result:  # fmt: skip
        if not self.passes(row):
            return [], ON_TIME
        st = store.get(key) or self.fresh(group)
        if st["through"] is not None and ev.ts_ms <= st["through"]:
            return [], LATE
        ts = ev.ts_ms
        entry = [ts, [a.input(row) for a in self.aggs]]
        buffered = st["buffer"]
        if not buffered or buffered[-1][0] <= ts:
            buffered.append(entry)  # in time order: the usual case
        else:  # by time only: equal times must not compare the inputs (NULL vs number raised TypeError)
            buffered.insert(after(buffered, ts), entry)
        # the event is one more change point (of either kind, its arrival first): the earliest
        # one moves to it or stays. A fresh state computes it
        due = st.get("due", _UNKNOWN)
        if due is _UNKNOWN:
            st["due"] = self._due(st)
        else:
            st["due"] = ts + self.lateness if due is None else min(int(due), ts + self.lateness)
        store.put(key, st)
        return [], ON_TIME


class SlidingLogic(_Buffered):
    """The trailing window of ``size`` at every change point, in time order.

    The window slides through the buffer (:class:`SlidingAggregates`): each event
    enters and leaves it once, so a burst of one group's events costs time in
    proportion to its events, not to their square. The window as of ``t`` stays in
    memory between timer runs (``_live``, for the very state object it was built from,
    as of the same ``t``), with where the events after ``t`` and after ``t - size`` start in the buffer
    (only events after ``t`` are added to it meanwhile, past both); after a restart, or
    with state restored from elsewhere, it is rebuilt from the buffer once.
    """

    def __init__(self, rule: CompiledRule) -> None:
        super().__init__(rule)
        self.size = int(self.window.size or 0)
        self.for_ms = rule.rule.for_ms
        self.consecutive = rule.rule.consecutive
        #: per state key: (the state it was built from, t, the window (t - size, t] of its
        #: buffer, where the events after t start in the buffer, where those after t - size start)
        self._live: dict[str, tuple[State, int, SlidingAggregates, int, int]] = {}

    def fresh(self, group: tuple[str, ...]) -> State:
        return {
            "group": list(group),
            "buffer": [],
            "through": None,
            "firing_since": None,
            "streak": 0,
            "streak_since": None,
        }

    def _due(self, st: State) -> int | None:
        """The first change point after ``t`` (an event time, or one leaving the window), + lateness."""
        ev = st["buffer"]
        t = st["through"] if st["through"] is not None else -(2**62)
        return self._due_from(ev, after(ev, t), after(ev, t - self.size))

    def _due_from(self, ev: list[Any], arriving: int, leaving: int) -> int | None:
        """:meth:`_due`, given where the events after ``t`` (``arriving``) and after
        ``t - size`` (``leaving``) start in the buffer ``ev``."""
        n = len(ev)
        if leaving < n:
            point = ev[leaving][0] + self.size
            if arriving < n:
                point = min(point, ev[arriving][0])
            return int(point) + self.lateness
        return None if arriving >= n else int(ev[arriving][0]) + self.lateness

    def _window(self, st: State, p: int) -> list[Any]:
        """The window ending at ``p`` folded from scratch (a percentile over more than MAX_VALUES)."""
        accs = self.empty()
        for ts, inputs in st["buffer"]:
            if p - self.size < ts <= p:
                accs = [a.add_value(s, v) for a, s, v in zip(self.aggs, accs, inputs)]
        return accs

    def forget_memory(self) -> None:
        self._live.clear()  # the windows, and the states they were built from

    def _at_t(self, key: str, st: State, t: int) -> tuple[SlidingAggregates, int, int]:
        """The window ending at ``t`` (every buffered event at or before ``t``: older ones were
        dropped), and where the events after ``t`` and after ``t - size`` start in the buffer.

        The window kept in memory serves the very state object it was built from (the
        store's, between events), as of the same ``t``: the buffer's events up to ``t``
        change only here. A state restored from its JSON is another object, and its window
        is built again from its buffer, once."""
        live = self._live.pop(key, None)
        if live is not None and live[0] is st and live[1] == t:
            return live[2], live[3], live[4]
        window = SlidingAggregates(self.aggs)
        ev = st["buffer"]
        for ts, inputs in ev:
            if ts > t:
                break
            window.add(ts, inputs)
        return window, after(ev, t), after(ev, t - self.size)

    def on_timer(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        st = store.get(key)
        if st is None:
            return []
        group = tuple(st["group"])
        wm = clock_ms - self.lateness
        t = st["through"] if st["through"] is not None else -(2**62)
        ev = st["buffer"]
        window, hi, gone = self._at_t(key, st, t)
        size = self.size
        # change points in (t, wm], in time order, each once: the times of the events after
        # ``t`` (``hi``: the next to enter the window) and the times the events after
        # ``t - size`` leave it (``gone``: the next to leave), merged
        lo = 0
        alerts: list[Alert] = []
        n = len(ev)
        while True:
            p = ev[hi][0] if hi < n and ev[hi][0] <= wm else _NO_POINT
            if gone < n and ev[gone][0] + size <= wm:
                p = min(p, ev[gone][0] + size)
            if p == _NO_POINT:
                break
            while hi < n and ev[hi][0] <= p:
                window.add(ev[hi][0], ev[hi][1])
                hi += 1
            while gone < n and ev[gone][0] + size <= p:
                gone += 1
            while lo < hi and ev[lo][0] <= p - size:
                window.remove(ev[lo][0], ev[lo][1])
                lo += 1
            aggs = self.results(self._window(st, p)) if window.capped() else window.results(self.aggs)
            if self.active(group, aggs, None):
                found = match(st, p, p, self.consecutive, self.for_ms)
                if found == FIRES:  # the group row only for an alert: most change points raise none
                    row = group_row(self.rule, group)
                    since = st["streak_since"]
                    alerts.append(build_alert(self.rule, "firing", group, row, since, None, p, aggs))
                elif found == PENDS:  # for/consecutive not met yet: pending
                    row = group_row(self.rule, group)
                    alerts.append(build_alert(self.rule, "pending", group, row, p, None, p, aggs))
            else:
                status = ending(st)
                if status is not None:  # resolved, or the streak broke before it fired: inactive
                    row = group_row(self.rule, group)
                    alerts.append(build_alert(self.rule, status, group, row, started(st), p, p, aggs))
                reset(st)
        # no change point lies between the last one and the new t: the window is as of t, and
        # ``hi`` and ``gone`` are where the events after t and after t - size start
        st["through"] = t = max(t, wm)
        del ev[:lo]
        st["due"] = self._due_from(ev, hi - lo, gone - lo)
        if not ev and not in_episode(st):
            store.delete(key)
            return alerts
        st.pop("generation", None)  # how a state written before told its window apart: not needed
        if len(self._live) >= MAX_LIVE_WINDOWS:
            self._live.clear()  # groups moved away or gone quiet: rebuilt from their buffers if they return
        self._live[key] = (st, t, window, hi - lo, gone - lo)
        store.put(key, st)
        return alerts


class SessionLogic(_Buffered):
    """Sessions of events closer than ``gap``; a matching session is an event alert."""

    def __init__(self, rule: CompiledRule) -> None:
        super().__init__(rule)
        self.gap = int(self.window.gap or 0)
        self.oneshot = OneShot(rule)

    def fresh(self, group: tuple[str, ...]) -> State:
        return {"group": list(group), "buffer": [], "through": None, "session": None, "firing_since": None}

    def _due(self, st: State) -> int | None:
        times = [st["buffer"][0][0] + self.lateness] if st["buffer"] else []
        if st["session"] is not None:
            times.append(st["session"][1] + self.gap + self.lateness)
        if (d := OneShot.due(st)) is not None:
            times.append(d)
        return min(times) if times else None

    def on_timer(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        st = store.get(key)
        if st is None:
            return []
        group = tuple(st["group"])
        wm = clock_ms - self.lateness
        alerts = self.oneshot.expire(st, group, clock_ms)
        buffered: list[Any] = st["buffer"]
        taken = 0  # the events at or before the watermark, cut from the buffer at once after
        while taken < len(buffered) and buffered[taken][0] <= wm:
            ts, inputs = buffered[taken]
            taken += 1
            s = st["session"]
            if s is not None and ts - s[1] > self.gap:
                alerts += self._close(st, group)
                s = None
            if s is None:
                s = [ts, ts, self.empty()]
            s[1] = max(s[1], ts)
            s[2] = [a.add_value(acc, v) for a, acc, v in zip(self.aggs, s[2], inputs)]
            st["session"] = s
            st["through"] = ts
        del buffered[:taken]
        if st["session"] is not None and wm >= st["session"][1] + self.gap:
            alerts += self._close(st, group)
        alerts += self.oneshot.expire(st, group, clock_ms)
        st["due"] = self._due(st)
        if not st["buffer"] and st["session"] is None and st["firing_since"] is None:
            store.delete(key)
        else:
            store.put(key, st)
        return alerts

    def _close(self, st: State, group: tuple[str, ...]) -> list[Alert]:
        start, last, accs = st["session"]
        st["session"] = None
        aggs = self.results(accs)
        if not self.active(group, aggs, None):
            return []
        values = {**aggs, "window_start": start, "window_end": last + self.gap}
        return self.oneshot.trigger(st, group, group_row(self.rule, group), start, last + self.gap, values)
