"""The pure per-key rule evaluator. It knows nothing about Kafka.

For each event it runs every rule of the event's source, keeps per-(rule,
group) state in a :class:`StateStore`, and returns the alert transitions.
The Faust agents, the backtest and the tests all drive this same code.

Threshold lifecycle, in event time, per group key:

* the condition holds on an event: the streak starts (``since``) or grows;
  once it has held for ``consecutive`` events and for ``for`` (the event time
  since the streak began), the alert fires with ``starts_at = since``;
* the condition does not hold: a firing alert resolves with ``ends_at`` set
  to that event's time, and the streak resets.

Late events (older than the newest event already seen for the same rule and
group) are counted and skipped: applying them would reorder the state
machine's history. Given the same input order, the output is identical on
every run, so alert ids are deterministic.

State values are small JSON-able dicts. The store is told to ``put`` only
when the lifecycle changed; the newest event time is updated in place.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.alerts import Alert, Status
from app.events import Event, format_ts
from app.rules.loader import CompiledRule, RuleSet
from app.rules.template import render

logger = logging.getLogger(__name__)

State = dict[str, Any]


class StateStore(Protocol):
    """Where per-key state lives: a dict in tests and backtests, a Faust table live."""

    def get(self, key: str) -> State | None: ...

    def put(self, key: str, value: State) -> None: ...


class DictStore:
    """An in-memory :class:`StateStore`."""

    def __init__(self) -> None:
        self.data: dict[str, State] = {}

    def get(self, key: str) -> State | None:
        return self.data.get(key)

    def put(self, key: str, value: State) -> None:
        self.data[key] = value


@dataclass
class EvalStats:
    events: int = 0
    late: int = 0
    alerts: int = 0
    errors: int = 0
    per_rule_errors: dict[str, str] = field(default_factory=dict)


def group_values(rule: CompiledRule, row: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple("" if row.get(g) is None else str(row.get(g)) for g in rule.rule.group_by)


def state_key(rule: CompiledRule, group: tuple[str, ...]) -> str:
    return "\x1f".join((rule.id, *group))


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
    r = rule.rule
    labels = {"alertname": r.id, "severity": r.severity, **r.labels}
    labels.update(zip(r.group_by, group, strict=True))
    context = {**row, **values}
    annotations = {k: render(v, context) for k, v in r.annotations.items()}
    if r.description and "description" not in annotations:
        annotations["description"] = r.description
    return Alert.build(
        rule_id=r.id,
        rule_version=rule.version,
        status=status,
        severity=r.severity,
        labels=labels,
        annotations=annotations,
        starts_at=format_ts(starts_at_ms),
        ends_at=None if ends_at_ms is None else format_ts(ends_at_ms),
        source=r.source,
        event_ts=format_ts(event_ts_ms),
        values=values,
    )


class ThresholdLogic:
    """``where`` with optional ``for`` and ``consecutive``. See the module docstring."""

    def __init__(self, rule: CompiledRule) -> None:
        self.rule = rule
        self.for_ms = rule.rule.for_ms
        self.consecutive = rule.rule.consecutive
        self.columns = sorted(rule.where.columns)

    def on_event(
        self, store: StateStore, key: str, group: tuple[str, ...], ev: Event, row: Mapping[str, Any]
    ) -> tuple[list[Alert], bool]:
        """Return (alerts, was_late)."""
        st = store.get(key)
        if st is not None and ev.ts_ms < st["last"]:
            return [], True
        holds = self.rule.where(row) is True
        if st is None:
            if not holds:
                return [], False  # nothing to remember for a quiet key
            st = {"n": 0, "since": None, "firing": None, "last": ev.ts_ms}
        st["last"] = ev.ts_ms
        values = {c: row.get(c) for c in self.columns}
        if holds:
            if st["n"] == 0:
                st["since"] = ev.ts_ms
            st["n"] += 1
            alerts: list[Alert] = []
            ready = st["n"] >= self.consecutive and ev.ts_ms - st["since"] >= self.for_ms
            if st["firing"] is None and ready:
                st["firing"] = st["since"]
                alerts.append(
                    build_alert(self.rule, "firing", group, row, st["since"], None, ev.ts_ms, values)
                )
            if alerts or st["n"] <= self.consecutive:
                store.put(key, st)
            return alerts, False
        if st["firing"] is not None:
            started = st["firing"]
            store.put(key, {"n": 0, "since": None, "firing": None, "last": ev.ts_ms})
            alert = build_alert(self.rule, "resolved", group, row, started, ev.ts_ms, ev.ts_ms, values)
            return [alert], False
        if st["n"]:
            store.put(key, {"n": 0, "since": None, "firing": None, "last": ev.ts_ms})
        return [], False


class Evaluator:
    """Runs a :class:`RuleSet` over events of any source, one event at a time.

    Not thread-safe; one instance per consumer task. ``engine`` selects the
    rules that run here (``faust`` or ``spark``; ``both`` rules run on each).
    """

    def __init__(self, ruleset: RuleSet, store: StateStore | None = None, engine: str = "faust") -> None:
        self.store: StateStore = store if store is not None else DictStore()
        self.stats = EvalStats()
        self._by_source: dict[str, list[ThresholdLogic]] = {}
        for source in ("sensors", "logs", "finance"):
            self._by_source[source] = [ThresholdLogic(r) for r in ruleset.for_source(source, engine)]

    def process(self, source: str, ev: Event) -> list[Alert]:
        """Evaluate ``ev`` against every rule of ``source``; return alert transitions.

        A rule that raises is recorded in ``stats.per_rule_errors`` (its health)
        and skipped; the other rules still run.
        """
        self.stats.events += 1
        out: list[Alert] = []
        row = ev.fields
        for logic in self._by_source.get(source, ()):
            group = group_values(logic.rule, row)
            try:
                alerts, late = logic.on_event(self.store, state_key(logic.rule, group), group, ev, row)
            except Exception as exc:  # a bug must not stop the other rules
                self.stats.errors += 1
                self.stats.per_rule_errors[logic.rule.id] = repr(exc)
                logger.exception("rule %s failed on an event", logic.rule.id)
                continue
            if late:
                self.stats.late += 1
            out.extend(alerts)
        self.stats.alerts += len(out)
        return out


def run_backtest(ruleset: RuleSet, events: list[tuple[str, Event]], engine: str = "faust") -> list[Alert]:
    """Evaluate recorded ``(source, event)`` pairs in order with a fresh state."""
    ev = Evaluator(ruleset, engine=engine)
    out: list[Alert] = []
    for source, e in events:
        out.extend(ev.process(source, e))
    return out
