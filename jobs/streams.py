"""Every rule kind on Spark, run by the evaluator's own :class:`StreamEvaluator`, per
(stream, partition): the *stream path*.

Why not Spark's ``withWatermark`` and ``window()``: the Faust engine decides
lateness, window closes, absences and the ends of event alerts by a
per-partition event-time clock (the newest event time seen on that partition
of that stream) at every event. Spark's watermark is global to the query and
moves only between micro-batches, so its late-drop decisions depend on where
the batch boundaries fall. To give the same alert ids as the Faust engine for
any input and any batching, Spark here keeps the evaluator's partitioning:

* a *stream* is the evaluator's: a source's rules grouped by the topic key
  (``sensors`` for ``group_by: [device_id]``, and branches) or re-keyed by
  other group fields (``logs.by.client_ip``, ``logs.by.all``);
* the decoder (:class:`StreamRouter`) gives every valid event one *stream key*
  per stream of its source: the stream name and the partition the Faust
  worker would evaluate it on (the record's own partition for the topic-key
  stream; for a regrouped stream Kafka's murmur2 partition of the group
  values over ``partitions``, as the worker's regroup topic places it);
* :class:`StreamRunner` feeds one stream key's events, in (partition, offset)
  order, to a :class:`StreamEvaluator` restored from the group's state (the
  rule states, the partition clock and its timers). State lives in Spark's
  state store (``applyInPandasWithState``), one JSON object per stream key.

Conditions: each rule's ``where`` is computed natively by Spark SQL when it
can be (``__conds``, one boolean per such rule, see ``jobs.compile``); the
evaluator reads it through a stand-in, from the event's own fields (:data:`NATIVE_CONDS`,
so an event held for its time is released with its values). Conditions that read enrichment columns
or ``pct_change()`` (computed by the evaluator per group), ``having``,
``clear``, sequence steps, branch arms and aggregate inputs run as the
evaluator's compiled closures (pure Python, no UDF round trip per row).

Parallelism: one task per stream partition, as the Faust worker has, or more with a split
(``APP_SPARK_STREAM_SPLIT``, :class:`StreamRouter`'s ``split``). A split partition's groups are
shared among its parts (:func:`place`); each part's evaluator takes its own groups' events, and
every other event of the partition as a *tick* (its time and key, no fields:
:data:`app.rules.evaluator.TICK`), so the partition clock, the timers it makes due, and the
time bound's held and refused events are those of the partition's one evaluator, and so are
the alerts. The price: each event reaches every part of its partition (for its time only in
all but one).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

import orjson

from app.alerts import Alert
from app.errors import IngestDecodeError
from app.events import SCHEMAS, Event, dlq_record
from app.placement import partition_for
from app.rules.evaluator import LATE_TOPIC, TICK, Engine, EvalStats, Output, StreamEvaluator
from app.rules.expr import Compiled
from app.rules.loader import CompiledRule, RuleSet
from app.rules.logic.base import DictStore, State
from app.rules.retire import RulesRan, sweep
from app.rules.statekey import SEPARATOR, group_text
from app.tables import Tables, refused_row
from app.topics import ALERTS, DLQ
from jobs.placement import placed, unplaced

logger = logging.getLogger(__name__)

STREAM_PREFIX = "\x00s"  # no rule id starts with NUL; DLQ_KEY is "\x00dlq"
_SEP = SEPARATOR
#: output rows of the stream path sort after the keyed rules' at the same event
IDX_BASE = 1_000_000
#: the ``idx`` base of a stream partition's rows once its time bound held an event: its evaluator
#: may then take several events at one record, so its own order is the only one there
#: (``jobs.transitions.placed_by_idx``)
IDX_HELD = 2_000_000
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True)
class StreamSpec:
    """One evaluator stream of the Spark rules: its rules (evaluation order) and which of
    them take their ``where`` from Spark (``native``: rule id -> SQL, in ``__conds`` order)."""

    name: str
    source: str
    fields: tuple[str, ...] | None
    rule_ids: tuple[str, ...]
    native: tuple[tuple[str, str], ...]


@lru_cache(maxsize=4096)
def stream_key(name: str, partition: int, sub: int = 0, split: int = 1) -> str:
    """The state group of one stream partition, or with ``split`` above 1 of its ``sub``-th
    part (:func:`place`), salted to spread over the cores (:func:`jobs.placement.placed`;
    the parts of one partition on consecutive shuffle partitions); made once per stream and
    partition (the decoder asks for it at every record)."""
    if split == 1:
        return placed(f"{STREAM_PREFIX}{name}{_SEP}{partition}", name, partition)
    return placed(f"{STREAM_PREFIX}{name}{_SEP}{partition}/{sub}", name, partition * split + sub)


def parse_stream_key(key: str) -> tuple[str, int]:
    """The stream and the partition of a stream key (of a split partition's part too)."""
    name, _, part = unplaced(key)[len(STREAM_PREFIX) :].rpartition(_SEP)
    return name, int(part.partition("/")[0])


def sub_of(key: str) -> int:
    """The part of its partition a stream key is (0 for a partition not split)."""
    return int(unplaced(key).rpartition(_SEP)[2].partition("/")[2] or 0)


def place(text: str, partitions: int, split: int) -> tuple[int, int]:
    """The stream partition of a group's ``text`` (Kafka's partition for it over ``partitions``,
    as the worker's regroup topic places it) and its part of that partition (one of
    ``split``): both from one murmur2 hash, its remainder over ``partitions * split``, so the
    part does not depend on the partition."""
    slot = partition_for(text.encode(), partitions * split)  # split 1: Kafka's partition, part 0
    return slot % partitions, slot // partitions


def split_keys(name: str, partition: int, split: int) -> list[str]:
    """The keys of one stream partition's parts."""
    return [stream_key(name, partition, sub, split) for sub in range(split)]


def stream_keys(name: str, partitions: int, split: int = 1) -> list[str]:
    """Every state group of a stream: each partition's, or each part's of each."""
    return [k for p in range(partitions) for k in split_keys(name, p, split)]


def is_stream_key(key: str) -> bool:
    return key.startswith(STREAM_PREFIX)


def evaluator_streams(
    rules: Sequence[CompiledRule],
) -> list[tuple[str, str, tuple[str, ...] | None, list[str]]]:
    """``(name, source, fields, rule ids)`` of the evaluator's streams for ``rules``: the
    very grouping of :class:`app.rules.evaluator.Engine`."""
    engine = Engine(_Given(tuple(rules)), engine="spark")
    return [
        (s.name, s.source, s.fields, [r.id for r in s.evaluator.rules])
        for streams in engine.streams.values()
        for s in streams
        if s.evaluator.rules
    ]


@dataclass(frozen=True)
class _Given(RuleSet):
    """The rules given, each of them, whatever its ``engine:`` says: the plan already chose
    them (``backtest --engine spark`` runs unmarked rules too)."""

    def for_source(self, source: str, engine: str = "spark") -> list[CompiledRule]:
        del engine
        return [r for r in self.rules if r.rule.source == source]


@dataclass(frozen=True)
class StreamRouter:
    """Stream keys of an event (used by the decoder, on executors).

    ``record_partitions``: the topic-key stream runs on the record's own
    partition (live); otherwise on Kafka's partition for the key over
    ``partitions`` (a backtest, as ``app.backtest`` emulates it).
    """

    streams: Mapping[str, tuple[tuple[str, tuple[str, ...] | None], ...]]
    partitions: int = 1
    record_partitions: bool = False
    #: the parts of each stream partition, each evaluating some of its groups (docs/spark.md,
    #: "A stream partition split over the cores"); a key's part is :func:`place`'s
    split: int = 1
    #: (source, record partition) -> the stream keys of every record there, for a source whose
    #: streams are all the topic key's in a live query (they depend on nothing else)
    _by_record: dict[tuple[str, int], list[str]] = field(default_factory=dict, compare=False, repr=False)

    def keys(self, source: str, record_partition: int, ev: Event) -> list[str]:
        """The stream keys of ``ev`` (of ``source``, from ``record_partition``). The list may be
        shared with other events: the caller must not change it."""
        split = self.split
        if self.record_partitions and split == 1:
            found = self._by_record.get((source, record_partition))
            if found is not None:
                return found
        out = []
        topic_keys_only = True
        for name, fields in self.streams.get(source, ()):
            if fields is None:
                text = ev.key
            else:
                topic_keys_only = False
                values = ev.fields
                text = group_text(["" if values.get(f) is None else str(values.get(f)) for f in fields])
            part, sub = place(text, self.partitions, split)
            if fields is None and self.record_partitions:
                part = record_partition  # live: the record's own partition
            out.append(stream_key(name, part, sub, split))
        if self.record_partitions and topic_keys_only and split == 1:
            self._by_record[(source, record_partition)] = out
        return out


def router(
    specs: Sequence[StreamSpec], partitions: int, *, record_partitions: bool, split: int = 1
) -> StreamRouter | None:
    by_source: dict[str, list[tuple[str, tuple[str, ...] | None]]] = {}
    for s in specs:
        by_source.setdefault(s.source, []).append((s.name, s.fields))
    if not by_source:
        return None
    return StreamRouter({k: tuple(v) for k, v in by_source.items()}, partitions, record_partitions, split)


#: per Python worker process: each stream key's evaluator as its last micro-batch here left
#: it, with the state object that batch returned for the key (:meth:`StreamRunner.run_key`)
LIVE_EVALUATORS: dict[tuple[str, str], tuple[State, StreamEvaluator]] = {}
#: a tick's fields (StreamRunner.run_key): the evaluator reads, and never changes, them
TICK_FIELDS = {TICK: True}
#: more live evaluators than that: those of other queries are dropped (all, if there are none)
MAX_LIVE_EVALUATORS = 256

K = TypeVar("K", bound=tuple[Any, ...])


def make_room(cache: dict[K, Any], token: str, most: int) -> list[K]:
    """Drop the entries of a per-worker cache keyed by (query token, ...) when it holds ``most``:
    those of other queries (stopped, or run before in this worker), or all when every one is
    ``token``'s. The keys dropped."""
    if len(cache) < most:
        return []
    keys = list(cache)  # one step: a worker's owner thread (jobs.peers) takes and keeps entries too
    dropped = [k for k in keys if k[0] != token] or keys
    for k in dropped:
        cache.pop(k, None)
    return dropped


#: where an event's natively computed conditions travel in its fields (NUL: no schema field
#: starts with it), so an event the evaluator holds for its time (docs/event-time.md), or
#: keeps in its state, is evaluated with its own values when it is released; removed from
#: every output
NATIVE_CONDS = "\x00conds"
_NATIVE_CONDS_JSON = b'"\\u0000conds"'


@dataclass(frozen=True)
class _Read:
    """The stand-in ``where`` of a rule whose condition Spark computed: the row's own value."""

    i: int

    def __call__(self, row: Any) -> Any:
        values = row.get(NATIVE_CONDS)
        return None if values is None else values[self.i]


def without_conds(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k != NATIVE_CONDS} if NATIVE_CONDS in fields else fields


def _clean(value: bytes, nested: str | None = None) -> bytes:
    """A routed event (or, ``nested``: the late copy's event) as JSON without :data:`NATIVE_CONDS`."""
    if _NATIVE_CONDS_JSON not in value:
        return value
    obj = orjson.loads(value)
    if nested is None:
        return orjson.dumps(without_conds(obj))
    obj[nested] = without_conds(obj[nested])
    return orjson.dumps(obj)


class RegistryFollower:
    """The registry tables on an executor: read whole from the table topics, then followed
    (at most one poll per ``every_s``), as the Faust worker follows them."""

    def __init__(
        self, bootstrap: str, every_s: float = 1.0, security: Mapping[str, str] | None = None
    ) -> None:
        self.bootstrap, self.every_s = bootstrap, every_s
        self.security = dict(security or {})  # Spark-style kafka.* TLS/SASL options
        self.tables = Tables()
        self.positions: dict[tuple[str, int], int] = {}
        self.polled = 0.0

    def poll(self) -> Tables:
        if time.monotonic() - self.polled < self.every_s:
            return self.tables
        from app.tables import TABLES
        from jobs.kafka_client import KafkaSourceError, fetch, snapshot
        from jobs.kafka_offsets import KafkaSourceOptions

        by_topic = {t.topic: name for name, t in TABLES.items()}
        opts = KafkaSourceOptions.parse(
            {
                "kafka.bootstrap.servers": self.bootstrap,
                "subscribe": ",".join(sorted(by_topic)),
                "kafka.isolation.level": "read_committed",
                **self.security,
            },
            streaming=False,
        )
        try:
            snap = snapshot(opts)
        except KafkaSourceError as exc:  # no table topic yet: enrich as with an empty registry
            logger.warning("registry tables unreadable (%s); enriching with the rows known so far", exc)
            self.polled = time.monotonic()
            return self.tables
        for tp in snap.partitions:
            known = self.positions.get(tp, snap.earliest[tp])
            if known > snap.latest[tp]:  # not routine: the broker keeps its topics across runs
                logger.warning(
                    "registry topic %s-%d ends at %d, before the %d read so far: it was recreated; "
                    "reading it again from the start", *tp, snap.latest[tp], known,
                )  # fmt: skip
                known = snap.earliest[tp]
            start = max(known, snap.earliest[tp])
            for chunk in fetch(opts, tp, start, snap.latest[tp]) if start < snap.latest[tp] else ():
                for r in chunk:
                    try:
                        self.tables.apply(by_topic[tp[0]], (r.key or b"").decode(), r.value)
                    except (IngestDecodeError, ValueError) as exc:  # as the worker does: the task goes on
                        logger.warning(refused_row(tp[0], tp[1], r.offset, exc))
            self.positions[tp] = max(start, snap.latest[tp])
        self.polled = time.monotonic()
        return self.tables


class StreamRunner:
    """Picklable: the stream-path rules and specs; builds evaluators on executors.

    ``max_skew_ms`` is the evaluator's time bound (APP_MAX_EVENT_SKEW, -1: off); events
    it refuses become ``refused`` rows for ``dlq.events``. ``end_of_input`` (a backtest):
    a stream key's rows are all its input, so events still held at their end are refused.
    ``native`` (a backtest, see ``jobs.windows``): rule id -> the stream keys where that
    rule runs here; on every other key it runs natively and is left out of the evaluator.
    """

    def __init__(
        self, rules: Sequence[CompiledRule], specs: Sequence[StreamSpec], partitions: int,
        tables: Tables | None = None, bootstrap: str | None = None, max_skew_ms: int = -1,
        end_of_input: bool = False, security: Mapping[str, str] | None = None,
        native: Mapping[str, frozenset[str]] | None = None,
        ran: RulesRan | None = None, split: int = 1,
    ) -> None:  # fmt: skip
        self.max_skew_ms, self.end_of_input = max_skew_ms, end_of_input
        #: the parts of each stream partition (:class:`StreamRouter`'s ``split``)
        self.split = split
        #: the rules the query ran, by rule id and state stamp (``jobs.engine.rules_ran``)
        self.ran = ran if ran is not None else RulesRan()
        self.native = dict(native or {})
        self.rules = {r.id: r for r in rules}
        self.specs = {s.name: s for s in specs}
        self.partitions = partitions
        self.tables = tables
        self.bootstrap = bootstrap
        self.security = dict(security or {})
        self._follower: RegistryFollower | None = None
        #: this runner and its copies on the executors (a query's, or a backtest's): the
        #: live evaluators of one never serve another
        self.token = uuid.uuid4().hex

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_follower": None}

    def _tables(self, spec: StreamSpec) -> Tables:
        if self.tables is not None or not self.bootstrap:
            return self.tables or Tables()
        if not any(self.rules[r].rule.enrich or self.rules[r].rule.expect_from for r in spec.rule_ids):
            return Tables()
        if self._follower is None:
            self._follower = RegistryFollower(self.bootstrap, security=self.security)
        return self._follower.poll()

    def _evaluator(self, spec: StreamSpec, key: str) -> StreamEvaluator:
        position = {rid: i for i, (rid, _) in enumerate(spec.native)}
        rules = []
        for rid in spec.rule_ids:
            if rid in self.native and key not in self.native[rid]:
                continue  # run natively on this stream partition (jobs.windows)
            rule = self.rules[rid]
            if rid in position and rule.where is not None:
                w = rule.where
                stand_in = Compiled(_Read(position[rid]), w.type, w.text, w.columns, w.synthetic)
                rule = dataclasses.replace(rule, where=stand_in)
            rules.append(rule)
        evaluator = StreamEvaluator(
            spec.name, rules, DictStore(), self._tables(spec), self.partitions, self.max_skew_ms
        )
        evaluator.sub, evaluator.split = sub_of(key), self.split
        return evaluator

    def run_key(
        self, key: str, rows: list[tuple[Any, ...]], state: State | None
    ) -> tuple[Rows, State | None]:
        """One stream key's rows in (partition, offset) order -> (output rows, new state).

        A row is ``(fields_json, holds, ts_ms, part, offset, source, dlq, conds)``; ``holds``
        is False for an event of another part of a split partition, which the evaluator takes
        as a tick (:data:`app.rules.evaluator.TICK`), and None for its own; a runner of
        partitions not split has no ticks, whatever a row's ``holds`` says.

        The evaluator is restored from ``state``, unless ``state`` is the very object this
        worker's evaluator returned for the key at its last micro-batch (:func:`jobs.state.take_live`
        hands it back when Spark's state store holds what that batch stored): then that
        evaluator goes on, as the Faust worker's does between events.
        """
        name, partition = parse_stream_key(key)
        spec = self.specs[name]
        live = LIVE_EVALUATORS.pop((self.token, key), None)  # taken: a failed batch leaves none
        if live is not None and state is not None and state is live[0]:
            evaluator, restore = live[1], False  # it holds this very state: nothing to restore
            evaluator.stats = EvalStats()  # counts per micro-batch
        else:
            evaluator, restore = self._evaluator(spec, key), True
        store = evaluator.store
        assert isinstance(store, DictStore)  # noqa: S101
        out: Rows = []
        if restore and state is not None:
            # a rule that no longer runs in its version (removed or edited: the query followed
            # the files) leaves its states behind: where a restarted query restores the
            # partition, they go, and their open alerts end (app.rules.retire)
            store.data = dict(state["s"])
            clock = None if state.get("c") is None else int(state["c"])
            if clock is not None:
                evaluator.clocks[partition] = clock
            done = sweep(store, partition, evaluator.rules, self.ran, clock=clock, keep_records=False)
            out += [retired_row(a) for a in done.alerts]
            for gone in done.unended:
                logger.warning("state %r of a rule no longer running dropped; its alert is not ended", gone)
            evaluator.restore(store.items())
        part, offset, spec_source = 0, 0, spec.source
        held = False
        bounded, split = self.max_skew_ms >= 0, self.split > 1
        for fields_json, other, ts_ms, part, offset, source, _dlq, conds in rows:
            if other is False and split:  # another part's event: its time and key (jobs.compile.tasks)
                found = evaluator.tick(Event(fields_json or "", ts_ms, TICK_FIELDS), partition)
                if found is None:
                    continue
                result = found
            else:
                fields = orjson.loads(fields_json)
                # Arrow hands pandas numpy booleans; the evaluator tests `is True`
                if conds is not None and spec.native:
                    fields[NATIVE_CONDS] = [None if c is None else bool(c) for c in conds]
                result = evaluator.process(Event(str(fields[SCHEMAS[source].key]), ts_ms, fields), partition)
            held = held or (bounded and partition in evaluator.held_partitions())
            seq = IDX_BASE
            for a in result.alerts:
                body = a.to_json().decode()
                out.append(
                    ("alert", ALERTS, a.fingerprint, body, part, offset, seq, a.rule_id, a.status, a.alert_id)
                )
                seq += 1
            for topic, k, v in result.routed:
                out.append(
                    ("routed", topic, k.decode(), _clean(v).decode(), part, offset, seq, None, None, None)
                )
                seq += 1
            for rule_id, v in result.late:
                side = _clean(v, "event").decode()
                out.append(("side", LATE_TOPIC, rule_id, side, part, offset, seq, rule_id, None, None))
                seq += 1
            out += refused_rows(result, spec_source, part, offset, seq)
        if self.end_of_input:
            out += refused_rows(evaluator.finish(), spec_source, part, offset, IDX_BASE)
        if evaluator.stats.late:
            out.append(
                ("late", None, None, str(evaluator.stats.late), None, None, IDX_BASE, None, None, None)
            )
        for rule_id, failed in evaluator.stats.rule_errors.items():  # logged by the evaluator
            out.append(("error", None, None, str(failed), None, None, IDX_BASE, rule_id, None, None))
        if held:
            out = [(*r[:6], r[6] - IDX_BASE + IDX_HELD, *r[7:]) if r[6] >= IDX_BASE else r for r in out]
        if not store.data and partition not in evaluator.clocks:
            return out, None
        after = {"c": evaluator.clocks.get(partition), "s": store.data}
        if self._keeps_live(spec):
            make_room(LIVE_EVALUATORS, self.token, MAX_LIVE_EVALUATORS)
            LIVE_EVALUATORS[self.token, key] = (after, evaluator)
        return out, after

    def _keeps_live(self, spec: StreamSpec) -> bool:
        """Whether the evaluator may serve the key's next micro-batch in this worker: in a
        streaming query (a backtest has one batch), and with no registry table (a live
        evaluator would keep the tables, and the joins it cached, of the task that built it)."""
        if self.end_of_input or self.tables is not None:
            return False
        return not any(self.rules[r].rule.enrich or self.rules[r].rule.expect_from for r in spec.rule_ids)


def retired_row(a: Alert) -> tuple[Any, ...]:
    """The output row of an alert ended by a rule change (:mod:`app.rules.retire`): ahead of
    its group's rows, at no event of its own."""
    body = a.to_json().decode()
    return ("alert", ALERTS, a.fingerprint, body, None, None, -1, a.rule_id, a.status, a.alert_id)


def refused_rows(result: Output, source: str, part: int, offset: int, seq: int) -> Rows:
    """Output rows for the events the evaluator refused for their time (``refused``: a
    dead-letter record for ``dlq.events``, key = source, as the Faust worker writes it)."""
    out: Rows = []
    for ev, reason in result.refused:
        raw = orjson.dumps(without_conds(ev.fields))
        record = dlq_record(source, reason, raw, adapter="spark-engine", field="ts")
        out.append(("refused", DLQ, source, record.decode(), part, offset, seq, None, None, None))
        seq += 1
    return out
