"""The per-group threshold lifecycle on Spark, run by the SAME pure code as the Faust engine.

:class:`GroupRunner` takes the task rows of one state key (one rule and group,
see ``jobs.compile``), sorts them by ``(partition, offset)`` and feeds them to
the evaluator's ``ThresholdLogic``, whose alerts come from ``build_alert``,
so alert ids are identical to the Faust engine's for the same input order.
The condition was computed natively by Spark (``__holds``); the logic reads
it through a stand-in ``where`` that returns that column, and still sees the
full event row for annotations and values. Late events are skipped (and
counted) exactly as by the evaluator.

State: keys are hashed into buckets (:data:`STATE_BUCKETS` for a new checkpoint), and
``applyInPandasWithState`` keeps one JSON object per bucket mapping state key
-> the evaluator's state dict (stamped with the rule version, like the
Faust engine's), compressed (:data:`STATE_CODEC`). One Python call per touched bucket, not per
key: per-call overhead, not the rules, dominated with thousands of keys per micro-batch. The
bucket count and the codec are part of the checkpoint, which records them
(``jobs.engine.state_layout``). A backtest runs the same code over ``mapInPandas`` with empty
state.

Output rows (:data:`OUTPUT_SCHEMA`): ``alert`` (topic ``alerts``, key =
fingerprint, value = the alert JSON), ``dlq`` (topic ``dlq.events``, key =
source), ``late`` (value = how many events were skipped; not produced), ``error``
(value = how many evaluations of the rule raised; logged where they ran, counted by the
sink, not produced), ``state`` (value = where a stateful group's micro-batch found its state:
``live`` in its worker, at a ``peer`` worker that holds it live, ``stored``, or ``new``; counted
by the sink).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from itertools import groupby
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from app.events import Event
from app.rules.evaluator import State, ThresholdLogic, group_values, state_key
from app.rules.expr import Compiled
from app.rules.loader import CompiledRule
from app.rules.logic.base import DictStore
from app.rules.retire import RulesRan, sweep
from app.rules.state import migrate, stamp
from app.topics import ALERTS, DLQ
from jobs import peers
from jobs.compile import DLQ_KEY, SparkPlan, rule_of_key
from jobs.streams import STREAM_PREFIX, StreamRunner, is_stream_key, make_room, retired_row

logger = logging.getLogger(__name__)

OUTPUT_SCHEMA = (
    "kind string, topic string, key string, value string, part int, offset bigint, idx int, rule string, "
    "status string, alert_id string"
)
OUTPUT_COLUMNS = [c.split()[0] for c in OUTPUT_SCHEMA.split(", ")]
#: each state group's value in Spark's state store, per codec: ``json``, the JSON text (checkpoints
#: written before checkpoints recorded their codec), or ``zstd``, that JSON compressed (level 1,
#: after the JSON's length in 8 bytes): about an eighth of the text, where every micro-batch
#: keeps each touched group's whole value in the JVM, stores it and hands it to Python
STATE_SCHEMAS = {"json": "json string", "zstd": "zjson binary"}
#: the codec of a new checkpoint (``jobs.engine.state_layout`` records it)
STATE_CODEC = "zstd"
#: the codec of a checkpoint written before checkpoints recorded theirs
LEGACY_STATE_CODEC = "json"
#: the keyed path's state buckets of a new checkpoint. Each costs a Python call per micro-batch
#: that touches it (with a thousand devices, every one): 8 rather than 64 took the threshold
#: bench pack's 10,000-event micro-batches from 0.66-0.82 s to 0.55-0.64 s (docs/spark.md)
STATE_BUCKETS = 8
#: the buckets of a checkpoint written before checkpoints recorded theirs
LEGACY_STATE_BUCKETS = 64
HOLDS = "\x00holds"  # cannot clash with a schema field name
Rows = list[tuple[Any, ...]]
#: per Python worker process: each bucket's state as its last micro-batch here left it, as
#: the value that batch stored (:func:`encode_states`) and as the objects themselves
#: (:func:`streaming_fn`)
LIVE_STATES: dict[tuple[str, Any], tuple[str | bytes, dict[str, State]]] = {}
#: more live buckets than that: those of other queries are dropped (all, if there are none)
MAX_LIVE_STATES = 256
#: the dead letters' state group (:func:`bucket`): it keeps no state
DLQ_GROUP = "-1"
_ROW_COLUMNS = ("__fields", "__holds", "__ts_ms", "__part", "__offset", "__source", "__dlq", "__conds")


def _holds(row: Any) -> Any:
    return row.get(HOLDS)


def with_native_condition(rule: CompiledRule) -> CompiledRule:
    """``rule`` whose ``where`` reads the condition Spark already computed into the row."""
    if rule.where is None:
        msg = f"rule {rule.id} has no condition; only threshold rules run on the spark engine"
        raise ValueError(msg)
    stand_in = Compiled(fn=_holds, type="boolean", text=rule.where.text, columns=rule.where.columns)
    return dataclasses.replace(rule, where=stand_in)


class _OneKeyStore:
    """The evaluator's StateStore over the single key of one group, version-stamped."""

    def __init__(self, value: State | None, version: str, key: str = "") -> None:
        self.version = stamp(version)
        value = None if value is None else migrate(key, value, "threshold")  # (the current format: as is)
        self.value = value if value is not None and value.get("version") == self.version else None

    def get(self, _key: str) -> State | None:
        return self.value

    def put(self, _key: str, value: State) -> None:
        value["version"] = self.version
        self.value = value

    def delete(self, _key: str) -> None:
        self.value = None


class GroupRunner:
    """Picklable: holds the rules by id; runs on executors."""

    def __init__(
        self, plan: SparkPlan, streams: StreamRunner | None = None,
        ran: RulesRan | None = None, stale: Mapping[str, bytes] | None = None,
    ) -> None:  # fmt: skip
        self.rules = {r.rule.id: (r.idx, with_native_condition(r.rule)) for r in plan.rules}
        self.streams = streams
        #: the rules the query ran, by rule id and state stamp (``jobs.engine.rules_ran``)
        self.ran = ran if ran is not None else RulesRan()
        #: the digests of state groups' values whose alerts a start ended (:mod:`jobs.unread`):
        #: a group whose stored value is still that one starts afresh
        self.stale = dict(stale or {})
        #: this runner and its copies on the executors: one query's live states (:func:`streaming_fn`)
        self.token = uuid.uuid4().hex
        #: signs what its copies send each other about their live states (:mod:`jobs.peers`)
        self.secret = os.urandom(32)

    def run_key(
        self, key: str, rows: list[tuple[Any, ...]], state: State | None
    ) -> tuple[Rows, State | None]:
        """One state key's rows, in arrival order (:func:`arrival_order`) -> (output rows, new state or None).

        A row is ``(fields_json, holds, ts_ms, part, offset, source, dlq, conds)``; a
        stream key's rows go to :class:`jobs.streams.StreamRunner`.
        """
        if key == DLQ_KEY:
            return [("dlq", DLQ, r[5], r[6], r[3], r[4], -1, None, None, None) for r in rows], None
        if is_stream_key(key):
            if self.streams is None:
                msg = f"a stream task {key!r} but no stream-path rules"
                raise ValueError(msg)
            return self.streams.run_key(key, rows, state)
        idx, rule = self.rules[rule_of_key(key)]
        logic = ThresholdLogic(rule)
        store = _OneKeyStore(state, rule.version, key)
        out: Rows = []
        late = failed = 0
        for fields_json, holds, ts_ms, part, offset, _source, _dlq, _conds in rows:
            if store.value is None and holds is not True:
                continue  # ThresholdLogic's quiet-key case: nothing to do, nothing to remember
            row = orjson.loads(fields_json)
            group = group_values(rule, row)
            row[HOLDS] = holds
            try:
                alerts, was_late = logic.on_event(
                    store, state_key(rule, group), group, Event("", ts_ms, row), row
                )
            except Exception:  # as the evaluator: one rule's bug must not stop the query
                logger.exception("rule %s failed", rule.id)
                failed += 1
                continue
            late += was_late
            for a in alerts:
                body = a.to_json().decode()
                out.append(
                    ("alert", ALERTS, a.fingerprint, body, part, offset, idx, a.rule_id, a.status, a.alert_id)
                )
        if late:
            out.append(("late", None, None, str(late), None, None, idx, rule.id, None, None))
        if failed:
            out.append(("error", None, None, str(failed), None, None, idx, rule.id, None, None))
        return out, store.value

    def current(self, states: dict[str, State]) -> tuple[dict[str, State], Rows]:
        """A restored group's ``states`` less the keyed rules' that no longer run here in their
        version (removed or edited: the query followed the files, ``jobs.engine.RuleFollower``),
        and the rows that end their open alerts (:func:`app.rules.retire.ending`, from what
        the query's record of the rules it ran says of them). Stream keys keep theirs
        (:class:`jobs.streams.StreamRunner` sweeps its own at its restore)."""
        # keyed states keep no partition clock: each ends at its last event
        store = DictStore(dict(states))
        rules = [rule for _, rule in self.rules.values()]
        done = sweep(store, 0, rules, self.ran, items=list(states.items()), keep_records=False)
        for key in done.unended:
            logger.warning("keyed state %r of a rule no longer running dropped, its alert not ended", key)
        return store.data, [retired_row(a) for a in done.alerts]

    def run_many(self, pdfs: Iterator[pd.DataFrame], states: dict[str, State]) -> Rows:
        """Rows of any keys; ``states`` (key -> state) is read and updated in place."""
        return self.run_frame(one_frame(pdfs), states)

    def run_frame(self, pdf: pd.DataFrame | None, states: dict[str, State]) -> Rows:
        """:meth:`run_many` over the rows of one frame (None: none).

        Plain Python lists, not pandas groups: per-group pandas calls cost more
        than the rules when a micro-batch touches thousands of keys.
        """
        if pdf is None:
            return []
        keys = pdf["__key"].tolist()
        rows = list(zip(*(pdf[c].tolist() for c in _ROW_COLUMNS), strict=True))
        # each key's rows in arrival order (:func:`arrival_order`): the distinct keys sorted in
        # Python, the rows by numpy (pandas' own sort would not do: it hashes strings up to their
        # first NUL, and every stream key starts with one)
        rank = {k: i for i, k in enumerate(sorted(set(keys)))}
        codes = np.fromiter((rank[k] for k in keys), dtype=np.int64, count=len(keys))
        arrival = pdf["__arrival"] if "__arrival" in pdf.columns else None
        part, offset, ts = pdf["__part"].to_numpy(), pdf["__offset"].to_numpy(), pdf["__ts_ms"].to_numpy()
        order = arrival_order(codes, part, offset, arrival, ts)
        out: Rows = []
        for key, members in groupby(order, key=keys.__getitem__):
            produced, after = self.run_key(key, [rows[i] for i in members], states.get(key))
            out += produced
            if after is None:
                states.pop(key, None)
            else:
                states[key] = after
        return out


def arrival_order(codes: Any, part: Any, offset: Any, arrival: pd.Series | None, ts: Any) -> list[int]:
    """The rows of each key (``codes``, ascending) in the order they reached their topic.

    Each Kafka partition's rows keep their offset order. A key whose rows come from several
    partitions (a stream regrouped by other fields than the topic key, ``group_by: [client_ip]``
    or none; a threshold rule grouped so; the dead letters) has them merged: by arrival,
    Kafka's timestamp, then by event time (``ts``) among rows that arrived in the same
    millisecond (a replay or a burst puts many there, minutes of event time apart), then
    partition and offset; both times made non-decreasing along each partition (their running
    maximum there), so that no partition's rows change order. The live worker forwards them
    to its regroup topic in the same order (``agents.merge``). Before, such a key took one partition's rows of
    the micro-batch, then the next one's: each partition after the first went back in time by
    up to the batch's span, and windows, absence and sequences took its events for late ones
    (most alerts of such rules were lost while the query caught up).

    Rows with no arrival (a file's lines: one partition) keep (partition, offset) order."""
    by_offset = np.lexsort((offset, part, codes))
    if arrival is None or len(by_offset) < 2 or not arrival.notna().any():
        return list(by_offset.tolist())
    c, p = codes[by_offset], part[by_offset]
    new_key = c[1:] != c[:-1]
    starts = np.ones(len(by_offset), dtype=np.int64)
    starts[1:] = new_key | (p[1:] != p[:-1])
    segment = np.cumsum(starts)  # one per (key, partition), in offset order
    if segment[-1] == 1 + np.count_nonzero(new_key):
        return list(by_offset.tolist())  # every key from one partition (a topic-key stream): as is
    arrived = _running(arrival.to_numpy(dtype="float64", na_value=-1.0), by_offset, segment)
    timed = _running(np.nan_to_num(np.asarray(ts, dtype="float64"), nan=-1.0), by_offset, segment)
    return list(np.lexsort((offset, part, timed, arrived, codes)).tolist())


def _running(values: Any, by_offset: Any, segment: Any) -> Any:
    """``values``' running maximum along each segment of the rows in ``by_offset`` order, per
    row (as dense ranks: the sums below stay small)."""
    ranks = np.unique(values, return_inverse=True)[1].astype(np.int64)[by_offset]
    span = int(ranks.max()) + 1
    running = np.maximum.accumulate(ranks + segment * span) - segment * span
    out = np.empty_like(running)
    out[by_offset] = running
    return out


@functools.cache
def _zstd() -> pa.Codec:
    return pa.Codec("zstd", compression_level=1)


def encode_states(states: dict[str, State], codec: str) -> str | bytes:
    """A state group's states as its value in the state store (:data:`STATE_SCHEMAS`): the same
    states give the same value (sorted keys; zstd is deterministic at one level)."""
    text = orjson.dumps(states, option=orjson.OPT_SORT_KEYS)
    if codec == "json":
        return text.decode()
    return len(text).to_bytes(8, "little") + _zstd().compress(text, asbytes=True)


def decode_states(stored: str | bytes | bytearray) -> dict[str, State]:
    """The states of a value :func:`encode_states` made (the codec's value type tells it)."""
    if isinstance(stored, str):  # the json codec's
        return orjson.loads(stored)
    raw = bytes(stored)  # Spark may hand a bytearray
    size = int.from_bytes(raw[:8], "little")
    states: dict[str, State] = orjson.loads(_zstd().decompress(raw[8:], decompressed_size=size, asbytes=True))
    return states


def _frame(rows: Rows) -> pd.DataFrame:
    return pd.DataFrame.from_records(rows, columns=OUTPUT_COLUMNS)


def one_frame(pdfs: Iterator[pd.DataFrame]) -> pd.DataFrame | None:
    """The task rows pyspark hands a group, in one frame; None when there are none."""
    frames = [p for p in pdfs if len(p)]
    return pd.concat(frames, ignore_index=True) if frames else None


def streaming_fn(
    runner: GroupRunner, codec: str = STATE_CODEC
) -> Callable[[Any, Iterator[pd.DataFrame], GroupState], Iterator[pd.DataFrame]]:
    empty = encode_states({}, codec)

    def fn(bucket: Any, pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        exists = state.exists
        before = state.get[0] if exists else empty
        rows, after, found = evaluate(runner, codec, (runner.token, bucket), before, one_frame(pdfs))
        if after != before:
            state.update((after,))
        yield _frame([*rows, ("state", None, None, found if exists else "new", *_NO_PLACE)])

    return fn


#: a ``state`` row's columns after its value: it says where its group's state came from
_NO_PLACE = (None, None, -1, None, None, None)


def evaluate(
    runner: GroupRunner, codec: str, slot: tuple[str, Any], before: str | bytes, pdf: pd.DataFrame | None
) -> tuple[Rows, str | bytes, str]:
    """A state group's micro-batch: (output rows, the value to store, where the state came
    from). ``before`` is the value Spark's state store holds for the group.

    The state is this worker's own live one (``live``), else that of the worker that holds it
    live (``peer``: :mod:`jobs.peers` sends it the rows), else restored from ``before``
    (``stored``), after which this worker holds it and answers for it."""
    states = take_live(slot, before)
    if states is not None:
        return (*_run(runner, codec, slot, states, pdf), "live")
    mine = peers.owner()
    if peers.ENABLED and not mine.owns(slot):
        reply = peers.ask(slot, runner.secret, peers.digest(before), to_wire(pdf))
        if reply is not None:
            rows, after = reply
            return rows, after, "peer"
    group = slot[1][0] if isinstance(slot[1], tuple) else slot[1]  # pyspark hands the key as a tuple
    swept = runner.stale.get(str(group))
    stored = {} if swept is not None and peers.digest(before) == swept else decode_states(before)
    states, retired = runner.current(stored)
    rows, after = _run(runner, codec, slot, states, pdf)
    result = (retired + rows, after)
    if peers.ENABLED:
        mine.own(slot, runner.secret, functools.partial(_serve, runner, codec))
    return (*result, "stored")


def _run(
    runner: GroupRunner, codec: str, slot: tuple[str, Any], states: dict[str, State], pdf: pd.DataFrame | None
) -> tuple[Rows, str | bytes]:
    rows = runner.run_frame(pdf, states)
    after = encode_states(states, codec)
    keep_live(slot, after, states)
    return rows, after


def _serve(
    runner: GroupRunner, codec: str, slot: tuple[str, Any], stored_digest: bytes, wire: bytes | None
) -> tuple[Rows, str | bytes] | None:
    """An owner's answer to another worker's task (:func:`jobs.peers.ask`): the micro-batch
    run by its live state, or None if that state did not leave the value the task got."""
    live = LIVE_STATES.pop(slot, None)  # taken, as by take_live: a failed batch leaves none
    if live is None or peers.digest(live[0]) != stored_digest:
        return None
    return _run(runner, codec, slot, live[1], from_wire(wire))


def to_wire(pdf: pd.DataFrame | None) -> bytes | None:
    """A task's rows as another worker gets them: Arrow's stream format, a tenth of pickle's
    time for a frame whose conditions are arrays (about 12 against 140 ms for 25,000 rows)."""
    if pdf is None:
        return None
    table = pa.Table.from_pandas(pdf, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    return bytes(sink.getvalue())


def from_wire(wire: bytes | None) -> pd.DataFrame | None:
    """The frame :func:`to_wire` sent, as pyspark hands one (Arrow to pandas)."""
    return None if wire is None else pa.ipc.open_stream(wire).read_all().to_pandas()


def take_live(slot: tuple[str, Any], stored: str | bytes) -> dict[str, State] | None:
    """The states a bucket's last micro-batch in this worker left, if ``stored`` (the value
    Spark's state store gives this batch) is what that batch stored; else None. Taken out of
    :data:`LIVE_STATES`: a batch that fails midway leaves nothing behind to be reused.

    A module function, not part of :func:`streaming_fn`'s closure: Spark ships the closure to
    the workers by value, with a copy of the globals it reads, so a cache it read would be a
    new empty one in every task."""
    live = LIVE_STATES.pop(slot, None)
    if live is not None and live[0] == stored:
        return live[1]
    return None


def keep_live(slot: tuple[str, Any], stored: str | bytes, states: dict[str, State]) -> None:
    """Keep the states a micro-batch leaves, with the JSON it stored, for the bucket's next
    batch in this worker (:func:`take_live`)."""
    for dropped in make_room(LIVE_STATES, slot[0], MAX_LIVE_STATES):  # other queries' first
        peers.owner().release(dropped)
    LIVE_STATES[slot] = (stored, states)


def bucket(key: Column, buckets: int) -> Column:
    """The state group of a key: a keyed rule's bucket, one of ``buckets`` (Spark's murmur3
    hash, stable across runs and hosts), or a stream key itself (one evaluator stream
    partition per group)."""
    return (
        F.when(key == DLQ_KEY, F.lit(DLQ_GROUP))
        .when(key.startswith(STREAM_PREFIX), key)
        .otherwise(F.pmod(F.hash(key), F.lit(buckets)).cast("string"))
    )


def apply_lifecycle(
    tasks: DataFrame, plan: SparkPlan, *, streaming: bool, streams: StreamRunner | None = None,
    buckets: int = STATE_BUCKETS, codec: str = STATE_CODEC,
    ran: RulesRan | None = None, stale: Mapping[str, bytes] | None = None,
) -> DataFrame:  # fmt: skip
    """Run :class:`GroupRunner` on every key's rows.

    Streaming: ``applyInPandasWithState`` per state group (:func:`bucket`, keyed rules in
    ``buckets`` groups: the checkpoint's), state kept by Spark in the checkpoint's ``codec``.
    Batch: a keyed rule's rows from its first TRUE condition on (the earlier ones cannot change
    anything), a stream key's rows all, hash-partitioned by key, each partition's keys in one
    Python call. ``ran``: the rules the query ran (``jobs.engine.rules_ran``), whose restored
    states end their open alerts when their rule no longer runs; ``stale``: the groups whose
    stored values a start swept (:mod:`jobs.unread`), by digest.
    """
    runner = GroupRunner(plan, streams, ran, stale)
    if streaming:
        return (
            tasks.withColumn("__bucket", bucket(F.col("__key"), buckets))
            .groupBy("__bucket")
            .applyInPandasWithState(
                streaming_fn(runner, codec),
                OUTPUT_SCHEMA,
                STATE_SCHEMAS[codec],
                "append",
                GroupStateTimeout.NoTimeout,
            )
        )

    def batch(pdfs: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        rows = runner.run_many(pdfs, {})
        if rows:
            yield _frame(rows)

    if plan.rules:
        keyed = (F.col("__key") != DLQ_KEY) & ~F.col("__key").startswith(STREAM_PREFIX)
        useful = tasks.where(~keyed).unionByName(change_points(tasks.where(keyed), plan))
    else:  # no keyed rule, so no keyed row: the change points' window would shuffle every task for none
        useful = tasks
    partitions = tasks.sparkSession.conf.get("spark.sql.shuffle.partitions") or "2"
    return useful.repartition(int(partitions), "__key").mapInPandas(batch, OUTPUT_SCHEMA)


def change_points(keyed: DataFrame, plan: SparkPlan) -> DataFrame:
    """A backtest's keyed-path task rows, less those that cannot change an alert, in the JVM.

    Per state key, in (partition, offset) order (``ThresholdLogic``'s rules, which
    still run on every row kept):

    1. rows before the key's first TRUE condition: a quiet key stays quiet;
    2. late rows: from the first TRUE on the key has state, which is never deleted, and
       an event is late exactly when its time is below the newest time of the key's
       earlier rows (the running maximum; a late row does not move it); a late row
       changes nothing (batch output has no late counter);
    3. of the rest, a run of TRUE conditions matters up to the row that fires it (the
       first with ``consecutive`` rows and ``for`` elapsed since the run's first row;
       ``lag``/running counts over the run): after it the alert stays firing and
       only the evaluator's count moves, which resolving resets. A not-TRUE row
       matters only right after a TRUE one (it ends the run); after another it
       leaves a quiet key quiet.
    """
    by_key = Window.partitionBy("__key").orderBy("__part", "__offset")
    before = by_key.rowsBetween(Window.unboundedPreceding, -1)
    order = F.struct("__part", "__offset")
    first = F.min(F.when(F.col("__holds"), order)).over(Window.partitionBy("__key"))
    started = keyed.withColumn("__first", first).where(order >= F.col("__first")).drop("__first")
    newest = F.max("__ts_ms").over(before)
    on_time = (
        started.withColumn("__newest", newest)
        .where(F.col("__newest").isNull() | (F.col("__ts_ms") >= F.col("__newest")))
        .drop("__newest")
    )
    for_ms, consecutive = F.lit(0).cast("long"), F.lit(1).cast("long")
    for r in plan.rules:
        mine = F.col("__idx") == r.idx
        for_ms = F.when(mine, F.lit(r.rule.rule.for_ms).cast("long")).otherwise(for_ms)
        consecutive = F.when(mine, F.lit(r.rule.rule.consecutive).cast("long")).otherwise(consecutive)
    holds = F.coalesce(F.col("__holds"), F.lit(False))
    runs = on_time.withColumn("__h", holds).withColumn(
        "__run", F.sum(F.when(F.col("__h"), 0).otherwise(1)).over(by_key)
    )
    in_run = Window.partitionBy("__key", "__run", "__h").orderBy("__part", "__offset")
    fires = (F.row_number().over(in_run) >= consecutive) & (
        F.col("__ts_ms") - F.min("__ts_ms").over(in_run) >= for_ms
    )
    marked = runs.withColumn("__fires", F.col("__h") & fires)
    fired_before = F.max(F.col("__fires").cast("int")).over(
        Window.partitionBy("__key", "__run", "__h")
        .orderBy("__part", "__offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    keep = F.when(F.col("__h"), F.coalesce(fired_before, F.lit(0)) == 0).otherwise(
        F.coalesce(F.lag("__h").over(by_key), F.lit(False))
    )
    return marked.withColumn("__keep", keep).where("__keep").drop("__h", "__run", "__fires", "__keep")
