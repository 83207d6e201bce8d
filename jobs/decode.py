"""Decode and validate raw records with the very code of the Faust worker.

:class:`Decoder` is a ``mapInArrow`` function: for each input row (``value``
binary, ``topic`` string or NULL, ``partition``, ``offset``) it runs
:meth:`app.events.Schema.decode`, exactly as ``agents/wiring.py`` does, and
emits one row of :data:`DECODED_SCHEMA`:

- a valid event: ``__fields`` is the normalised event as JSON (the evaluator's
  row), ``__ts_ms`` its event time;
- an invalid one: ``__dlq`` is the dead-letter record (same ``reason`` and
  ``field`` as the Faust worker; ``adapter`` says ``spark-engine``), and
  processing goes on.

Typed columns are then parsed natively with ``from_json`` against
:func:`source_struct`, so rule conditions run as Spark SQL. The function is
stateless and picklable; it runs in executor Python workers.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

import orjson
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from app.backtest import infer_source
from app.errors import IngestDecodeError
from app.events import SCHEMAS, dlq_record, loads, record_time_ms
from jobs.streams import StreamRouter

logger = logging.getLogger(__name__)

ADAPTER = "spark-engine"
UNKNOWN_SOURCE = "unknown"

DECODED_SCHEMA = StructType(
    [
        StructField("__source", StringType()),
        StructField("__part", IntegerType()),
        StructField("__offset", LongType()),
        StructField("__ts_ms", LongType()),
        StructField("__fields", StringType()),
        StructField("__dlq", StringType()),
        StructField("__streams", ArrayType(StringType())),
        StructField("__arrival", LongType()),
    ]
)
DECODED_ARROW = pa.schema(
    [
        ("__source", pa.string()),
        ("__part", pa.int32()),
        ("__offset", pa.int64()),
        ("__ts_ms", pa.int64()),
        ("__fields", pa.string()),
        ("__dlq", pa.string()),
        ("__streams", pa.list_(pa.string())),
        ("__arrival", pa.int64()),
    ]
)
_SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "double": DoubleType(),
    "long": LongType(),
    "boolean": BooleanType(),
    "timestamp": StringType(),  # ts stays the normalised RFC 3339 string, as in the evaluator's row
}


def source_struct(source: str, only: Collection[str] | None = None) -> StructType:
    """The Spark type of one source's validated events: every field a rule may name, or
    those in ``only``."""
    return StructType(
        [
            StructField(n, _SPARK_TYPES[t])
            for n, t in SCHEMAS[source].all_fields().items()
            if only is None or n in only
        ]
    )


#: a raw record's column: when the record reached its topic (Kafka's timestamp, in milliseconds);
#: absent from a file's lines, which have one partition and its order
ARRIVAL = "arrival"


def arrival(batch: pa.RecordBatch) -> pa.Array:
    """``__arrival``: the records' :data:`ARRIVAL` as they came (no round trip through Python),
    or NULLs where the raw records have none."""
    if ARRIVAL in batch.schema.names:
        return batch.column(ARRIVAL).cast(pa.int64())
    return pa.nulls(batch.num_rows, pa.int64())


@dataclass(frozen=True)
class Decoder:
    """``topics`` maps topic -> source; ``source`` forces one source for every row
    (a backtest's ``--source``); otherwise a row without a known topic has its
    source inferred from its key field, like ``app.backtest``."""

    topics: Mapping[str, str] = field(default_factory=dict)
    source: str | None = None
    router: StreamRouter | None = None
    #: a dead letter's ``__ts_ms`` is where a backtest's time range places it
    #: (:func:`app.events.record_time_ms`, its ``__arrival`` the record's stamp); else null
    timed_dead_letters: bool = False

    def decode_one(
        self, topic: str | None, raw: bytes | None, partition: int = 0
    ) -> tuple[str, int | None, str | None, str | None, list[str] | None]:
        """``(source, ts_ms, fields_json, dlq_json, stream_keys)``: exactly one of
        ``fields_json`` and ``dlq_json`` is set; ``stream_keys`` (see
        :class:`jobs.streams.StreamRouter`) only for a valid event."""
        src = self.source or (self.topics.get(topic) if topic is not None else None)
        try:
            if raw is None:
                msg = "record has no value"
                raise IngestDecodeError(msg)
            if src is None:
                obj = loads(raw)  # also refuses a repeated key, as Schema.decode does
                src = infer_source(obj) if isinstance(obj, dict) else None
                if src is None:
                    msg = "cannot tell the source: no device_id, host or symbol field"
                    raise IngestDecodeError(msg)
                event = SCHEMAS[src].validate(obj)
            else:
                event = SCHEMAS[src].decode(raw)
        except IngestDecodeError as exc:
            name = src or UNKNOWN_SOURCE
            record = dlq_record(name, exc.reason, raw or b"", adapter=ADAPTER, field=exc.field)
            return name, None, None, record.decode(), None
        streams = self.router.keys(src, partition, event) if self.router is not None else None
        return src, event.ts_ms, orjson.dumps(event.fields).decode(), None, streams

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            partitions = batch.column("partition")
            topics, values = batch.column("topic").to_pylist(), batch.column("value").to_pylist()
            out = [self.decode_one(*r) for r in zip(topics, values, partitions.to_pylist(), strict=True)]
            if self.timed_dead_letters:
                stamps = arrival(batch).to_pylist()
                for i, o in enumerate(out):
                    if o[3] is not None:
                        out[i] = (o[0], record_time_ms(values[i], stamps[i]), *o[2:])
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([o[0] for o in out], pa.string()),
                    partitions.cast(pa.int32()),  # as they came: no round trip through Python
                    batch.column("offset").cast(pa.int64()),
                    pa.array([o[1] for o in out], pa.int64()),
                    pa.array([o[2] for o in out], pa.string()),
                    pa.array([o[3] for o in out], pa.string()),
                    pa.array([o[4] for o in out], pa.list_(pa.string())),
                    arrival(batch),
                ],
                schema=DECODED_ARROW,
            )
