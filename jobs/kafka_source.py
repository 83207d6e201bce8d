"""The Spark engine's Kafka reads: Spark's own connector (``format("kafka")``, the default)
or, as the fallback, a source written with Spark 4's Python Data Source API (short
name ``kafka_py``), chosen by ``APP_SPARK_KAFKA_FORMAT`` (:func:`kafka_format`).

:func:`read_kafka` is the one entry point. For both formats it first checks the
subscription with a short metadata request (:func:`jobs.kafka_client.check_subscription`),
so an unreachable broker or a missing topic is the same clear error, within
seconds, whichever source reads; and it reads with
``kafka.isolation.level=read_committed`` unless told otherwise, so records of
aborted transactions are never seen (docs/spark-kafka.md).

``kafka_py`` mirrors Spark's built-in ``kafka`` source, so switching changes
nothing else:

- schema: ``key`` binary, ``value`` binary, ``topic`` string, ``partition`` int,
  ``offset`` long, ``timestamp`` timestamp, ``timestampType`` int;
- options: ``kafka.bootstrap.servers``; one of ``subscribe``, ``subscribePattern``,
  ``assign``; ``startingOffsets`` (streaming default ``latest``, batch default
  ``earliest``); ``endingOffsets`` (batch only, default ``latest``);
  ``maxOffsetsPerTrigger``; ``failOnDataLoss`` (default true);
  ``kafka.default.api.timeout.ms`` (default 60000); ``kafka.isolation.level``
  (``read_uncommitted``, Kafka's default, or ``read_committed``).

Offsets are per-partition end-exclusive positions, returned to Spark as
``{"topic": {"0": 42}}`` and checkpointed by Spark in the query's checkpoint
directory, so a restarted query resumes exactly after the last committed
micro-batch. ``read()`` runs on executors, one task per topic-partition range,
and yields Arrow record batches. Offsets inside a range that hold no record
(transaction markers, aborted or compacted records) are skipped. Partitions
added to a topic while a query runs are read from their earliest offset.
``Trigger.AvailableNow`` is supported: the query stops at the latest offsets
seen when it started.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from app.errors import ConfigError
from app.runtime.settings import env_choice
from jobs import connector, kafka_client
from jobs.kafka_offsets import KafkaSourceOptions, Offsets, from_json, rate_limit, resolve, to_json

logger = logging.getLogger(__name__)

SHORT_NAME = "kafka_py"
FORMAT_ENV = connector.FORMAT_ENV

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)


CONNECTOR = "kafka"
FORMATS = (CONNECTOR, SHORT_NAME)
ISOLATION = "kafka.isolation.level"
#: how Spark says that a format has no implementation on its class path
NOT_FOUND = ("DATA_SOURCE_NOT_FOUND", "Failed to find data source")


def kafka_format(env: Mapping[str, str] | None = None) -> str:
    """``kafka`` (default, Spark's connector) or ``kafka_py`` (this module) from the environment."""
    return env_choice(FORMAT_ENV, {CONNECTOR: "Spark's connector", SHORT_NAME: "built in"}, env)


def register(spark: SparkSession) -> None:
    """Make ``format("kafka_py")`` available in ``spark``. Idempotent.

    :func:`read_kafka` calls it when that format is asked for, not every session at its
    start: a session's first registration sends the pickled source to the JVM, about 0.8 s
    on two cores (a later one about 10 ms), which a backtest from a file or the archive, or
    a query on Spark's own connector, never uses."""
    spark.dataSource.register(KafkaDataSource)


def read_kafka(
    spark: SparkSession, options: Mapping[str, str], *, streaming: bool, fmt: str | None = None
) -> DataFrame:
    """A Kafka DataFrame; the options are Spark's Kafka options, ``fmt`` defaults to
    :func:`kafka_format`.

    Raises :class:`jobs.kafka_client.KafkaSourceError` for an unreachable broker
    or a missing topic or partition, :class:`jobs.kafka_offsets.KafkaOptionError`
    for a missing broker or subscription option, and
    :class:`jobs.connector.ConnectorMissingError` when the session lacks the connector.
    """
    fmt = fmt or kafka_format()
    if fmt not in FORMATS:
        msg = f"unknown Kafka format {fmt!r}: expected one of {', '.join(FORMATS)}"
        raise ConfigError(msg)
    opts = dict(options)
    if not any(k.lower() == ISOLATION for k in opts):
        opts[ISOLATION] = "read_committed"
    kafka_client.check_subscription(KafkaSourceOptions.subscription(opts))
    if fmt == SHORT_NAME:
        register(spark)
    reader = spark.readStream if streaming else spark.read
    try:
        return reader.format(fmt).options(**opts).load()
    except AnalysisException as exc:
        if fmt == CONNECTOR and any(s in str(exc) for s in NOT_FOUND):
            raise connector.missing() from exc
        raise


class KafkaPartition(InputPartition):
    """One task: records ``start <= offset < end`` of one topic-partition. Picklable."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def _arrow_batches(
    opts: KafkaSourceOptions, schema: StructType, part: KafkaPartition
) -> Iterator[pa.RecordBatch]:
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    for records in kafka_client.fetch(opts, (part.topic, part.partition), part.start, part.end):
        n = len(records)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([r.key for r in records], pa.binary()),
                pa.array([r.value for r in records], pa.binary()),
                pa.array([part.topic] * n, pa.string()),
                pa.array([part.partition] * n, pa.int32()),
                pa.array([r.offset for r in records], pa.int64()),
                pa.array([r.timestamp * 1000 for r in records], pa.timestamp("us", tz="UTC")),
                pa.array([r.timestamp_type for r in records], pa.int32()),
            ],
            schema=arrow_schema,
        )


def _plan(opts: KafkaSourceOptions, start: Offsets, end: Offsets) -> list[KafkaPartition]:
    parts = []
    for tp, stop in sorted(end.items()):
        begin = start[tp]
        if begin > stop:
            if opts.fail_on_data_loss:
                msg = (
                    f"offsets of {tp[0]}-{tp[1]} went back from {begin} to {stop}: the topic was deleted or "
                    "recreated, records were lost. Set failOnDataLoss=false to skip, or use a new checkpoint"
                )
                raise kafka_client.KafkaSourceError(msg)
            logger.warning("offsets of %s-%d went back from %d to %d; skipping", *tp, begin, stop)
            continue
        if begin < stop:
            parts.append(KafkaPartition(tp[0], tp[1], begin, stop))
    return parts


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets and planning, one instance per query run. ``read`` runs on executors."""

    def __init__(self, opts: KafkaSourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._target: Offsets | None = None

    def initialOffset(self) -> dict[str, Any]:
        snap = kafka_client.snapshot(self.opts)
        offsets = resolve(self.opts.starting, snap.earliest, snap.latest, "startingOffsets")
        logger.info("kafka_py: a new query starts at %s", to_json(offsets))
        return to_json(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = kafka_client.snapshot(self.opts).latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = from_json(start)
        if self._target is not None:
            latest, earliest = dict(self._target), {}
        else:
            snap = kafka_client.snapshot(self.opts)
            latest, earliest = snap.latest, snap.earliest
        for tp in latest:
            if tp not in begin:  # a partition added while the query runs: read it from the start
                begin[tp] = earliest.get(tp, 0)
        for tp, off in begin.items():
            latest.setdefault(tp, off)
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        return to_json(latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = from_json(start), from_json(end)
        for tp in stop:
            begin.setdefault(tp, 0)
        return _plan(self.opts, begin, stop)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaPartition):  # pragma: no cover - partitions() plans only these
            return iter(())
        return _arrow_batches(self.opts, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        logger.debug("kafka_py: committed up to %s", end)


class KafkaBatchReader(DataSourceReader):
    """``spark.read``: ``startingOffsets`` (default earliest) to ``endingOffsets`` (default latest)."""

    def __init__(self, opts: KafkaSourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        snap = kafka_client.snapshot(self.opts)
        start = resolve(self.opts.starting, snap.earliest, snap.latest, "startingOffsets")
        end = resolve(self.opts.ending, snap.earliest, snap.latest, "endingOffsets")
        return _plan(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaPartition):  # Spark plans one empty partition for an empty range
            return iter(())
        return _arrow_batches(self.opts, self.schema, partition)


class KafkaDataSource(DataSource):
    """``spark.readStream.format("kafka_py")`` / ``spark.read.format("kafka_py")``."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def _options(self, streaming: bool) -> KafkaSourceOptions:
        return KafkaSourceOptions.parse(dict(self.options), streaming=streaming)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(self._options(streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(self._options(streaming=True), schema)
