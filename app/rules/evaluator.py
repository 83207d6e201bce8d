"""The pure rule evaluator. It knows nothing about Kafka's clients or Faust.

A source's rules are split into *streams* by how their state is partitioned:

* the **direct** stream of a source holds the rules whose groups follow the
  topic key (``group_by: [device_id]`` on sensors) and stateless rules
  (branches); it runs on the source topic's own partitions;
* each other grouping (``group_by: [client_ip]`` on logs, or no group_by at
  all) forms a **regroup** stream: events are re-keyed by the group values
  so that one group's events meet on one partition, as Kafka's default
  partitioner would place them.

Each stream keeps, per partition, an event-time clock (the newest event time
seen) and a timer heap per rule. For every event, each rule runs its timers
that became due at the clock (window closes, absences, ends of event alerts),
then its ``on_event``. Because the backtest emulates the same partitioning, a
backtest and the live worker produce the same alerts and ids for the same
input order.

Two paths, one result: :meth:`StreamEvaluator.process` takes one event
through every rule (backtests, the Spark engine); :meth:`StreamEvaluator.process_batch`
takes a batch rule by rule (the live worker). Rules share no state, so only
the interleaving of different rules' alerts differs. Per batch, each field is
read once and each rule's condition evaluated column-wise
(:meth:`~app.rules.expr.Compiled.over`), and a run of one group's events
before the rule's next timer may go to the kind's ``fold_many`` in one call
(see :mod:`app.rules.logic.base`). ``tests/conformance/test_batches.py``
holds the two paths to the same transitions.

Per-(rule, group) state is stamped with the rule version: after a rule is
edited (hot reload) its old state is ignored instead of misread.
"""

from __future__ import annotations

import bisect
import heapq
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.alerts import Alert
from app.events import SCHEMAS, Event
from app.placement import partition_for
from app.rules.expr import Columns
from app.rules.loader import CompiledRule, RuleSet
from app.rules.logic.base import (
    GATE_ALWAYS,
    GATE_NONE,
    DictStore,
    Logic,
    State,
    StateStore,
    VersionedStore,
    build_alert,
    group_values,
    state_key,
)
from app.rules.logic.events import AbsenceLogic, ChangeLogic, NewTermLogic, SequenceLogic
from app.rules.logic.reorder import EventTimeOrder
from app.rules.logic.threshold import ThresholdLogic
from app.rules.logic.windows import SessionLogic, SlidingLogic, TumblingLogic
from app.rules.state import FORMAT, is_current, migrate, partition_of, record_kind, stamp
from app.rules.statekey import CLOCK_PREFIX, SEPARATOR, StateKey, group_text, is_clock_key
from app.rules.timebound import TimeBound
from app.tables import TABLES, Tables

logger = logging.getLogger(__name__)

__all__ = [
    "TICK", "DictStore", "Engine", "EvalStats", "Output", "StateStore", "StreamEvaluator", "ThresholdLogic",
    "build_alert", "group_values", "run_backtest", "state_key",
]  # fmt: skip

#: Where events go that a rule with ``late_policy: side`` could not use.
LATE_TOPIC = "events.late"

#: joined registry rows kept across batches, at most (more: the cache starts again)
MAX_JOIN_CACHE = 100_000

#: the field that makes an event a *tick* (NUL: no schema field starts with it): an event of the
#: partition that another evaluator evaluates, given here only for its time. A tick moves the
#: partition clock, runs the timers that clock makes due, and takes part in the time bound as
#: its event would, but no rule sees it; so evaluators that each take some of a partition's
#: groups, and every event of the partition, the others' as ticks, give together the alerts of
#: one evaluator given all of it (the Spark engine's split stream partitions, docs/spark.md)
TICK = "\x00tick"


def logic_for(rule: CompiledRule) -> Logic | None:
    """The logic object of a rule's kind (None for stateless branches); with
    ``order: event_time``, fed its group's events in event-time order."""
    if rule.rule.order == "event_time":
        return EventTimeOrder(rule, _kind_logic)
    return _kind_logic(rule)


def _kind_logic(rule: CompiledRule) -> Logic | None:
    r = rule.rule
    if r.kind == "window":
        assert r.window is not None  # noqa: S101
        kinds = {
            "tumbling": TumblingLogic,
            "hopping": TumblingLogic,
            "sliding": SlidingLogic,
            "session": SessionLogic,
        }
        return kinds[r.window.type](rule)
    simple: dict[str, Callable[[CompiledRule], Logic]] = {
        "threshold": ThresholdLogic, "absence": AbsenceLogic, "change": ChangeLogic, "new_term": NewTermLogic,
        "sequence": SequenceLogic,
    }  # fmt: skip
    make = simple.get(r.kind)
    return None if make is None else make(rule)


class _Runner:
    """One rule on one partition of a stream, as the evaluator drives it: the rule, its
    logic (None: a stateless branch), its store view and its timer heap."""

    __slots__ = ("group_by", "heap", "logic", "rule", "rule_id", "view")

    def __init__(
        self, rule: CompiledRule, logic: Logic | None, view: VersionedStore, heap: list[tuple[int, str]]
    ) -> None:
        self.rule, self.logic, self.view, self.heap = rule, logic, view, heap
        self.group_by: tuple[str, ...] = rule.rule.group_by
        self.rule_id: str = rule.id


@dataclass
class Output:
    """What one event produced: alert transitions, routed events, unusable late events (the
    copies of ``late_policy: side`` rules, and how many rules, of every policy, found the
    event too late: ``late_count``), and events refused for their time (each with the
    reason, for the dead-letter topic)."""

    alerts: list[Alert] = field(default_factory=list)
    routed: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    late: list[tuple[str, bytes]] = field(default_factory=list)
    refused: list[tuple[Event, str]] = field(default_factory=list)
    late_count: int = 0

    def extend(self, other: Output) -> None:
        self.alerts += other.alerts
        self.routed += other.routed
        self.late += other.late
        self.refused += other.refused
        self.late_count += other.late_count


@dataclass
class EvalStats:
    events: int = 0
    late: int = 0
    alerts: int = 0
    errors: int = 0
    skipped_no_table_row: int = 0
    #: events refused as too far ahead of their partition's clock (or of the wall clock)
    refused: int = 0
    per_rule_errors: dict[str, str] = field(default_factory=dict)
    #: per rule, the events it evaluated on the batch path (:meth:`StreamEvaluator.process_batch`):
    #: its source's events that reached it, after decoding, the event-time bound and the
    #: registry join (an event skipped for a missing table row is not counted), before its
    #: ``where``; counted once per batch and rule, drained by :meth:`Engine.take_rule_counts`
    rule_events: dict[str, int] = field(default_factory=dict)
    #: per rule, those of :attr:`rule_events` whose ``where`` was TRUE (every one for a rule
    #: without ``where``)
    rule_matched: dict[str, int] = field(default_factory=dict)
    #: per rule, its evaluations that raised (counted in :attr:`errors` too; the last one's
    #: text in :attr:`per_rule_errors`), drained by :meth:`Engine.take_rule_errors`
    rule_errors: dict[str, int] = field(default_factory=dict)


def group_and_suffix(rule: CompiledRule, row: Mapping[str, Any]) -> tuple[tuple[str, ...], str]:
    """A row's group values and the state-key suffix they make: ``rule.id + suffix`` is
    :func:`state_key`, with the suffix shared by every rule of the same ``group_by``."""
    group = group_values(rule, row)
    return group, StateKey.suffix(group)


class Rows:
    """A batch's rows as some rules see them: the events' fields, or with registry
    columns joined (None: the event is skipped, its table row missing), with what
    the rules reading them share: each field's values and each grouping's keys."""

    __slots__ = ("_groups", "columns", "dense", "rows", "skipped")

    def __init__(self, rows: list[dict[str, Any] | None]) -> None:
        self.rows = rows
        self.skipped = sum(r is None for r in rows)
        #: the rows with {} for a skipped one, for column-wise conditions (a skipped row's value is unused)
        self.dense: list[Any] = rows if not self.skipped else [{} if r is None else r for r in rows]
        #: each field's values, read once for the conditions of every rule (Compiled.over)
        self.columns: Columns = {}
        self._groups: dict[tuple[str, ...], tuple[list[tuple[tuple[str, ...], str] | None], list[int]]] = {}

    def groups(
        self, rule: CompiledRule, group_by: tuple[str, ...]
    ) -> tuple[list[tuple[tuple[str, ...], str] | None], list[int]]:
        """Per row: its group values for ``group_by`` with the state-key suffix they
        make (None for a skipped row), and where the run of consecutive rows of its
        group ends."""
        found = self._groups.get(group_by)
        if found is None:
            keys: list[tuple[tuple[str, ...], str] | None] = []
            if len(group_by) == 1:  # the common case, inlined: what group_and_suffix gives
                field = group_by[0]
                for row in self.rows:
                    if row is None:
                        keys.append(None)
                        continue
                    v = row.get(field)
                    text = "" if v is None else v if type(v) is str else str(v)
                    keys.append(((text,), SEPARATOR + text))
            else:
                for row in self.rows:
                    keys.append(None if row is None else group_and_suffix(rule, row))
            ends = [0] * len(keys)
            end = len(keys)
            for i in range(len(keys) - 1, -1, -1):
                here, after = keys[i], keys[i + 1] if i + 1 < len(keys) else None
                if here is None or after is None or after[1] != here[1]:
                    end = i + 1
                ends[i] = end
            found = self._groups[group_by] = (keys, ends)
        return found


class _Batch:
    """One batch of a stream's partition: events, their clocks, and the rows rules share."""

    __slots__ = ("_views", "clocks", "events", "tables")

    def __init__(
        self, events: list[Event], clocks: list[int], tables: dict[tuple[str, str], dict | None]
    ) -> None:
        self.events, self.clocks = events, clocks
        #: looked-up registry rows, by (table, alias and key): see StreamEvaluator._join_cache
        self.tables = tables
        self._views: dict[tuple[Any, ...], Rows] = {(): Rows([ev.fields for ev in events])}

    def rows(self, evaluator: StreamEvaluator, rule: CompiledRule) -> Rows:
        """The rows ``rule`` reads: shared by every rule with the same enrichment."""
        found = self._views.get(rule.rule.enrich)
        if found is None:
            joins, tables = evaluator.joins(rule), self.tables  # (no enrichment: the view ``()``)
            found = self._views[rule.rule.enrich] = Rows(
                [evaluator.join(joins, ev.fields, tables) for ev in self.events]
            )
        return found


class StreamEvaluator:
    """The rules of one stream. Not thread-safe: one instance per consumer task."""

    def __init__(
        self, name: str, rules: Sequence[CompiledRule], store: StateStore, tables: Tables | None = None,
        partitions: int = 1, max_skew_ms: int = -1,
    ) -> None:  # fmt: skip
        self.name = name
        #: APP_MAX_EVENT_SKEW in ms, -1: off (see :mod:`app.rules.timebound` and docs/event-time.md)
        self.max_skew_ms = max_skew_ms
        self.rules = list(rules)
        self.store = store
        self.tables = tables or Tables()
        self.partitions = partitions
        #: the part of each partition this evaluator takes, of ``split`` (the Spark engine's
        #: split stream partitions, :data:`TICK`): its registry keys are those Kafka's
        #: partitioner puts on the partition and :func:`jobs.streams.place` on the part
        self.sub = 0
        self.split = 1
        self.stats = EvalStats()
        self.logics: dict[str, Logic | None] = {r.id: logic_for(r) for r in self.rules}
        self.by_id = {r.id: r for r in self.rules}
        self._views: dict[tuple[str, int], VersionedStore] = {}
        #: per enrichment spec list (a rule model's ``enrich``): see :meth:`joins`
        self._joins: dict[Any, list[tuple[str, str, str, bool, dict[str, None]]]] = {}
        self._partition_runs: dict[int, list[_Runner]] = {}
        self.clocks: dict[int, int] = {}
        self.timers: dict[tuple[int, str], list[tuple[int, str]]] = {}
        self.scheduled: dict[str, int] = {}
        self._expected: dict[int, int] = {}
        self._joined: dict[tuple[str, str], dict | None] = {}
        self._joined_version = -1
        #: the event-time bound of the partitions (docs/event-time.md); it shares ``clocks``
        self.bound = TimeBound(name, max_skew_ms, store, self.clocks)

    def restore(self, items: Iterable[tuple[str, State]]) -> None:
        """Re-arm timers from persisted state (after a restart or a rule reload), and take
        back each partition's clock and held events (:meth:`TimeBound.save`).

        A state of this stream's rules written in an older format is migrated and written
        back to the store (:func:`app.rules.state.migrate`); one of a format this build does
        not know raises :class:`~app.rules.state.StateFormatError`, which says how to
        delete it."""
        versions = {r.id: stamp(r.version) for r in self.rules}
        mine = CLOCK_PREFIX + self.name + SEPARATOR
        for key, st in items:
            if is_clock_key(key):
                if key.startswith(mine):
                    self.bound.restore(st)
                continue
            rid = StateKey.rule_of(key)
            current = versions.get(rid)
            if current is None:
                continue
            if not is_current(st):
                st = self._migrated(key, st)
            if current == st.get("version") and st.get("due") is not None:
                self._schedule(self._heap(partition_of(st), rid), key, int(st["due"]))

    def _migrated(self, key: str, st: State) -> State:
        """A persisted state of one of this stream's rules in the current format, written back."""
        rule = self.by_id[StateKey.rule_of(key)]
        r = rule.rule
        window = None if r.window is None else r.window.type
        inner = record_kind(r.kind, window, False)
        found = migrate(key, st, record_kind(r.kind, window, r.order == "event_time"), inner)
        if found is not st:
            self.store.put(key, found)
            logger.info("rule state %r migrated to format %d", key, FORMAT)
        return found

    def _admit(
        self, events: list[Event], partition: int, now_ms: int, out: Output, save: bool
    ) -> tuple[list[Event], list[int]]:
        """The events to evaluate now, with the partition clock at each (:meth:`TimeBound.admit`)."""
        refused = out.refused
        before = len(refused)
        admitted = self.bound.admit(events, partition, now_ms, refused, save)
        if len(refused) > before:  # a refused tick is its own evaluator's to report
            refused[before:] = [r for r in refused[before:] if TICK not in r[0].fields]
        self.stats.refused += len(refused) - before
        return admitted

    def held_partitions(self) -> list[int]:
        """The partitions with events held for their time."""
        return self.bound.held_partitions()

    def forget(self, partition: int) -> None:
        """Drop what memory holds of ``partition`` beside the store: its clock and held
        events, its timers, its registry expectations, and the rules' in-memory caches. The
        rule worker calls it when the partition moves to another worker, or before its state
        is restored again from the changelog (then :meth:`restore` re-arms the timers from
        the restored states)."""
        self.bound.forget(partition)
        self._expected.pop(partition, None)
        for logic in self.logics.values():
            if logic is not None:
                logic.forget_memory()  # all of it: rebuilt from the states that stay, once
        for rule_id in self.by_id:
            heap = self.timers.get((partition, rule_id))
            if heap:  # emptied in place: the partition's runners hold this list
                for _, key in heap:
                    self.scheduled.pop(key, None)
                heap.clear()

    def release(self, partition: int, now_ms: int, quiet_ms: int) -> Output:
        """The live worker's end of a gap: evaluate what :meth:`TimeBound.release` lets go."""
        events = self.bound.release(partition, now_ms, quiet_ms)
        if not events:
            return Output()
        out = self.process_batch(events, partition, now_ms)
        self.stats.events -= len(events)  # counted when they came
        return out

    def finish(self) -> Output:
        """The end of the input (a backtest's): every event still held is refused, as no later
        event can confirm it."""
        out = Output()
        self.bound.finish(out.refused)
        self.stats.refused += len(out.refused)
        return out

    def _heap(self, partition: int, rule_id: str) -> list[tuple[int, str]]:
        """The timer heap of one rule on one partition: ``(due, state key)``."""
        heap = self.timers.get((partition, rule_id))
        if heap is None:
            heap = self.timers[(partition, rule_id)] = []
        return heap

    def _schedule(self, heap: list[tuple[int, str]], key: str, due: int) -> None:
        if self.scheduled.get(key) == due:
            return
        self.scheduled[key] = due
        heapq.heappush(heap, (due, key))

    def _after(self, heap: list[tuple[int, str]], key: str, view: VersionedStore) -> None:
        """Keep the rule's timer heap in step with the state's ``due`` after the rule ran
        (``view``: the rule's store view, for its version)."""
        st = self.store.get(key)
        self._rearm(heap, key, st if st is not None and st.get("version") == view.version else None)

    def _rearm(self, heap: list[tuple[int, str]], key: str, st: State | None) -> None:
        due = None if st is None else st.get("due")
        if due is not None:
            self._schedule(heap, key, int(due))
        else:
            self.scheduled.pop(key, None)

    def use_logic(self, rule_id: str, logic: Logic) -> None:
        """Run ``rule_id`` with ``logic`` from now on (a test's reference implementation)."""
        self.logics[rule_id] = logic
        self._partition_runs.clear()

    def _runs_of(self, partition: int) -> list[_Runner]:
        """Each rule with its logic, store view and timer heap on ``partition``."""
        runs = self._partition_runs.get(partition)
        if runs is None:
            runs = self._partition_runs[partition] = [
                _Runner(r, self.logics[r.id], self._view(r, partition), self._heap(partition, r.id))
                for r in self.rules
            ]
        return runs

    def _view(self, rule: CompiledRule, partition: int) -> VersionedStore:
        view = self._views.get((rule.id, partition))
        if view is None:
            view = self._views[(rule.id, partition)] = VersionedStore(
                self.store, rule.version, partition, rule.id
            )
        return view

    def _run_timers(
        self, heap: list[tuple[int, str]], view: VersionedStore, clock: int, rule: CompiledRule, logic: Logic,
        out: Output,
    ) -> None:  # fmt: skip
        """Run one rule's timers that are due at ``clock``, in due order (``heap`` and
        ``view``: the rule's timer heap and store view on the partition)."""
        while heap and heap[0][0] <= clock:
            due, key = heapq.heappop(heap)
            if self.scheduled.get(key) != due:
                continue  # rescheduled or done since
            del self.scheduled[key]
            self._fire(heap, view, key, clock, rule, logic, out)

    def _fire(
        self, heap: list[tuple[int, str]], view: VersionedStore, key: str, clock: int, rule: CompiledRule,
        logic: Logic, out: Output,
    ) -> None:  # fmt: skip
        """Run ``key``'s timer at ``clock``, then re-arm it from its state. A timer that
        raises is tried again once the partition's clock has passed ``clock``: its state
        still says it is due, so re-armed from the state it would run, and fail, again and
        again within this one event (one rule's bug must not stop the others, nor the
        partition)."""
        try:
            out.alerts += logic.on_timer(view, key, clock)
        except Exception as exc:
            self._failed(rule, exc)
            self._schedule(heap, key, clock + 1)
            return
        self._after(heap, key, view)

    def _failed(self, rule: CompiledRule, exc: Exception) -> None:
        stats = self.stats
        stats.errors += 1
        stats.per_rule_errors[rule.id] = repr(exc)
        stats.rule_errors[rule.id] = stats.rule_errors.get(rule.id, 0) + 1
        logger.exception("rule %s failed", rule.id)

    def _expect_registry(self, partition: int, clock: int) -> None:
        """Absence rules with expect_from: start waiting for registry keys never seen."""
        version = self.tables.version
        if self._expected.get(partition) == version:
            return
        self._expected[partition] = version
        for rule in self.rules:
            logic = self.logics.get(rule.id)
            if logic is None or not logic.expects_registry or rule.rule.expect_from is None:
                continue
            # unsplit (split 1, sub 0), this is Kafka's partition over ``partitions``
            slots, slot = self.partitions * self.split, partition + self.partitions * self.sub
            for dev in self.tables.keys(rule.rule.expect_from):
                if partition_for(dev.encode(), slots) != slot:
                    continue
                key = state_key(rule, (dev,))
                view = VersionedStore(self.store, rule.version, partition, rule.id)
                logic.expect(view, key, (dev,), clock)
                self._after(self._heap(partition, rule.id), key, view)

    def _join_cache(self) -> dict[tuple[str, str], dict | None]:
        """Registry rows with their columns prefixed, by (table, alias and key), kept across
        batches until a table changes (any change: the tables' version moves)."""
        if self._joined_version != self.tables.version or len(self._joined) > MAX_JOIN_CACHE:
            self._joined, self._joined_version = {}, self.tables.version
        return self._joined

    def enrich(
        self, rule: CompiledRule, row: dict[str, Any], cache: dict[tuple[str, str], dict | None]
    ) -> dict | None:
        """``row`` with the registry columns of ``rule``'s enrichment; None: skip the event."""
        if not rule.rule.enrich:
            return row
        return self.join(self.joins(rule), row, cache)

    def joins(self, rule: CompiledRule) -> list[tuple[str, str, str, bool, dict[str, None]]]:
        """``rule``'s enrichments as (table, alias, key field, skip when the key is missing,
        the alias's columns all null): read from the rule's model once, not for every row."""
        found = self._joins.get(rule.rule.enrich)
        if found is None:
            found = []
            for spec in rule.rule.enrich:
                table = TABLES[spec.table]
                nulls: dict[str, None] = {f"{spec.as_}.{c}": None for c in (table.key, *table.columns)}
                found.append((spec.table, spec.as_, spec.on, spec.missing == "skip", nulls))
            self._joins[rule.rule.enrich] = found
        return found

    def join(
        self, joins: list[tuple[str, str, str, bool, dict[str, None]]], row: dict[str, Any],
        cache: dict[tuple[str, str], dict | None],
    ) -> dict | None:  # fmt: skip
        """``row`` with the registry columns of ``joins`` (see :meth:`joins`); None: skip the event."""
        out = dict(row)
        for table, alias, on, skip, nulls in joins:
            key = str(row.get(on))
            ck = (table, alias + "\x1f" + key)
            if ck in cache:
                extra = cache[ck]
            else:
                found = self.tables.get(table, key)
                extra = cache[ck] = None if found is None else {f"{alias}.{k}": v for k, v in found.items()}
            if extra is None:
                if skip:
                    return None
                extra = nulls
            out.update(extra)
        return out

    def process(self, ev: Event, partition: int = 0, now_ms: int = -1) -> Output:
        """Evaluate one event on ``partition`` of this stream: every rule in turn, its
        timers due at the clock run before and after it (as :meth:`process_batch`,
        without the batch's bookkeeping). With a time bound, the event may be held or
        refused, and held ones evaluated with it (:meth:`_admit`)."""
        if TICK not in ev.fields:
            self.stats.events += 1
        out = Output()
        if self.max_skew_ms < 0:
            clock = max(self.clocks.get(partition, ev.ts_ms), ev.ts_ms)
            self.clocks[partition] = clock
            self._process_one(ev, partition, clock, out)
        else:
            events, clocks = self._admit([ev], partition, now_ms, out, False)
            for e, c in zip(events, clocks):
                self._process_one(e, partition, c, out)
        self.stats.alerts += len(out.alerts)
        return out

    def tick(self, ev: Event, partition: int) -> Output | None:
        """A tick (:data:`TICK`, ``ev``: its key and time) on ``partition``, as :meth:`process`
        takes it, and None when it made nothing (it moved the clock, if at all, and no timer was
        due): the common case, without :meth:`process`'s allocations. The time bound's other
        cases (a held event, or a jump beyond the skew) go through :meth:`process`."""
        ts, skew = ev.ts_ms, self.max_skew_ms
        known = self.clocks.get(partition)
        if skew >= 0 and (known is None or known < 0 or ts > known + skew or partition in self.bound.held):
            return self.process(ev, partition)
        clock = ts if known is None or ts > known else known
        if clock != known:
            self.clocks[partition] = clock
        self._expect_registry(partition, clock)
        return self._run_due(partition, clock, None)

    def _run_due(self, partition: int, clock: int, out: Output | None) -> Output | None:
        """Every rule's timers due at ``clock`` on ``partition`` (a tick's whole work), into
        ``out``, made when a timer is due if None; ``out`` again."""
        for run in self._runs_of(partition):
            heap = run.heap
            if heap and heap[0][0] <= clock and run.logic is not None:
                if out is None:
                    out = Output()
                self._run_timers(heap, run.view, clock, run.rule, run.logic, out)
        return out

    def _process_one(self, ev: Event, partition: int, clock: int, out: Output) -> None:
        """One event through every rule at partition clock ``clock`` (see :meth:`process`); a
        tick (:data:`TICK`) through their timers only."""
        self._expect_registry(partition, clock)
        if TICK in ev.fields:
            self._run_due(partition, clock, out)
            return
        tables = self._join_cache()
        groups: dict[tuple[str, ...], tuple[tuple[str, ...], str]] = {}
        fields = ev.fields
        for run in self._runs_of(partition):
            rule, logic, group_by, view, heap = run.rule, run.logic, run.group_by, run.view, run.heap
            if heap and heap[0][0] <= clock and logic is not None:
                self._run_timers(heap, view, clock, rule, logic, out)
            row = self.enrich(rule, fields, tables) if rule.rule.enrich else fields
            if row is None:
                self.stats.skipped_no_table_row += 1
                continue
            if logic is None:
                out.routed += self._route(rule, ev, row)
                continue
            found = groups.get(group_by) if row is fields else None
            if found is None:
                found = group_and_suffix(rule, row)
                if row is fields:
                    groups[group_by] = found
            self._step(run, logic, partition, found[0], view.key(found[1]), ev, row, clock, out)

    def _step(
        self, run: _Runner, logic: Logic, partition: int, group: tuple[str, ...], key: str, ev: Event,
        row: Mapping[str, Any], clock: int, out: Output,
    ) -> None:  # fmt: skip
        """One event through one rule's ``on_event``, then the timers it made due."""
        rule, rid, view, heap = run.rule, run.rule_id, run.view, run.heap
        view.untouch()
        try:
            alerts, late = logic.on_event(view, key, group, ev, row, clock)
        except Exception as exc:  # one rule's bug must not stop the others
            self._failed(rule, exc)
            return
        if late:
            self.stats.late += 1
            out.late_count += 1
            if rule.rule.late_policy == "side":
                out.late.append((rid, orjson.dumps({"rule_id": rid, "event": ev.fields})))
        if alerts:
            out.alerts += alerts
        touched: Any = view.touched
        if touched is not None:  # only a write can move the state's timer
            due = touched.get("due") if touched else None
            if due is not None and int(due) <= clock and (not heap or heap[0][0] > clock):
                # the event made its own key's timer due at once (a sliding window's change
                # point at the event, without lateness), and no other timer of the rule is
                # due (they ran before the event): run it here, as _run_timers would, without
                # a round trip through the heap
                self._fire(heap, view, key, clock, rule, logic, out)
            elif not touched or self.scheduled.get(key) != due:  # (else: the same timer)
                self._rearm(heap, key, touched or None)
            if heap and heap[0][0] <= clock:
                self._run_timers(heap, view, clock, rule, logic, out)

    def process_batch(self, events: Sequence[Event], partition: int = 0, now_ms: int = -1) -> Output:
        """Evaluate ``events``, in arrival order, on ``partition`` of this stream.

        Rule by rule: each rule takes the batch's events in order, its timers
        running at each event's clock (the newest event time so far) before and
        after the event, exactly as if the events came one at a time. Rules share
        no state, so a batch gives the same alerts as its events one by one; only
        the interleaving of different rules' alerts in the output differs. With a
        time bound, events may be held or refused first, as :meth:`process` would
        (:meth:`_admit`; ``now_ms``: the wall clock, -1 for none).
        """
        out = Output()
        if not events:
            return out
        self.stats.events += len(events)
        # a list, as every kind's batch path takes it (indexed natively in the compiled build)
        todo = events if isinstance(events, list) else list(events)
        if self.max_skew_ms < 0:
            clock = self.clocks.get(partition, todo[0].ts_ms)
            clocks = []
            for ev in todo:
                if ev.ts_ms > clock:
                    clock = ev.ts_ms
                clocks.append(clock)
            self.clocks[partition] = clock
        else:
            todo, clocks = self._admit(todo, partition, now_ms, out, True)
            if not todo:
                return out
        self._expect_registry(partition, clocks[0])
        batch = _Batch(todo, clocks, self._join_cache())
        for run in self._runs_of(partition):
            self._run_rule(run, batch, partition, out)
        self.stats.alerts += len(out.alerts)
        return out

    def _run_rule(self, run: _Runner, batch: _Batch, partition: int, out: Output) -> None:
        """One rule over a batch: its timers, then each event, in order."""
        rule, logic, group_by, rid = run.rule, run.logic, run.group_by, run.rule_id
        store = view = run.view
        heap = run.heap
        events, clocks = batch.events, batch.clocks
        rows = batch.rows(self, rule)
        stats = self.stats
        stats.skipped_no_table_row += rows.skipped
        seen = len(events) - rows.skipped
        stats.rule_events[rid] = stats.rule_events.get(rid, 0) + seen
        if logic is None:
            if rule.where is None:
                stats.rule_matched[rid] = stats.rule_matched.get(rid, 0) + seen
                for ev, row in zip(events, rows.rows):
                    if row is not None:
                        out.routed += self._arms(rule, ev, row)
                return
            took = rule.where.over(rows.dense, rows.columns)
            matched = 0
            for ev, row, ok in zip(events, rows.rows, took):
                if row is not None and ok is True:
                    matched += 1
                    out.routed += self._arms(rule, ev, row)
            stats.rule_matched[rid] = stats.rule_matched.get(rid, 0) + matched
            return
        keys, ends = rows.groups(rule, group_by)
        fold_many, scattered = logic.folds_runs, logic.folds_scattered
        passes: list[Any] | None = None  # the rule's condition on each row (None: no where)
        # events the logic would do nothing for (see Logic.where_gate) are skipped on the
        # condition evaluated column-wise: always, or for a group without state
        gate = logic.where_gate if rule.where is not None else GATE_NONE
        if rule.where is not None:  # also counted: the events whose condition is TRUE
            passes = rule.where.over(rows.dense, rows.columns)
            stats.rule_matched[rid] = stats.rule_matched.get(rid, 0) + _count_true(passes, rows)
        else:
            stats.rule_matched[rid] = stats.rule_matched.get(rid, 0) + seen
        always = gate == GATE_ALWAYS
        i, n = 0, len(events)
        scheduled = self.scheduled
        row_list, columns = rows.rows, rows.columns
        while i < n:
            clock = clocks[i]
            # drop rescheduled timers from the top: a stale entry would otherwise cut the run
            # below short at its old time (every write of a new due leaves one behind)
            while heap and scheduled.get(heap[0][1]) != heap[0][0]:
                heapq.heappop(heap)
            if heap and heap[0][0] <= clock:
                self._run_timers(heap, view, clock, rule, logic, out)
                while heap and scheduled.get(heap[0][1]) != heap[0][0]:
                    heapq.heappop(heap)
            found = keys[i]
            if found is None:  # skipped: no row in the registry table
                i += 1
                continue
            group, suffix = found
            key = store.key(suffix)  # = state_key(rule, group)
            if gate != GATE_NONE and passes[i] is not True and (always or store.get(key) is None):  # type: ignore[index]
                i += 1
                continue
            if fold_many and ends[i] - i > 1:
                # a run of one group's events before the rule's next timer: the logic may take a
                # leading part of it in one call (see Logic.fold_many)
                end = ends[i] if not heap else bisect.bisect_left(clocks, heap[0][0], i, ends[i])
                if end - i > 1:
                    view.untouch()
                    try:
                        taken = logic.fold_many(
                            view, key, group, events, row_list, clocks, passes, i, end, columns
                        )
                    except Exception:  # the events then run one by one, which reports it
                        taken = 0
                    if taken:
                        i += taken
                        touched: Any = view.touched
                        if touched is not None:
                            self._rearm(heap, key, touched or None)
                        continue
            if scattered:
                # events of any groups before the rule's next timer: the logic may take the
                # leading ones that are its per-event common case (see Logic.fold_scattered)
                end = n if not heap else bisect.bisect_left(clocks, heap[0][0], i, n)
                try:
                    taken = logic.fold_scattered(view, rid, keys, events, row_list, clocks, passes, i, end)
                except Exception:  # the events then run one by one, which reports it
                    taken = 0
                if taken:
                    i += taken
                    continue
            self._step(run, logic, partition, group, key, events[i], row_list[i], clock, out)  # type: ignore[arg-type]
            i += 1

    def _route(self, rule: CompiledRule, ev: Event, row: Mapping[str, Any]) -> list[tuple[str, bytes, bytes]]:
        """A branch rule's copy of ``ev``: to its first arm whose condition holds, when its
        ``where`` is TRUE."""
        if rule.where is not None and rule.where(row) is not True:
            return []
        return self._arms(rule, ev, row)

    def _arms(self, rule: CompiledRule, ev: Event, row: Mapping[str, Any]) -> list[tuple[str, bytes, bytes]]:
        """A branch rule's copy of ``ev`` (its ``where`` already TRUE): to its first arm
        whose condition holds, or nowhere."""
        assert rule.parts is not None  # noqa: S101
        for cond, topic in rule.parts.arms:
            if cond is None or cond(row) is True:
                return [(topic, ev.key.encode(), orjson.dumps(ev.fields))]
        return []


def _count_true(passes: list[Any], rows: Rows) -> int:
    """How many of a batch's rows ``rows`` (skipped ones left out) have a condition
    ``passes`` that is TRUE (``is True``, as the rules test it)."""
    n = 0
    if not rows.skipped:
        for ok in passes:
            if ok is True:
                n += 1
        return n
    for row, ok in zip(rows.rows, passes):
        if ok is True and row is not None:
            n += 1
    return n


@dataclass(frozen=True)
class Stream:
    """One partitioning of a source's rules: ``fields`` None means the topic key."""

    name: str
    source: str
    fields: tuple[str, ...] | None
    evaluator: StreamEvaluator

    def key_of(self, ev: Event) -> bytes:
        if self.fields is None:
            return ev.key.encode()
        fields = ev.fields
        return group_text(["" if fields.get(f) is None else str(fields.get(f)) for f in self.fields]).encode()


def stream_name(source: str, fields: tuple[str, ...] | None) -> str:
    return source if fields is None else f"{source}.by.{'+'.join(fields) or 'all'}"


class Engine:
    """Every stream of every source for one rule set."""

    def __init__(
        self, ruleset: RuleSet, *, engine: str = "faust", tables: Tables | None = None, partitions: int = 1,
        stores: Callable[[str], StateStore] | None = None, max_skew_ms: int = -1,
    ) -> None:  # fmt: skip
        self.ruleset = ruleset
        self.tables = tables or Tables()
        self.partitions = partitions
        make_store = stores or (lambda _name: DictStore())
        groups: dict[tuple[str, tuple[str, ...] | None], list[CompiledRule]] = {}
        for source, schema in SCHEMAS.items():
            groups.setdefault((source, None), [])
            for r in ruleset.for_source(source, engine):
                direct = r.rule.kind == "branch" or r.rule.group_by == (schema.key,)
                groups.setdefault((source, None if direct else r.rule.group_by), []).append(r)
        self.streams: dict[str, list[Stream]] = {}
        for (source, fields), rules in groups.items():
            name = stream_name(source, fields)
            ev = StreamEvaluator(name, rules, make_store(name), self.tables, partitions, max_skew_ms)
            self.streams.setdefault(source, []).append(Stream(name, source, fields, ev))

    def process(self, source: str, ev: Event) -> Output:
        """Backtest path: every stream of ``source``, on the partition Kafka would pick."""
        out = Output()
        for stream in self.streams.get(source, ()):
            if stream.evaluator.rules:
                out.extend(stream.evaluator.process(ev, partition_for(stream.key_of(ev), self.partitions)))
        return out

    def finish(self) -> Output:
        """The end of a backtest's input: events still held for their time are refused
        (:meth:`StreamEvaluator.finish`)."""
        out = Output()
        for streams in self.streams.values():
            for stream in streams:
                out.extend(stream.evaluator.finish())
        return out

    def process_batch(self, items: Sequence[tuple[str, Event]]) -> Output:
        """Backtest path for many ``(source, event)`` pairs: each stream's partitions
        take their events in order, in one batch each (see
        :meth:`StreamEvaluator.process_batch`)."""
        out = Output()
        parts: dict[tuple[str, int], list[Event]] = {}
        for source, ev in items:
            for stream in self.streams.get(source, ()):
                if stream.evaluator.rules:
                    p = partition_for(stream.key_of(ev), self.partitions)
                    parts.setdefault((stream.name, p), []).append(ev)
        by_name = {s.name: s for streams in self.streams.values() for s in streams}
        for (name, p), evs in parts.items():
            out.extend(by_name[name].evaluator.process_batch(evs, p))
        return out

    def take_rule_counts(self) -> dict[str, tuple[int, int]]:
        """Per rule, ``(events evaluated, events whose where was TRUE)`` on the batch path since
        the last call (see :attr:`EvalStats.rule_events`), summed over the rule's stream;
        the counts start again from zero."""
        out: dict[str, tuple[int, int]] = {}
        for streams in self.streams.values():
            for s in streams:
                st = s.evaluator.stats
                for rid, n in st.rule_events.items():
                    seen, matched = out.get(rid, (0, 0))
                    out[rid] = (seen + n, matched + st.rule_matched.get(rid, 0))
                st.rule_events, st.rule_matched = {}, {}
        return out

    def take_rule_errors(self) -> dict[str, int]:
        """Per rule, its evaluations that raised since the last call (see
        :attr:`EvalStats.rule_errors`), summed over the rule's stream; they start again from zero."""
        out: dict[str, int] = {}
        for streams in self.streams.values():
            for s in streams:
                st = s.evaluator.stats
                for rid, n in st.rule_errors.items():
                    out[rid] = out.get(rid, 0) + n
                st.rule_errors = {}
        return out

    @property
    def stats(self) -> EvalStats:
        total = EvalStats()
        for streams in self.streams.values():
            for s in streams:
                st = s.evaluator.stats
                total.late += st.late
                total.alerts += st.alerts
                total.errors += st.errors
                total.skipped_no_table_row += st.skipped_no_table_row
                total.refused += st.refused
                total.per_rule_errors.update(st.per_rule_errors)
        return total


def run_backtest(
    ruleset: RuleSet, events: Iterable[tuple[str, Event]], engine: str = "faust", partitions: int = 1,
    tables: Tables | None = None, max_skew_ms: int = -1,
) -> list[Alert]:  # fmt: skip
    """Evaluate recorded ``(source, event)`` pairs in order with a fresh state."""
    eng = Engine(ruleset, engine=engine, partitions=partitions, tables=tables, max_skew_ms=max_skew_ms)
    out: list[Alert] = []
    for source, e in events:
        out.extend(eng.process(source, e).alerts)
    return out
