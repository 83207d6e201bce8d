"""The archive: every event topic to Parquet, for backtests beyond Kafka's retention.

One streaming query (``archive``) reads ``events.sensors``, ``events.logs`` and
``events.finance`` (valid or not: the archive keeps records, not events) and appends
them to Parquet under :func:`archive_path`, partitioned by ``source`` and ``date`` (the
event's UTC date from its ``ts``, read as the decoder reads it; the record timestamp's date
when ``ts`` is missing or the decoder would refuse it: :func:`record_dates`). Columns:
``topic``, ``partition``, ``offset``, ``timestamp`` (the record's), ``key``, ``value`` (the
record's bytes as written), ``source``, ``date``.

Exactly once across restarts: Spark's file sink commits each micro-batch's files in its
``_spark_metadata`` log together with the checkpoint's offsets
(``$APP_DATA_DIR/spark/checkpoints/archive``); a batch re-run after a crash rewrites
the same batch id, and readers of the folder (:func:`archive_records`, any Spark
``read.parquet``) see only committed files, so each offset is read once.

The path is ``APP_ARCHIVE_PATH`` (a local folder or an object-store URL Spark's Hadoop
client can write, e.g. ``s3a://bucket/streamalert/archive``), default
``$APP_DATA_DIR/archive``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from prometheus_client import Counter, Gauge
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from app.events import format_ts, parse_ts, record_time_ms
from app.runtime.settings import Settings
from app.topics import SOURCE_TOPICS
from jobs.kafka_source import read_kafka

logger = logging.getLogger(__name__)

QUERY = "archive"
ARCHIVE_ENV = "APP_ARCHIVE_PATH"
PARTITION_COLUMNS = ("source", "date")

ARCHIVED = Counter("archive_records_total", "Records the archive query read and wrote to Parquet")
BATCH_SECONDS = Gauge("archive_last_batch_seconds", "Trigger time of the archive's last micro-batch")


@dataclass(frozen=True)
class ArchiveOptions:
    master: str | None = "local[1]"
    once: bool = False
    trigger: str = "10 seconds"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = 500_000
    path: str | None = None  # None: archive_path(settings)


def archive_path(settings: Settings) -> str:
    """``APP_ARCHIVE_PATH``, else ``$APP_DATA_DIR/archive``."""
    return os.environ.get(ARCHIVE_ENV) or str(settings.data_dir / "archive")


def checkpoint_dir(settings: Settings) -> Path:
    return settings.data_dir / "spark" / "checkpoints" / QUERY


def _source_of_topic() -> F.Column:
    expr = F.lit(None).cast("string")
    for source, topic in reversed(SOURCE_TOPICS.items()):
        expr = F.when(F.col("topic") == topic, F.lit(source)).otherwise(expr)
    return expr


#: the archive's columns, ``date`` computed in Python (:func:`record_dates`)
ARCHIVE_SCHEMA = (
    "topic string, partition int, offset long, timestamp timestamp, key binary, value binary, "
    "source string, date string"
)


def record_dates(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``: each record's ``date``, the UTC date of where a backtest's time range
    places it (:func:`app.events.record_time_ms`: its ``ts`` as the decoder reads it, else its
    stamp ``__stamp``), so that the date partitions a range reads hold every record it selects.
    Spark's own reading of ``ts`` (``try_to_timestamp``, before) took forms the decoder refuses
    (no offset, a region name) and refused some it takes, and filed those records under
    another date than the one a topic backtest gave them."""
    for batch in batches:
        times = map(record_time_ms, batch.column("value").to_pylist(), batch.column("__stamp").to_pylist())
        dates = [None if t is None else format_ts(t)[:10] for t in times]  # a Kafka record has a stamp
        yield pa.RecordBatch.from_arrays(
            [*batch.columns[:-1], pa.array(dates, pa.string())],
            names=[*batch.schema.names[:-1], "date"],
        )


def archive_rows(raw: DataFrame) -> DataFrame:
    """Kafka rows -> archive rows (see the module docstring)."""
    return raw.select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "value",
        _source_of_topic().alias("source"),
        F.unix_millis("timestamp").alias("__stamp"),
    ).mapInArrow(record_dates, ARCHIVE_SCHEMA)


def start(spark: SparkSession, settings: Settings, opts: ArchiveOptions) -> StreamingQuery:
    """Start the archive query; the caller owns it and must stop it."""
    options = {
        "kafka.bootstrap.servers": settings.bootstrap_servers,
        "subscribe": ",".join(SOURCE_TOPICS.values()),
        "startingOffsets": opts.starting_offsets,
        "failOnDataLoss": "false",  # records past retention are gone: archive what is left
        **settings.kafka_auth.spark_options(),
    }
    if opts.max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(opts.max_offsets_per_trigger)
    path = opts.path or archive_path(settings)
    writer = (
        archive_rows(read_kafka(spark, options, streaming=True))
        .writeStream.queryName(QUERY)
        .format("parquet")
        .partitionBy(*PARTITION_COLUMNS)
        .option("path", path)
        .option("checkpointLocation", str(checkpoint_dir(settings)))
        .outputMode("append")
    )
    writer = writer.trigger(availableNow=True) if opts.once else writer.trigger(processingTime=opts.trigger)
    query = writer.start()
    logger.info("archive query started: %s -> %s", ", ".join(SOURCE_TOPICS.values()), path)
    return query


def run(settings: Settings, opts: ArchiveOptions, stop: threading.Event) -> int:
    """The ``archive`` role: run until ``stop`` (or, with ``once``, until caught up)."""
    from jobs import connector
    from jobs.engine import WorkerRestarts, outcome, shut_down, watch
    from jobs.kafka_source import kafka_format
    from jobs.session import launched_jvm, session_unless_stopped

    if not settings.bootstrap_servers:
        logger.error("KAFKA_BOOTSTRAP_SERVERS is not set; start the system with `make run` or set it")
        return 2
    if opts.master:
        connector.require(kafka_format())
    spark = session_unless_stopped(stop, opts.master, app_name="streamalert-archive", shuffle_partitions=1)
    if spark is None:
        return 0
    jvm = launched_jvm()
    query = start(spark, settings, opts)
    restarts = WorkerRestarts(QUERY)
    try:
        while True:
            failure = watch(query, stop, meters=(ARCHIVED, BATCH_SECONDS))
            if not restarts.allow(failure, query, stop):
                break
            query = start(spark, settings, opts)  # on the same checkpoint: each offset once
    finally:
        shut_down(query, spark, jvm, stop)
    return outcome(failure, stop, QUERY)


def archive_records(
    spark: SparkSession, path: str, time_from: str | None = None, time_to: str | None = None
) -> DataFrame:
    """The archived records whose event date can fall in ``[time_from, time_to)`` (only those
    date partitions are read), with ``timestamp``, ``topic``, ``partition``, ``offset`` and
    ``value`` for :func:`jobs.backtest.ordered_records`. The exact time range is applied to
    the decoded events by the backtest, as for a topic."""
    df = spark.read.parquet(path)
    if time_from:
        lo = parse_ts(time_from, "--from")
        df = df.where(F.col("date") >= F.to_date(F.timestamp_millis(F.lit(lo))))
    if time_to:
        hi = parse_ts(time_to, "--to")
        df = df.where(F.col("date") <= F.to_date(F.timestamp_millis(F.lit(hi))))
    return df.select("timestamp", "topic", "partition", "offset", "value")
