"""From the rule model to a DataFrame plan: native Spark SQL for conditions, one task row per
(event, rule) or (event, stream) for the stateful part.

Two paths (see ``jobs.state`` and ``jobs.streams``):

* the **keyed path**: threshold rules with only ``where``/``for``/``consecutive``/
  ``group_by`` need no event-time clock; they run per (rule, group) in 64 state
  buckets, the condition computed natively (``__holds``);
* the **stream path**: every other rule (windows, absence, change, new term,
  sequence, branch, enrich, ``keep_firing_for``/``clear``, ``pct_change()``) runs in
  the evaluator's own ``StreamEvaluator`` per (stream, partition), so the
  per-partition event-time clock decides lateness and timers exactly as in the
  Faust worker. ``where`` is computed natively when Spark SQL can express it
  (``__conds``).

The plan per micro-batch (or once, for a backtest):

1. decode (``jobs.decode``): raw records -> ``__fields`` JSON or a DLQ record,
   plus the event's stream keys (``__streams``);
2. typed view: ``__<source> = from_json(__fields, <source struct>)``, only the fields the
   conditions and keyed groups read (a wide JSON parse cost more than the conditions);
3. fan-out: one task per (event, keyed rule) with its state key and ``__holds``,
   one per (event, stream) with the stream key and ``__conds``; a DLQ row
   becomes one task with the key :data:`DLQ_KEY`;
4. ``jobs.state`` runs each key's tasks with the pure evaluator.

Rules the engine cannot run are refused here, all at once, with
``file:line:col: rule-id: <feature> is not supported on the spark engine``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from app.errors import ExpressionError, RuleConfigError, RuleProblem
from app.events import SCHEMAS
from app.rules.loader import CompiledRule, RuleSet
from app.rules.spark_sql import SparkExpr, keyed_problems, spark_problems, to_spark_sql
from app.rules.statekey import SEPARATOR, StateKey
from app.topics import SOURCE_TOPICS
from jobs.decode import source_struct
from jobs.streams import StreamSpec, evaluator_streams, split_keys

logger = logging.getLogger(__name__)

DLQ_KEY = "\x00dlq"  # no rule id starts with NUL
KEY_SEPARATOR = SEPARATOR
TASK_TYPE = "struct<idx:int,key:string,holds:boolean,conds:array<boolean>>"
#: the ``idx`` of a tick: an event of a split stream partition for another part than its own
TICK_IDX = -3


@dataclass(frozen=True)
class SparkRule:
    """A rule with its position (output order, as the Faust worker evaluates rules) and its SQL."""

    idx: int
    rule: CompiledRule
    holds_sql: str

    @property
    def source(self) -> str:
        return self.rule.rule.source


@dataclass(frozen=True)
class SparkPlan:
    """``rules``: the keyed path; ``stream_rules`` and ``streams``: the stream path;
    ``fields``: per source, the fields Spark SQL reads (conditions, keyed group values);
    ``clock_chunk``: how a backtest's native plans compute the partition clocks
    (``jobs.windows.clocked``: 0, one task per stream partition; else per chunk of offsets)."""

    rules: tuple[SparkRule, ...]
    stream_rules: tuple[CompiledRule, ...] = ()
    streams: tuple[StreamSpec, ...] = ()
    fields: tuple[tuple[str, frozenset[str]], ...] = ()
    clock_chunk: int = 0

    def needed(self, source: str) -> frozenset[str]:
        """The fields of ``source`` the plan parses with ``from_json`` (none: no parse)."""
        return dict(self.fields).get(source, frozenset())

    @property
    def sources(self) -> list[str]:
        return sorted({r.source for r in self.rules} | {s.source for s in self.streams})

    @property
    def rule_count(self) -> int:
        return len(self.rules) + len(self.stream_rules)

    @property
    def topics(self) -> list[str]:
        return [SOURCE_TOPICS[s] for s in self.sources]

    def placement(self) -> dict[str, str]:
        """Where each rule runs, by :func:`placed_as`: ``keyed`` or ``stream`` (the path its
        state lives on; a streaming query's checkpoint records it, ``jobs.engine``)."""
        return {
            **{placed_as(r.rule): KEYED for r in self.rules},
            **{placed_as(r): STREAM for r in self.stream_rules},
        }


#: the two paths a rule's state can live on (:meth:`SparkPlan.placement`)
KEYED, STREAM = "keyed", "stream"


def placed_as(rule: CompiledRule) -> str:
    """A rule's key in a placement: its id and version (a new version starts with fresh state
    wherever it runs)."""
    return f"{rule.id}@{rule.version}"


def _struct_column(source: str) -> str:
    return f"__{source}"


def plan_rules(
    ruleset: RuleSet, *, keyed_path: bool = True, every_rule: bool = False,
    placed: Mapping[str, str] | None = None,
) -> SparkPlan:  # fmt: skip
    """The rules that run on Spark (``engine: spark`` or ``both``), translated; with
    ``every_rule`` (a backtest: ``backtest --engine spark`` runs what it is given) every
    rule of ``ruleset``, whatever its ``engine:`` says.

    ``keyed_path=False`` puts every rule on the stream path: the keyed path has no
    partition clock, so it cannot bound event time (APP_MAX_EVENT_SKEW) as the Faust
    engine does. Raises :class:`RuleConfigError` naming every rule and feature Spark
    cannot run.

    ``placed``: where a streaming query's rules ran until now (:meth:`SparkPlan.placement`).
    A rule it names, in the same version, stays on its path whenever it still can: which
    path a threshold rule takes depends on the other rules (it rides its source's topic-key
    stream when that stream runs anyway, :func:`_riders`), and its state lives on that path
    only, so an edit that added or removed a window rule of the same source started every
    such threshold rule again from fresh state (a firing alert then never resolved).
    """
    problems: list[RuleProblem] = []
    runs: list[CompiledRule] = []
    keyed: set[str] = set()
    for r in (r for r in ruleset.rules if every_rule or r.runs_on("spark")):
        found = spark_problems(r.rule)
        if found:
            problems.extend(RuleProblem(r.path, r.line, 1, r.id, p) for p in found)
            continue
        runs.append(r)
        if keyed_path and r.rule.where is not None and not keyed_problems(r.rule, r.schema.all_fields()):
            keyed.add(r.id)
    if problems:
        raise RuleConfigError(problems)
    pinned = {r.id: placed[placed_as(r)] for r in runs if placed and placed_as(r) in placed}
    keyed -= {rid for rid, path in pinned.items() if path == STREAM}
    keyed -= {rid for rid in _riders(runs, keyed) if pinned.get(rid) != KEYED}
    planned: list[SparkRule] = []
    needed: dict[str, set[str]] = {}
    for r in (r for r in runs if r.id in keyed):
        assert r.rule.where is not None  # noqa: S101 - keyed rules have a condition
        expr = to_spark_sql(r.rule.where, r.schema.all_fields(), qualifier=_struct_column(r.rule.source))
        planned.append(SparkRule(len(planned), r, expr.sql))
        needed.setdefault(r.rule.source, set()).update(expr.columns | set(r.rule.group_by))
    streamed = [r for r in runs if r.id not in keyed]
    specs = _stream_specs(streamed)
    for r in streamed:
        if (native := native_where(r)) is not None:
            needed.setdefault(r.rule.source, set()).update(native.columns)
    fields = tuple((source, frozenset(f)) for source, f in sorted(needed.items()))
    return SparkPlan(tuple(planned), tuple(streamed), specs, fields)


def _direct(rule: CompiledRule) -> bool:
    """Whether the evaluator puts ``rule`` in its source's topic-key stream."""
    return rule.rule.kind == "branch" or rule.rule.group_by == (rule.schema.key,)


def _riders(rules: list[CompiledRule], keyed: set[str]) -> set[str]:
    """Keyed-path rules that join their source's topic-key stream because that stream runs
    anyway: there they cost the evaluator a few µs per event, while on the keyed path
    each event is one more shuffled row and each micro-batch up to 64 more Python calls
    (measured: 3 to 12 % of the windowed pack's CPU for its one threshold rule). Same code, same
    ids: the stream path is the evaluator itself."""
    streams = {r.rule.source for r in rules if r.id not in keyed and _direct(r)}
    return {r.id for r in rules if r.id in keyed and r.rule.source in streams and _direct(r)}


def unreproduced(rule: CompiledRule, fields: frozenset[str]) -> str | None:
    """Why a native plan that reproduces only the rule-model ``fields`` cannot run ``rule``:
    the first other field it sets (not at its default), or None."""
    r = rule.rule
    for name, info in type(r).model_fields.items():
        if name not in fields and getattr(r, name) != info.get_default(call_default_factory=True):
            return f"'{info.alias or name}' is not reproduced natively"
    return None


def native_where(rule: CompiledRule) -> SparkExpr | None:
    """The rule's ``where`` as Spark SQL over the typed struct, or None when it must run in
    Python: it reads enrichment columns or ``pct_change()``, the rule evaluates its events
    after they wait (``order: event_time``: the native value belongs to the event being
    read, not the one released), or Spark cannot express it."""
    if rule.where is None or rule.rule.where is None or rule.rule.enrich or rule.where.synthetic:
        return None
    if rule.rule.order == "event_time":
        return None
    try:
        return to_spark_sql(
            rule.rule.where, rule.schema.all_fields(), qualifier=_struct_column(rule.rule.source)
        )
    except ExpressionError:
        return None


def _stream_specs(rules: list[CompiledRule]) -> tuple[StreamSpec, ...]:
    by_id = {r.id: r for r in rules}
    specs = []
    for name, source, fields, ids in evaluator_streams(rules):
        native = tuple((rid, e.sql) for rid in ids if (e := native_where(by_id[rid])) is not None)
        specs.append(StreamSpec(name, source, fields, tuple(ids), native))
    return tuple(specs)


def _key(rule: SparkRule) -> Column:
    """``rule-id US len:value US len:value ...``: equal exactly when (rule, group values)
    are, as in the evaluator's ``state_key`` (NULL and '' share a group; values
    compare as text). Length prefixes keep it injective whatever the values hold;
    rule ids never contain the separator (see :data:`KEY_SEPARATOR`)."""
    qual = _struct_column(rule.source)
    parts = [F.lit(rule.rule.id)]
    for g in rule.rule.rule.group_by:
        text = F.coalesce(F.col(f"`{qual}`.`{g}`").cast("string"), F.lit(""))
        parts.append(F.concat(F.length(text).cast("string"), F.lit(":"), text))
    return F.concat_ws(KEY_SEPARATOR, *parts)


def rule_of_key(key: str) -> str:
    """The rule id at the head of a state key made by :func:`_key`."""
    return StateKey.rule_of(key)


def _task(rule: SparkRule) -> Column:
    return F.struct(
        F.lit(rule.idx).cast("int").alias("idx"),
        _key(rule).alias("key"),
        F.expr(rule.holds_sql).alias("holds"),
        F.lit(None).cast("array<boolean>").alias("conds"),
    )


def _stream_task(spec: StreamSpec, position: int) -> Column:
    """The task of the ``position``-th stream of a source: the decoder's stream key for it."""
    conds = F.array(*(F.expr(sql) for _, sql in spec.native)) if spec.native else F.array()
    return F.struct(
        F.lit(-2).alias("idx"),
        F.col("__streams")[position].alias("key"),
        F.lit(None).cast("boolean").alias("holds"),
        conds.cast("array<boolean>").alias("conds"),
    )


def _split_stream_tasks(spec: StreamSpec, position: int, partitions: int, split: int) -> Column:
    """The tasks of the ``position``-th stream of a source whose partitions are split in
    ``split`` parts (``jobs.streams.StreamRouter``): the decoder's stream key, the event's own
    part, with its conditions; each other part of the partition, a tick (``idx``
    :data:`TICK_IDX`, ``holds`` FALSE, and in :func:`tasks` the event's key for its fields: the
    event's time and key only, ``jobs.streams.StreamRunner.run_key``)."""
    conds = F.array(*(F.expr(sql) for _, sql in spec.native)) if spec.native else F.array()
    parts = {}
    for p in range(partitions):
        keys = split_keys(spec.name, p, split)
        parts.update(dict.fromkeys(keys, keys))
    siblings = F.create_map(*(c for k, ks in parts.items() for c in (F.lit(k), F.array(*map(F.lit, ks)))))
    own = F.col("__streams")[position]

    def task(key: Column) -> Column:
        mine = key == own
        return F.struct(
            F.when(mine, F.lit(-2)).otherwise(F.lit(TICK_IDX)).alias("idx"),
            key.alias("key"),
            F.when(mine, F.lit(None).cast("boolean")).otherwise(F.lit(False)).alias("holds"),
            F.when(mine, conds.cast("array<boolean>")).alias("conds"),
        )

    return F.coalesce(F.transform(F.element_at(siblings, own), task), F.array().cast(f"array<{TASK_TYPE}>"))


def tasks(decoded: DataFrame, plan: SparkPlan, partitions: int = 1, split: int = 1) -> DataFrame:
    """Step 2 and 3: one row per (valid event, rule of its source) and per DLQ record; with
    ``split`` above 1, one per part of each stream partition (:func:`_split_stream_tasks`).

    Columns: ``__idx``, ``__key``, ``__holds``, ``__conds``, ``__part``, ``__offset``,
    ``__ts_ms``, ``__fields``, ``__dlq``, ``__source``, ``__arrival``.
    """
    df = decoded
    for source in plan.sources:
        if not plan.needed(source):
            continue  # no condition Spark computes reads this source: no parse
        parsed = F.from_json(F.col("__fields"), source_struct(source, only=plan.needed(source)))
        df = df.withColumn(_struct_column(source), F.when(F.col("__source") == source, parsed))
    dlq_task = F.array(
        F.struct(
            F.lit(-1).alias("idx"),
            F.lit(DLQ_KEY).alias("key"),
            F.lit(None).alias("holds"),
            F.lit(None).cast("array<boolean>").alias("conds"),
        )
    )
    choice = F.when(F.col("__dlq").isNotNull(), dlq_task.cast(f"array<{TASK_TYPE}>"))
    for source in plan.sources:
        mine = [_task(r) for r in plan.rules if r.source == source]
        streams = [s for s in plan.streams if s.source == source]
        if split == 1:
            mine += [_stream_task(s, i) for i, s in enumerate(streams)]
        typed = F.array(*mine).cast(f"array<{TASK_TYPE}>")
        if split > 1 and streams:
            typed = F.concat(
                typed, *(_split_stream_tasks(s, i, partitions, split) for i, s in enumerate(streams))
            )
        choice = choice.when(F.col("__source") == source, typed)
    df = df.withColumn("__tasks", choice.otherwise(F.array().cast(f"array<{TASK_TYPE}>")))
    # explode_outer and a filter after it, not explode: for an explode Spark infers the filter
    # ``size(__tasks) > 0`` and pushes it below the projections, where it inlines the tasks'
    # expressions, so every native condition parsed the record's JSON once more per row
    # (``from_json`` four times for the windowed bench pack instead of once)
    carried = ("__part", "__offset", "__ts_ms", "__fields", "__dlq", "__source", "__arrival")
    rows = df.select(F.explode_outer("__tasks").alias("__t"), *carried)
    columns: list[Column | str] = list(carried)
    if split > 1:  # a tick takes its event's key, not its fields (StreamRunner.run_key)
        key = F.lit(None).cast("string")
        for source in plan.sources:
            text = F.get_json_object("__fields", f"$.{SCHEMAS[source].key}")
            key = F.when(F.col("__source") == source, text).otherwise(key)
        tick = F.col("__t.idx") == TICK_IDX
        columns[carried.index("__fields")] = F.when(tick, key).otherwise(F.col("__fields")).alias("__fields")
    return rows.where(F.col("__t").isNotNull()).select(
        F.col("__t.idx").alias("__idx"),
        F.col("__t.key").alias("__key"),
        F.col("__t.holds").alias("__holds"),
        F.col("__t.conds").alias("__conds"),
        *columns,
    )
