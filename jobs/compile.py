"""From the rule model to a DataFrame plan: native Spark SQL for conditions, one task row per
(event, rule) for the per-group lifecycle.

The plan for threshold rules, per micro-batch (or once, for a backtest):

1. decode (``jobs.decode``): raw records -> ``__fields`` JSON or a DLQ record;
2. typed view: ``__<source> = from_json(__fields, <source struct>)``, only on
   that source's rows;
3. fan-out: one *task* per (event, rule of its source) with the rule's index,
   its state key (rule id + group values) and ``__holds``, the ``where``
   condition computed natively (:func:`app.rules.spark_sql.to_spark_sql`);
   a DLQ row becomes one task with the key :data:`DLQ_KEY`;
4. ``jobs.state`` runs the lifecycle per key with the pure evaluator.

Where the next rule kinds go: windowed aggregates branch off after step 2
(``withWatermark`` on ``timestamp_millis(__ts_ms)``, ``groupBy(window(...)|
session_window(...), group)``, honouring ``allowed_lateness``) and produce
rows of the sink schema (``jobs.state.OUTPUT_SCHEMA``) to union before the
sink; enrichment joins attach table-topic columns to the typed struct in
step 2; branching only needs more ``topic`` values in the output rows.

Rules the engine cannot run are refused here, all at once, with
``file:line:col: rule-id: <feature> is not supported on the spark engine``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from app.errors import RuleConfigError, RuleProblem
from app.rules.loader import CompiledRule, RuleSet
from app.rules.spark_sql import spark_problems, to_spark_sql
from app.topics import SOURCE_TOPICS
from jobs.decode import source_struct

logger = logging.getLogger(__name__)

DLQ_KEY = "\x00dlq"  # no rule id starts with NUL
KEY_SEPARATOR = "\x1f"
TASK_TYPE = "struct<idx:int,key:string,holds:boolean>"


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
    rules: tuple[SparkRule, ...]

    @property
    def sources(self) -> list[str]:
        return sorted({r.source for r in self.rules})

    @property
    def topics(self) -> list[str]:
        return [SOURCE_TOPICS[s] for s in self.sources]


def _struct_column(source: str) -> str:
    return f"__{source}"


def plan_rules(ruleset: RuleSet) -> SparkPlan:
    """The rules that run on Spark (``engine: spark`` or ``both``), translated.

    Raises :class:`RuleConfigError` naming every rule and feature Spark cannot run.
    """
    problems: list[RuleProblem] = []
    planned: list[SparkRule] = []
    for r in (r for r in ruleset.rules if r.runs_on("spark")):
        parts = getattr(r, "parts", None)
        schema = dict(parts.fields) if parts is not None else r.schema.all_fields()
        found = spark_problems(r.rule, schema)
        if found:
            problems.extend(RuleProblem(r.path, r.line, 1, r.id, p) for p in found)
            continue
        if r.rule.where is None:  # pragma: no cover - spark_problems admits threshold rules only
            continue
        sql = to_spark_sql(r.rule.where, schema, qualifier=_struct_column(r.rule.source)).sql
        planned.append(SparkRule(len(planned), r, sql))
    if problems:
        raise RuleConfigError(problems)
    return SparkPlan(tuple(planned))


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
    return key.split(KEY_SEPARATOR, 1)[0]


def _task(rule: SparkRule) -> Column:
    return F.struct(
        F.lit(rule.idx).cast("int").alias("idx"),
        _key(rule).alias("key"),
        F.expr(rule.holds_sql).alias("holds"),
    )


def tasks(decoded: DataFrame, plan: SparkPlan) -> DataFrame:
    """Step 2 and 3: one row per (valid event, rule of its source) and per DLQ record.

    Columns: ``__idx``, ``__key``, ``__holds``, ``__part``, ``__offset``,
    ``__ts_ms``, ``__fields``, ``__dlq``, ``__source``.
    """
    df = decoded
    for source in plan.sources:
        parsed = F.from_json(F.col("__fields"), source_struct(source))
        df = df.withColumn(_struct_column(source), F.when(F.col("__source") == source, parsed))
    dlq_task = F.array(
        F.struct(F.lit(-1).alias("idx"), F.lit(DLQ_KEY).alias("key"), F.lit(None).alias("holds"))
    )
    choice = F.when(F.col("__dlq").isNotNull(), dlq_task.cast(f"array<{TASK_TYPE}>"))
    for source in plan.sources:
        mine = [_task(r) for r in plan.rules if r.source == source]
        choice = choice.when(F.col("__source") == source, F.array(*mine).cast(f"array<{TASK_TYPE}>"))
    df = df.withColumn("__tasks", choice.otherwise(F.array().cast(f"array<{TASK_TYPE}>")))
    return df.select(
        F.explode("__tasks").alias("__t"), "__part", "__offset", "__ts_ms", "__fields", "__dlq", "__source"
    ).select(
        F.col("__t.idx").alias("__idx"),
        F.col("__t.key").alias("__key"),
        F.col("__t.holds").alias("__holds"),
        "__part",
        "__offset",
        "__ts_ms",
        "__fields",
        "__dlq",
        "__source",
    )
