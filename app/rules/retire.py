"""Ending the alerts of rules that no longer run: a rule file removed, or edited.

An edit gives a rule a new ``rule_version`` (:func:`app.rules.loader.rule_version`), and its
states of the old version are ignored as absent (:class:`~app.rules.logic.base.VersionedStore`);
a removed rule's states are not read at all. Without this module an alert firing when its
rule went would never get its ``resolved``: no evaluator speaks for it again.

:func:`sweep` runs once per store partition and rule set, before the partition's first batch
with those rules (the rule worker: at its start, and after each hot reload). For every state
of the partition whose rule and version are not among the rules running on that store, it
ends the open episode (firing: ``resolved``; pending or ``no_data``: ``inactive``), with the
alert id the evaluator would give it (``alert_id`` hashes the rule, the labels, ``starts_at``
and the status, never ``ends_at``), at the partition's clock, and deletes the state. A quiet
state is deleted with nothing to say (a removed rule's states no longer lie in the store for
ever).

The alert needs the old rule's labels, severity and annotations. After a reload the outgoing
rule set has them (``known``); after a restart the old rule is gone from the files, so the
sweep keeps a **rule record** per rule, version and partition in the store beside the states
(key :func:`record_key`, under a NUL head no rule id has, written once per rule set and
partition): what the alerts take from the rule (:class:`~app.alerts.RuleFacts`). A state
with an open episode and neither (written before rule records existed) is deleted with a
warning naming it: its alert is then ended by hand (``python -m app alerts resolve
--retired``, docs/alerts.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from app.alerts import Alert, RuleFacts, Status
from app.rules.loader import CompiledRule
from app.rules.logic.base import alert_of
from app.rules.state import is_current, partition_of, stamp
from app.rules.statekey import SEPARATOR, StateKey, is_clock_key

logger = logging.getLogger(__name__)

#: the head of a rule record's key (no rule id starts with NUL)
RECORD_PREFIX: Final = "\x00rule" + SEPARATOR
#: the annotation a retirement's transition carries, saying why it ended
ANNOTATION: Final = "retired"


class SweptStore(Protocol):
    """What the sweep needs of a store (:class:`~app.rules.logic.base.DictStore` has it)."""

    def items(self) -> list[tuple[str, dict[str, Any]]]: ...

    def put(self, key: str, value: dict[str, Any]) -> None: ...

    def delete(self, key: str) -> None: ...


@dataclass
class Swept:
    """What one :func:`sweep` did."""

    #: the ending transitions, in the store's order
    alerts: list[Alert] = field(default_factory=list)
    #: the states deleted (quiet ones included)
    deleted: int = 0
    #: keys of the states with an open episode whose rule record was missing (deleted, not ended)
    unended: list[str] = field(default_factory=list)


def record_key(rule_id: str, partition: int) -> str:
    """The key of the rule record of ``rule_id`` in ``partition``."""
    return RECORD_PREFIX + rule_id + SEPARATOR + str(partition)


def is_record_key(key: str) -> bool:
    return key.startswith(RECORD_PREFIX)


def rule_record(facts: RuleFacts, partition: int) -> dict[str, Any]:
    """The rule record of ``facts`` for ``partition`` (JSON-able, as the changelog keeps it)."""
    return {
        "partition": partition,
        "version": stamp(facts.version),
        "rule_id": facts.rule_id,
        "severity": facts.severity,
        "source": facts.source,
        "labels": dict(facts.labels),
        "annotations": dict(facts.annotations),
        "description": facts.description,
        "group_by": list(facts.group_by),
    }


def facts_of(record: Mapping[str, Any]) -> RuleFacts:
    """The :class:`RuleFacts` a rule record holds (:func:`rule_record`'s inverse)."""
    version = str(record["version"]).split("/", 1)[1]
    return RuleFacts(
        str(record["rule_id"]), version, str(record["severity"]), str(record["source"]),
        dict(record["labels"]), dict(record["annotations"]), str(record["description"]),
        tuple(record["group_by"]),
    )  # fmt: skip


class RulesRan(Mapping[tuple[str, str], RuleFacts]):
    """The facts of rules that ran, by rule id and :func:`stamp`, held as rule records (plain
    dicts) and each made a :class:`RuleFacts` when first asked for. Pickled as the records:
    the Spark engine ships it to its executors, and a compiled ``RuleFacts`` (the hot path's
    native build) does not unpickle."""

    def __init__(self, records: Iterable[Mapping[str, Any]] = ()) -> None:
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        for record in records:
            self.records[(str(record["rule_id"]), str(record["version"]))] = dict(record)
        self._facts: dict[tuple[str, str], RuleFacts] = {}

    @classmethod
    def of(cls, facts: Iterable[RuleFacts]) -> RulesRan:
        return cls(rule_record(f, 0) for f in facts)

    def __getitem__(self, key: tuple[str, str]) -> RuleFacts:
        found = self._facts.get(key)
        if found is None:
            found = self._facts[key] = facts_of(self.records[key])
        return found

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getstate__(self) -> dict[str, Any]:
        return {"records": self.records}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.records, self._facts = state["records"], {}


def version_of(st: Mapping[str, Any]) -> str:
    """A state's :func:`stamp` (a format-1 state's bare ``v`` stamped, as its migration would)."""
    return str(st["version"]) if is_current(dict(st)) else stamp(str(st.get("v")))


def open_episode(st: Mapping[str, Any]) -> tuple[Status, int] | None:
    """How the open episode of a rule state ends, and its ``starts_at``; None when quiet.

    Firing (every kind: ``firing_since``): ``resolved``. Pending (a streak short of
    ``consecutive`` or ``for``) or a ``no_data`` episode: ``inactive``. A rule with
    ``order: event_time`` keeps its kind's state under ``inner``."""
    inner = st.get("inner") if "queue" in st else st
    if not isinstance(inner, Mapping):
        return None
    if inner.get("firing_since") is not None:
        return "resolved", int(inner["firing_since"])
    if inner.get("streak") and inner.get("streak_since") is not None:
        return "inactive", int(inner["streak_since"])
    if inner.get("no_data_since") is not None:
        return "inactive", int(inner["no_data_since"])
    return None


def _why(facts: RuleFacts, edited: bool) -> RuleFacts:
    """``facts`` with the :data:`ANNOTATION` saying why the alert ended."""
    rule = f"rule {facts.rule_id} version {facts.version}"
    how = "was edited: its new version starts afresh" if edited else "no longer runs on this engine"
    note = f"ended at a rule change: {rule} {how}"
    return RuleFacts(
        facts.rule_id, facts.version, facts.severity, facts.source, facts.labels,
        {**facts.annotations, ANNOTATION: note}, facts.description, facts.group_by,
    )  # fmt: skip


def ending(
    key: str, st: Mapping[str, Any], facts: RuleFacts, edited: bool, clock: int | None
) -> Alert | None:
    """The transition that ends the open episode of state ``st`` (under ``key``) of the rule
    ``facts`` tell of, at ``clock`` (None: the state's last event); None when quiet. ``edited``:
    the rule runs in another version (else it no longer runs), said in :data:`ANNOTATION`."""
    episode = open_episode(st)
    if episode is None:
        return None
    status, starts = episode
    group = tuple(str(g) for g in st.get("group", StateKey.parse(key).group))
    at = max(starts, clock if clock is not None else int(st.get("last_event", starts)))
    row = dict(zip(facts.group_by, group, strict=False))  # as a timer's alert has it
    return alert_of(_why(facts, edited), status, group, row, starts, at, at, {"retired": True})


def _clock(items: Iterable[tuple[str, Mapping[str, Any]]], partition: int) -> int | None:
    """The partition's latest stream clock its clock records hold (None: none)."""
    found = [
        int(st["clock"])
        for key, st in items
        if is_clock_key(key) and partition_of(dict(st)) == partition and st.get("clock") is not None
    ]
    return max(found, default=None)


def by_partition(items: Iterable[tuple[str, Any]]) -> dict[int, list[tuple[str, dict[str, Any]]]]:
    """A store's records grouped by partition, for the sweeps of several partitions (one pass
    over the store, not one per partition)."""
    found: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for key, st in items:
        if isinstance(st, dict):
            found.setdefault(partition_of(st), []).append((key, st))
    return found


def sweep(
    store: SweptStore, partition: int, running: Sequence[CompiledRule],
    known: Mapping[tuple[str, str], RuleFacts] | None = None,
    items: list[tuple[str, dict[str, Any]]] | None = None, clock: int | None = None,
    keep_records: bool = True,
) -> Swept:  # fmt: skip
    """End the open episodes of ``partition``'s states whose rule and version are not in
    ``running`` (the rules whose states live in ``store``), delete those states, and keep the
    rule records of ``partition`` to ``running`` (see the module's doc). ``known``: the facts
    of rules that ran earlier in this process, by rule id and :func:`stamp`. ``items``: the
    partition's records (:func:`by_partition`), when the caller has them; else read here.
    ``clock``: the partition's clock, when the store keeps none (the Spark engine's stream
    state); else the latest of its clock records. ``keep_records`` False: no rule record is
    written (the Spark engine keeps the rules its query ran in its checkpoint instead)."""
    known = known or {}
    if items is None:
        items = by_partition(store.items()).get(partition, [])
    current = {r.id: stamp(r.version) for r in running}
    records: dict[tuple[str, str], RuleFacts] = {}
    for key, st in items:
        if is_record_key(key):
            try:
                records[(str(st["rule_id"]), str(st["version"]))] = facts_of(st)
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                logger.warning("rule record %r unreadable (%r): written again", key, exc)
    done = Swept()
    if clock is None:
        clock = _clock(items, partition)
    for key, st in items:
        if key.startswith("\x00"):
            continue
        rid = StateKey.rule_of(key)
        version = version_of(st)
        if current.get(rid) == version:
            continue
        store.delete(key)
        done.deleted += 1
        if not is_current(st):  # format 1 (before 2026-11-26): its kind is the gone rule's
            done.unended.append(key)
            continue
        if open_episode(st) is None:
            continue
        facts = known.get((rid, version)) or records.get((rid, version))
        end = None if facts is None else ending(key, st, facts, rid in current, clock)
        if end is None:
            done.unended.append(key)
        else:
            done.alerts.append(end)
    for key, st in items:
        if is_record_key(key) and current.get(str(st.get("rule_id"))) != st.get("version"):
            store.delete(key)
    present = dict(items)
    for rule in running if keep_records else ():
        wanted = rule_record(rule.facts, partition)
        key = record_key(rule.id, partition)
        if present.get(key) != wanted:
            store.put(key, wanted)
    return done
