"""What every rule kind's logic shares: the state store, the alert builder and the
contract the evaluator drives.

Contract (bytewax's StatefulLogic, adapted):

* ``on_event(store, key, group, ev, row, clock_ms) -> (alerts, LATE | ON_TIME)`` runs
  for each event of the rule's stream, in arrival order, at the partition clock
  ``clock_ms``. ``LATE`` when the event was too old to apply; the evaluator counts it and applies the rule's
  late policy.
* ``on_timer(store, key, clock_ms) -> alerts`` runs when the partition's
  event-time clock (the newest event time seen on it) has reached the state's
  ``due`` time. It closes windows, fires absences and ends event alerts.
* ``notify_at(state) -> due`` is when the state's timer is due (``due``).
* ``fold_many(store, key, group, events, rows, clocks, passes, begin, end, columns)
  -> taken``
  is optional (``folds_runs``): given a run ``[begin, end)`` of one group's consecutive events of
  the batch before the rule's next timer (``events``, ``rows``: the batch's
  events and their rows; ``clocks``: the partition clock at each; ``passes``:
  the rule's ``where`` on each, evaluated column-wise, or None; all lists, which
  the compiled kinds index natively; ``columns``: the batch's field columns the
  rules reading ``rows`` share), it may apply a leading part in one go
  when that part is the kind's common case (a firing threshold that keeps
  firing, an event that folds into an open window) and returns how many events
  it took, 0 when it changed nothing. It must stop before an event whose
  clock reaches a timer the part it took would have set. The rest go to
  ``on_event``; the result must be exactly what ``on_event`` gives one event at
  a time.
* ``fold_scattered(store, rule_id, keys, events, rows, clocks, passes, begin,
  end) -> taken`` is optional (``folds_scattered``): the same for a stretch of a batch whose events
  belong to any groups (``keys``: each event's group and state-key suffix, None
  for an event without its registry row), before the rule's next timer: it
  takes the leading events that are each the kind's per-event common case, as
  ``on_event`` would apply them one by one. They must leave every timer where
  it is, or move it later only if ``on_timer`` at the old time then does
  nothing (the evaluator re-arms the timer at the state's ``due`` after it).
* ``where_gate`` (``GATE_NONE`` by default): ``GATE_ALWAYS`` when ``on_event`` does nothing (no
  alert, not late, no write) for an event whose ``where`` is not TRUE, whatever
  the state; ``GATE_NO_STATE`` when that holds for a group without state. The batch
  path then skips such events on the condition evaluated column-wise.
* State is one JSON-able record per (rule, group), a dict whose fields its kind's
  ``TypedDict`` in :mod:`app.rules.state` declares, with at least ``group`` (the group
  values) and, when a timer is pending, ``due``. ``store.put`` (keep it, bytewax's
  RETAIN) is called whenever the state must survive a restart; ``store.delete``
  (DISCARD) drops it. Pending/firing/resolved follows :mod:`app.rules.lifecycle`.

Every time in an alert comes from event time, never from the wall clock or
from when a timer happened to run, so ids are identical across engines,
replays and partitionings.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from typing import Any, Final, Protocol

from app.alerts import Alert, RuleFacts, Status
from app.events import Event, format_ts
from app.rules.expr import Columns
from app.rules.loader import CompiledRule
from app.rules.state import stamp
from app.rules.statekey import StateKey
from app.rules.template import render

State = dict[str, Any]
Result = tuple[list[Alert], bool]


class StateStore(Protocol):
    """Where per-key state lives: a dict in tests and backtests, a Faust table live."""

    def get(self, key: str) -> State | None: ...

    def put(self, key: str, value: State) -> None: ...

    def delete(self, key: str) -> None: ...


class DictStore:
    """An in-memory :class:`StateStore` over ``data`` (a new dict by default).

    With ``changed``, it also records each key written or deleted, with the partition
    its state is stamped with (``partition``, see the evaluator's version view): the live
    worker's store (``agents.wiring.TableStore``) holds its Faust table's dict here and
    turns the changed keys into changelog records at each commit. Compiled with the
    evaluator, it takes the evaluator's reads and writes as native calls.
    """

    def __init__(self, data: dict[str, State] | None = None, changed: dict[str, int] | None = None) -> None:
        self.data: dict[str, State] = {} if data is None else data
        #: written or deleted keys and their states' partitions, when tracked
        self.changed: dict[str, int] | None = changed

    def get(self, key: str) -> State | None:
        return self.data.get(key)

    def put(self, key: str, value: State) -> None:
        self.data[key] = value
        changed = self.changed
        if changed is not None:
            changed[key] = int(value.get("partition", 0))

    def delete(self, key: str) -> None:
        known = self.data.pop(key, None)
        changed = self.changed
        if known is not None and changed is not None:
            changed[key] = int(known.get("partition", 0))

    def items(self) -> list[tuple[str, State]]:
        return list(self.data.items())


#: state keys a rule's store view remembers (:meth:`VersionedStore.key`) before it starts again
MAX_STATE_KEYS = 100_000


class VersionedStore:
    """A view of the store for one rule and partition (the evaluator's): stamps each state
    written with the rule's version and the partition, and ignores a stale one (another
    version's) as absent. Compiled, a kind that knows it has one calls it natively."""

    __slots__ = ("_keys", "base", "dict_base", "partition", "rule_id", "touched", "version")

    def __init__(self, base: StateStore, version: str, partition: int, rule_id: str) -> None:
        self.base, self.partition, self.rule_id = base, partition, rule_id
        #: the stamp of the rule's current states (:func:`app.rules.state.stamp`)
        self.version = stamp(version)
        #: ``base`` when it is the compiled DictStore (the worker's and backtests' store): its
        #: methods are then native calls, not a Python method lookup and call each
        self.dict_base: DictStore | None = base if isinstance(base, DictStore) else None
        #: the state last written or deleted (``False``: deleted) since the evaluator reset it
        self.touched: State | bool | None = None
        #: state keys by group suffix (see :meth:`key`)
        self._keys: dict[str, str] = {}

    def key(self, suffix: str) -> str:
        """The state key of the group whose key suffix is ``suffix``: ``rule_id + suffix``
        (:func:`state_key`), remembered, up to ``MAX_STATE_KEYS`` at a time.

        A key built anew is a new string, hashed again by every dict it is looked up in;
        the one remembered carries its hash. A batch's rows share each suffix string
        among the rules of one grouping, so the suffix is hashed once per event, not the
        ~30 keys a fleet event's rules would build."""
        keys = self._keys
        found = keys.get(suffix)
        if found is None:
            if len(keys) >= MAX_STATE_KEYS:
                keys.clear()
            found = keys[suffix] = self.rule_id + suffix
        return found

    def untouch(self) -> None:
        """Forget the last write, before a call whose writes the evaluator then reads
        from :attr:`touched` (a method, not an assignment at the call site: the compiled
        caller would take the attribute to stay None)."""
        self.touched = None

    def get(self, key: str) -> State | None:
        dict_base = self.dict_base
        st = dict_base.data.get(key) if dict_base is not None else self.base.get(key)
        return st if st is not None and st.get("version") == self.version else None

    def put(self, key: str, value: State) -> None:
        value["version"], value["partition"] = self.version, self.partition
        dict_base = self.dict_base
        if dict_base is not None:
            dict_base.put(key, value)
        else:
            self.base.put(key, value)
        self.touched = value

    def delete(self, key: str) -> None:
        dict_base = self.dict_base
        if dict_base is not None:
            dict_base.delete(key)
        else:
            self.base.delete(key)
        self.touched = False


#: :attr:`Logic.where_gate`: every event goes to ``on_event``
GATE_NONE: Final = 0
#: :attr:`Logic.where_gate`: ``on_event`` does nothing (no alert, not late, no write) for an
#: event whose ``where`` is not TRUE, whatever the state
GATE_ALWAYS: Final = 1
#: :attr:`Logic.where_gate`: the same, for a group without state
GATE_NO_STATE: Final = 2

#: the second item of :data:`Result`: the event was applied (or had nothing to change)
ON_TIME: Final = False
#: the second item of :data:`Result`: the event was too old to apply (counted, and sent to
#: the rule's late policy)
LATE: Final = True


class Logic:
    """The contract every rule kind implements, with one signature per member (see the
    module). The evaluator calls only these members; a kind states its optional
    capabilities in the typed flags set by its constructor, never by what it happens to
    define. Compiled, every call from the evaluator is a native virtual call.

    A new stateful piece (a kind, or a per-group helper such as a baseline) subclasses
    this, keeps its per-group state in one record (see :mod:`app.rules.state`), and uses
    :mod:`app.rules.lifecycle` for pending/firing/resolved."""

    def __init__(self, rule: CompiledRule) -> None:
        self.rule = rule
        #: GATE_NONE, GATE_ALWAYS or GATE_NO_STATE: which events whose ``where`` is not TRUE
        #: the batch path may skip without calling ``on_event``
        self.where_gate: int = GATE_NONE
        #: :meth:`fold_many` may take runs of one group's events
        self.folds_runs: bool = False
        #: :meth:`fold_scattered` may take stretches of any groups' events
        self.folds_scattered: bool = False
        #: :meth:`expect` starts a wait for registry keys never seen (``expect_from``)
        self.expects_registry: bool = False

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any],
        clock_ms: int = 0,
    ) -> Result:  # fmt: skip
        """One event of ``group`` at partition clock ``clock_ms``: the alerts it raises and
        :data:`LATE` or :data:`ON_TIME`."""
        raise NotImplementedError

    def on_timer(self, store: StateStore, key: str, clock_ms: int) -> list[Alert]:
        """The state's timer (``notify_at``) was reached by the partition clock ``clock_ms``."""
        raise NotImplementedError

    def notify_at(self, st: State) -> int | None:
        """When the state's timer is due (event time, ms), None without one."""
        due = st.get("due")
        return None if due is None else int(due)

    def fold_many(
        self, store: StateStore, key: str, group: tuple[str, ...], events: list[Event],
        rows: list[Any], clocks: list[int], passes: list[Any] | None,
        begin: int, end: int, columns: Columns,
    ) -> int:  # fmt: skip
        """See the module; called only when :attr:`folds_runs`. Returns how many it took."""
        return 0

    def fold_scattered(
        self, store: StateStore, rule_id: str, keys: list[tuple[tuple[str, ...], str] | None],
        events: list[Event], rows: list[Any], clocks: list[int],
        passes: list[Any] | None, begin: int, end: int,
    ) -> int:  # fmt: skip
        """See the module; called only when :attr:`folds_scattered`. Returns how many it took."""
        return 0

    def expect(self, store: StateStore, key: str, group: tuple[str, ...], since_ms: int) -> None:
        """Start waiting for a registry key never seen; called only when :attr:`expects_registry`."""
        return

    def forget_memory(self) -> None:
        """Drop what the logic keeps in memory beside the store (derived from states, for
        speed): the evaluator calls it when partitions' states leave memory, so that it
        holds none of them."""
        return


def after(entries: list[list[Any]], ts: int) -> int:
    """Where the entries after ``ts`` start in a list of ``[ts, ...]`` sorted by time
    (integer ms): ``[ts + 1]`` sorts before ``[ts + 1, ...]`` and after ``[ts, ...]``, so
    nothing past the time is compared and no key function runs."""
    return bisect.bisect_left(entries, [ts + 1])


def scattered_events(
    keys: list[tuple[tuple[str, ...], str] | None],
    passes: list[Any] | None,
    store: StateStore,
    rule_id: str,
    begin: int,
    end: int,
) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """For ``fold_scattered``: each event of ``[begin, end)`` its logic must look at, as
    (index, state key, group values), passing over those the evaluator passes over too
    (no registry row; ``where`` not TRUE, for a kind gated ``always``). The keys are the
    evaluator's view's remembered ones (:meth:`VersionedStore.key`) when ``store`` is one."""
    view = store if isinstance(store, VersionedStore) else None
    for j in range(begin, end):
        found = keys[j]
        if found is None or (passes is not None and passes[j] is not True):
            continue
        yield j, view.key(found[1]) if view is not None else rule_id + found[1], found[0]


def leading_not_true(values: list[Any], begin: int, end: int) -> int:
    """How many of ``values[begin:end]`` come before the first TRUE (a condition's value
    on a run of events)."""
    for j in range(begin, end):
        if values[j] is True:
            return j - begin
    return end - begin


def group_values(rule: CompiledRule, row: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple("" if row.get(g) is None else str(row.get(g)) for g in rule.facts.group_by)


def state_key(rule: CompiledRule, group: tuple[str, ...]) -> str:
    """The encoded :class:`~app.rules.statekey.StateKey` of ``rule``'s ``group``."""
    return StateKey(rule.facts.rule_id, group).encode()


def build_alert(
    rule: CompiledRule,
    status: Status,
    group: tuple[str, ...],
    row: Mapping[str, Any],
    starts_at_ms: int,
    ends_at_ms: int | None,
    event_ts_ms: int,
    values: Mapping[str, Any],
) -> Alert:
    """An alert transition with labels from the rule and group, annotations rendered."""
    return alert_of(rule.facts, status, group, row, starts_at_ms, ends_at_ms, event_ts_ms, values)


def alert_of(
    f: RuleFacts, status: Status, group: tuple[str, ...], row: Mapping[str, Any], starts_at_ms: int,
    ends_at_ms: int | None, event_ts_ms: int, values: Mapping[str, Any],
) -> Alert:  # fmt: skip
    """:func:`build_alert` from what the alerts take from the rule (also a rule no longer
    loaded: :mod:`app.rules.retire`)."""
    labels = dict(f.labels)
    labels.update(zip(f.group_by, group))
    context = {**row, **values}
    annotations = {k: render(v, context) for k, v in f.annotations.items()}
    if f.description and "description" not in annotations:
        annotations["description"] = f.description
    return Alert.build(
        rule_id=f.rule_id,
        rule_version=f.version,
        status=status,
        severity=f.severity,
        labels=labels,
        annotations=annotations,
        starts_at=format_ts(starts_at_ms),
        ends_at=None if ends_at_ms is None else format_ts(ends_at_ms),
        source=f.source,
        event_ts=format_ts(event_ts_ms),
        values=values,
    )


def group_row(rule: CompiledRule, group: tuple[str, ...]) -> dict[str, Any]:
    """The group fields as a row, for alerts raised by a timer (no event at hand)."""
    return dict(zip(rule.facts.group_by, group))
