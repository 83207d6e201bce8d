"""The worker's swappable part: the current rules and their engine (:class:`Runtime`), the rules
to start with (:func:`initial_rules`) and hot reload (:func:`maybe_reload`).

A worker never dies on a rule file: a set that does not load is logged with every problem
and the last good rules keep running."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from agents.metrics import RELOADS, RETIRED, RULE_ERRORS, RULE_EVENTS, RULE_MATCHED, RULES
from agents.state_store import TableStore
from agents.topics import extra_topics
from app.alerts import Alert, RuleFacts
from app.kafka.admin import ensure_topics
from app.rules.evaluator import DictStore, Engine, State, Stream
from app.rules.loader import CompiledRule, RuleSet, check_rule_files, load_what_loads, log_rejection
from app.rules.retire import by_partition, sweep
from app.rules.state import partition_of, stamp
from app.runtime.settings import Settings
from app.tables import Tables

logger = logging.getLogger(__name__)

#: how often the rule files are checked for edits
RELOAD_INTERVAL_S = 1.0


@dataclass
class Runtime:
    """The swappable part: the current rules and their engine."""

    settings: Settings
    ruleset: RuleSet
    tables: Tables
    stores: dict[str, TableStore]
    engine: Engine = field(init=False)
    restored: set[tuple[str, int]] = field(default_factory=set)
    tables_ready: asyncio.Event = field(default_factory=asyncio.Event)
    rejected: dict[str, str] | None = None  # file hashes of the last rejected edit, logged once
    #: the (store, partition) pairs swept since the rules last changed (:meth:`retire`)
    swept: set[tuple[str, int]] = field(default_factory=set)
    #: what the alerts of every rule this worker ran took from it, by rule id and state stamp
    known: dict[tuple[str, str], RuleFacts] = field(default_factory=dict)
    #: per store, its records by partition, read once for the sweeps of a rule set (:meth:`retire`)
    unswept: dict[str, dict[int, list[tuple[str, State]]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.engine = self.build(self.ruleset)
        self._declare_counts()

    def _declare_counts(self) -> None:
        """Show every rule this worker runs in the per-rule counters, at 0 until it evaluates an
        event (a rule the worker does not run, ``engine: spark``, has no series)."""
        for streams in self.engine.streams.values():
            for s in streams:
                for r in s.evaluator.rules:
                    RULE_EVENTS.labels(r.id)
                    RULE_MATCHED.labels(r.id)
                    RULE_ERRORS.labels(r.id)

    def build(self, ruleset: RuleSet) -> Engine:
        def store_of(stream: str) -> DictStore:
            source, _, grouping = stream.partition(".by.")
            return self.stores[f"{source}.regroup" if grouping else source].store

        return Engine(
            ruleset, engine="faust", tables=self.tables, partitions=self.settings.partitions, stores=store_of,
            max_skew_ms=self.settings.max_event_skew_ms,
        )  # fmt: skip

    def swap(self, ruleset: RuleSet) -> None:
        self.count_rules()  # the outgoing engine's last counts
        for rule in self.running():
            self.known[(rule.id, stamp(rule.version))] = rule.facts
        self.ruleset, self.engine = ruleset, self.build(ruleset)
        self._declare_counts()
        self.restored.clear()
        self.swept.clear()
        self.unswept.clear()
        RULES.set(len(ruleset.rules))

    def count_rules(self) -> dict[str, tuple[int, int]]:
        """Add the events each rule evaluated and matched since the last call to
        ``worker_rule_events_total`` and ``worker_rule_matched_total``, and its evaluations
        that raised to ``worker_rule_errors_total`` (the engine counts them per batch and
        rule; this runs once a second and before a reload, on the event loop that runs the
        batches). Returns the events and matches it added."""
        counts = self.engine.take_rule_counts()
        for rule_id, (seen, matched) in counts.items():
            if seen:
                RULE_EVENTS.labels(rule_id).inc(seen)
            if matched:
                RULE_MATCHED.labels(rule_id).inc(matched)
        for rule_id, failed in self.engine.take_rule_errors().items():
            RULE_ERRORS.labels(rule_id).inc(failed)
        return counts

    def running(self, store: str | None = None) -> list[CompiledRule]:
        """The rules this worker runs (whose states live in ``store``, when given)."""
        found: list[CompiledRule] = []
        for source, streams in self.engine.streams.items():
            for s in streams:
                if store is None or store == (f"{source}.regroup" if s.fields is not None else source):
                    found += s.evaluator.rules
        return found

    def retire(self, store: str, partition: int) -> list[Alert]:
        """End the alerts of the rules no longer running whose states ``partition`` of
        ``store`` holds, once per partition and rule set (:func:`app.rules.retire.sweep`): at
        the worker's start, and after each reload, before the partition's first batch with
        the new rules (which would take an old version's state as absent and write over it).
        The wiring sends what it returns ahead of that batch's alerts."""
        if (store, partition) in self.swept:
            return []
        self.swept.add((store, partition))
        # one pass over the store for all its partitions: a partition's records change only
        # once it is swept (its batches and timers run after), or when it moves (:meth:`forget`)
        index = self.unswept.get(store)
        if index is None:
            index = self.unswept[store] = by_partition(self.stores[store].items())
        items = index.pop(partition, [])
        done = sweep(self.stores[store].store, partition, self.running(store), self.known, items)
        if done.deleted:
            quiet = done.deleted - len(done.alerts) - len(done.unended)
            RETIRED.labels("ended").inc(len(done.alerts))
            RETIRED.labels("quiet").inc(quiet)
            RETIRED.labels("unended").inc(len(done.unended))
            logger.info(
                "%s partition %d: %d state(s) of rules no longer running deleted, %d alert(s) ended",
                store, partition, done.deleted, len(done.alerts),
            )  # fmt: skip
        for key in done.unended:
            logger.warning(
                "%s partition %d: state %r had an open alert, but its rule is gone and no record of "
                "it was kept (a state older than this release): deleted; end the alert with "
                "`python -m app alerts resolve --retired`", store, partition, key,
            )  # fmt: skip
        return done.alerts

    def stream(self, source: str, name: str) -> Stream | None:
        return next((s for s in self.engine.streams.get(source, ()) if s.name == name), None)

    def forget(self, partitions: Collection[int]) -> None:
        """Drop everything memory holds of ``partitions`` (their states, unwritten changes,
        clocks, held events and timers): they moved to another worker, or are about to be
        restored from the changelogs. A stream's first batch of such a partition later
        re-arms its timers from the restored states (:meth:`ensure_restored`)."""
        numbers = set(partitions)
        if not numbers:
            return
        dropped = sum(store.forget(numbers) for store in self.stores.values())
        for streams in self.engine.streams.values():
            for s in streams:
                for p in numbers:
                    s.evaluator.forget(p)
        self.restored = {(name, p) for name, p in self.restored if p not in numbers}
        self.swept = {(name, p) for name, p in self.swept if p not in numbers}
        self.unswept.clear()  # read again: the partitions restored meanwhile bring their records
        logger.info("partitions %s: %d states dropped from memory", sorted(numbers), dropped)

    def ensure_restored(self, stream: Stream, store: TableStore, partition: int) -> None:
        """Re-arm the timers of a partition's persisted state, once per partition and rule set."""
        if (stream.name, partition) in self.restored:
            return
        self.restored.add((stream.name, partition))
        stream.evaluator.restore((k, v) for k, v in store.items() if partition_of(v) == partition)


def initial_rules(settings: Settings) -> tuple[RuleSet, dict[str, str] | None]:
    """The rules to start with, and the file hashes of a rejected set (None: all valid).

    A worker never dies on a rule file: when the directory does not load as a whole, the
    problems are logged and the worker starts with the files that load on their own (and
    together; else with none, :func:`app.rules.loader.load_what_loads`), as a hot reload keeps
    the last good rules. Fixing a file brings the whole set in at the next reload tick."""
    ruleset, rejected, error = load_what_loads([settings.rules_dir])
    if error is None:
        return ruleset, None
    log_rejection(logger, " at start; starting with the valid files only", error)
    RELOADS.labels("rejected").inc()
    return ruleset, rejected


async def maybe_reload(settings: Settings, rt: Runtime) -> None:
    """Swap in edited rules when they are valid; keep the last good ones otherwise.

    A rejected set of files is remembered by its hashes and not parsed again until one of
    them changes (logged once, until the rules running change or come back). Loading runs
    in a thread, so the event loop keeps evaluating with the current rules meanwhile;
    nothing it raises stops the worker (the rule limits bound its time, see
    docs/rule-limits.md). Should the new rules' topics fail to be created, the next tick
    tries again."""
    check = await asyncio.to_thread(check_rule_files, [settings.rules_dir], rt.ruleset, rt.rejected)
    rt.rejected = check.rejected
    if check.error is not None:
        RELOADS.labels("rejected").inc()
        log_rejection(logger, ", keeping the last good rules", check.error)
        return
    ruleset = check.ruleset
    if ruleset is None:
        return
    try:
        await ensure_topics(settings, settings.partitions, settings.replication_factor,
                            specs=extra_topics(ruleset, settings))  # fmt: skip
    except Exception as exc:  # the broker's trouble, not the files': the next tick tries again
        logger.warning("reload postponed, the new rules' topics could not be created: %r", exc)
        return
    rt.swap(ruleset)
    rt.rejected = None
    RELOADS.labels("applied").inc()
    logger.info(
        "reloaded %d rules (%s)", len(ruleset.rules), ", ".join(f"{r.id}@{r.version}" for r in ruleset.rules)
    )
