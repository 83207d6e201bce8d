"""Decoding in the JVM: the records the worker's decoder would accept unchanged, recognised
and decoded with Spark SQL; every other record through :class:`jobs.decode.Decoder`.

The worker's decoder (``Schema.decode``) parses a record, refuses it with a reason, or
normalises it. Most records are what the publishers write: the event's own compact JSON,
key first, then ``ts`` in the canonical form (``2014-01-07T02:55:00.123Z``), then known
fields. For such a record the decoder changes nothing, so its decoded row can be computed
here without Python (:func:`decode`):

* **recognised** by one regular expression per source (:func:`record_pattern`): the key,
  then ``ts``, then at most one of each known field, each value of its type's JSON form
  (a double written with a decimal point, so that Python reads a float as the decoder keeps
  it; a long as digits; a string of printable ASCII without ``"`` or ``\\``, within the
  decoder's length limits; or ``null``), no whitespace, no repeated key (the names are
  compared), a ``ts`` that Spark's strict parser reads as a time in 1970..2100, and each
  bounded double (``Schema.bounds``: coordinates) within its bound as Spark parses it (Java
  and Python both read a decimal text as the nearest double, so they agree at the edges);
* **decoded** as the worker decodes it: ``__fields`` is the record itself (the decoder's
  output would serialise the same values in the same order), ``__ts_ms`` the time, and
  ``__streams`` the evaluator's stream keys: Kafka's partition of the key or group values
  over the emulated partitions, by the worker's own function, called once per distinct
  value of an Arrow batch (a hash in Spark SQL's higher-order functions cost more than the
  whole Python decoder); in the streaming query (``record_partitions``) the topic-key
  stream is the record's own partition, as the worker evaluates it.

The streaming query (``jobs.engine``) and backtests decode this way when
``APP_SPARK_DECODE=jvm`` (:func:`decode_mode`). The default, ``python``, sends every record
through the compiled Python decoder: measured on two cores, the JVM path did not beat it
(a one-shot backtest's cold JVM interprets the patterns and ``from_json`` for seconds;
warm, Java's regular expressions cost what orjson's parse does), docs/spark.md.

A record the pattern does not take (a number where a float should be, an escape, a space,
a field of another source, anything invalid) goes to the Python decoder, so the output is
the decoder's for every record; the conformance suites and ``tests/spark/test_fastdecode.py``
compare both on crafted and real input. Only text can differ, never a value: a float
written in another form than Python's shortest one (``73.50``), and ``-0``. ``__fields``
keeps the record's text, which every reader parses; the one place that copies it out, the
native windows' late copies (``jobs.windows.late_rows``), is counted, not printed, by a
backtest.

A source with a regrouped stream on a non-string field keeps the Python decoder for all its
records: the stream's partition hashes ``str()`` of the value, which Spark SQL does not
write the same way for numbers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType

from app.events import MAX_KEY_LEN, MAX_STRING_LEN, SCHEMAS, TS_RANGE_MS, Schema
from app.placement import partition_for
from app.rules.statekey import SEPARATOR
from app.runtime.settings import env_choice
from jobs.decode import ARRIVAL, DECODED_ARROW, DECODED_SCHEMA, Decoder, arrival
from jobs.streams import StreamRouter, stream_key

DECODE_ENV = "APP_SPARK_DECODE"
DECODERS = {"python": "the worker's decoder", "jvm": "Spark SQL"}


def decode_mode(env: Mapping[str, str] | None = None) -> str:
    """``python`` (default: every record through the worker's decoder) or ``jvm`` (the records
    it keeps unchanged decoded in Spark SQL, :func:`decode`), from the environment."""
    return env_choice(DECODE_ENV, DECODERS, env)


#: a character a recognised string may hold: printable ASCII but ``"`` and ``\\`` (so its
#: JSON text is the string itself, one byte per character)
_CHAR = r"[\x20\x21\x23-\x5b\x5d-\x7e]"
_VALUES = {
    "double": r"-?(?:0|[1-9][0-9]{0,15})\.[0-9]{1,17}",
    "long": r"-?(?:0|[1-9][0-9]{0,17})",
    "string": f'"{_CHAR}{{0,{MAX_STRING_LEN}}}+"',
    "boolean": "true|false",
}
_TS = r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z"
_NAMES = r',"([a-z_0-9]+)":'


def record_pattern(schema: Schema) -> str:
    """The Java regular expression of ``schema``'s records that the decoder keeps unchanged."""
    alternatives = []
    for ftype in ("double", "long", "string", "boolean"):
        names = sorted(n for n, t in schema.fields.items() if t == ftype)
        if names:
            value = _VALUES[ftype]
            alternatives.append(f'"(?:{"|".join(map(re.escape, names))})":(?:null|{value})')
    fields = f"(?:,(?:{'|'.join(alternatives)})){{0,{len(schema.fields)}}}+" if alternatives else ""
    return f'^\\{{"{schema.key}":"{_CHAR}{{1,{MAX_KEY_LEN}}}+","ts":"{_TS}"{fields}\\}}\\z'


@F.arrow_udf(IntegerType())  # type: ignore[call-overload]
def _kafka_partitions(texts: pa.Array, partitions: pa.Array) -> pa.Array:
    """Kafka's partition of each text (``app.placement.partition_for``): each distinct text of
    the batch hashed once, in Python, the rows taking theirs by index."""
    count = partitions[0].as_py() if len(partitions) else 1
    encoded = pc.dictionary_encode(texts)
    found = [partition_for(t.encode(), count) for t in encoded.dictionary.to_pylist()]
    return pc.take(pa.array(found, pa.int32()), encoded.indices)


def _partition(text: Column, partitions: int) -> Column:
    if partitions == 1:
        return F.lit(0)
    return _kafka_partitions(text, F.lit(partitions))


def _streams(router: StreamRouter, source: str, typed: Column) -> Column | None:
    """The stream keys of a recognised record of ``source`` (``typed``: its fields parsed),
    or None when a stream's partition hashes a non-string field."""
    kinds = SCHEMAS[source].all_fields()
    keys = []
    count, split = router.partitions, router.split
    for name, fields in router.streams.get(source, ()):
        # by slot: a partition's, or with a split (jobs.streams.place) partition + count * part
        names = F.array(
            *(F.lit(stream_key(name, s % count, s // count, split)) for s in range(count * split))
        )
        if fields is None and router.record_partitions and split == 1:  # live: the record's own partition
            keys.append(F.try_element_at(names, F.col("partition") + 1))
            continue
        if fields is None:
            text = typed[SCHEMAS[source].key]
        elif any(kinds.get(f) != "string" for f in fields):
            return None
        else:
            text = F.concat_ws(SEPARATOR, *(F.coalesce(typed[f], F.lit("")) for f in fields))
        slot = _partition(text, count * split)
        if fields is None and router.record_partitions:  # the record's own partition, the text's part
            slot = F.col("partition") + F.lit(count) * F.floor(slot / count)
            keys.append(F.try_element_at(names, slot.cast("int") + 1))
            continue
        keys.append(F.element_at(names, slot + 1))
    return F.array(*keys) if keys else F.array().cast("array<string>")


def _source_of(decoder: Decoder, topic: Column, text: Column) -> tuple[Column, Column]:
    """The source the decoder decodes a record as, where a recognised record can tell: the
    forced one, the topic's, else the source whose pattern takes the record (the decoder
    infers it from the key field, and a recognised record holds no other source's key); and
    whether that source came from its pattern (then it need not be matched again)."""
    if decoder.source is not None:
        return F.lit(decoder.source), F.lit(False)
    by_topic: Column = F.lit(None).cast("string")
    for t, s in sorted(decoder.topics.items()):
        by_topic = F.when(topic == t, F.lit(s)).otherwise(by_topic)
    inferred: Column = F.lit(None).cast("string")
    for s in sorted(SCHEMAS):
        inferred = F.when(text.rlike(record_pattern(SCHEMAS[s])), F.lit(s)).otherwise(inferred)
    return F.coalesce(by_topic, inferred), by_topic.isNull()


def recognise(raw: DataFrame, decoder: Decoder) -> DataFrame:
    """``raw`` with the columns the JVM decodes: ``__fast`` (a pattern took the record),
    ``__src``, ``__text``, ``__ms``, ``__stream_keys``."""
    text = F.col("value").cast("string")
    src, by_pattern = _source_of(decoder, F.col("topic"), text)
    df = raw.withColumn("__text", text).withColumn("__src", src).withColumn("__by_pattern", by_pattern)
    # the field names, once per record: each source's test below reads them twice
    df = df.withColumn("__names", F.regexp_extract_all(F.col("__text"), F.lit(_NAMES), 1))
    names = F.col("__names")
    recognised: Column = F.lit(False)
    ts_ms: Column = F.lit(None).cast("bigint")
    streams: Column = F.lit(None).cast("array<string>")
    for source, schema in sorted(SCHEMAS.items()):
        # a column of its own: each of the source's streams reads it
        typed_name = f"__typed_{source}"
        df = df.withColumn(
            typed_name, F.when(F.col("__src") == source, F.from_json(F.col("__text"), _struct(schema)))
        )
        typed = F.col(typed_name)
        stream_keys = _streams(decoder.router, source, typed) if decoder.router is not None else None
        if decoder.router is not None and stream_keys is None:
            continue  # a non-string group field: this source's records stay with the decoder
        within = _within_bounds(schema)
        # Spark's own ISO parser (a cast: no pattern to interpret per row) reads the canonical
        # form the pattern admits; a date or time out of range gives NULL
        ms = F.unix_millis(F.regexp_extract(F.col("__text"), f'"ts":"({_TS})"', 1).try_cast("timestamp"))
        mine = (
            (F.col("__src") == source)
            & (F.col("__by_pattern") | F.col("__text").rlike(record_pattern(schema)))
            & (F.size(F.array_distinct(names)) == F.size(names))
            & within
        )
        if decoder.router is not None and decoder.router.record_partitions:
            # a live record's topic-key stream is its own partition's: a partition beyond the
            # emulated count (a topic with more partitions) is the Python decoder's to name
            mine = mine & (F.col("partition") < decoder.router.partitions)
        # a column of its own too: the three columns below read it, and inlined in each the
        # pattern and the names' extraction ran two or three times per record
        df = df.withColumn(f"__mine_{source}", mine)
        mine = F.col(f"__mine_{source}")
        recognised = F.when(mine, F.lit(True)).otherwise(recognised)
        ts_ms = F.when(mine, ms).otherwise(ts_ms)
        if stream_keys is not None:
            streams = F.when(mine, stream_keys).otherwise(streams)
    in_range = F.col("__ms").between(TS_RANGE_MS[0], TS_RANGE_MS[1] - 1)
    return (
        df.withColumn("__ms", ts_ms)
        .withColumn("__stream_keys", streams)
        .withColumn("__fast", recognised & F.coalesce(in_range, F.lit(False)))
    )


@dataclass(frozen=True)
class _Finish:
    """``mapInArrow`` function of :func:`decode`'s one pass: the rows the JVM decoded go
    through as they are (Arrow columns, no per-row work), the others to ``decoder``."""

    decoder: Decoder

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            fast = batch.column("__fast").fill_null(False)
            done = batch.filter(fast)
            if done.num_rows:
                yield pa.RecordBatch.from_arrays(
                    [
                        done.column("__src"),
                        done.column("partition").cast(pa.int32()),
                        done.column("offset").cast(pa.int64()),
                        done.column("__ms").cast(pa.int64()),
                        done.column("__text"),
                        pa.nulls(done.num_rows, pa.string()),
                        done.column("__stream_keys"),
                        arrival(done),
                    ],
                    schema=DECODED_ARROW,
                )
            rest = batch.filter(pc.invert(fast))
            if rest.num_rows:
                raw = ["topic", "partition", "offset", "value"]
                raw += [ARRIVAL] if ARRIVAL in batch.schema.names else []
                yield from self.decoder(iter([rest.select(raw)]))


def decode(raw: DataFrame, decoder: Decoder, *, native: bool = True) -> DataFrame:
    """``raw`` (``topic``, ``partition``, ``offset``, ``value``) decoded to
    :data:`jobs.decode.DECODED_SCHEMA` rows, as ``raw.mapInArrow(decoder, ...)`` decodes
    them; the records a pattern takes without the Python decoder (``native=False``: none).

    One pass: the JVM's columns and the records it could not decode go to one ``mapInArrow``
    (only the record's text, or only its bytes, travels), which decodes the latter. Two
    filtered branches of one plan would run the patterns twice."""
    if not native:
        return raw.mapInArrow(decoder, DECODED_SCHEMA)
    fast = F.col("__fast")
    df = recognise(raw, decoder).select(
        "topic",
        "partition",
        "offset",
        F.when(~fast, F.col("value")).alias("value"),
        fast,
        F.when(fast, F.col("__src")).alias("__src"),
        F.when(fast, F.col("__ms")).alias("__ms"),
        F.when(fast, F.col("__text")).alias("__text"),
        F.when(fast, F.col("__stream_keys")).alias("__stream_keys"),
        *([ARRIVAL] if ARRIVAL in raw.columns else []),
    )
    return df.mapInArrow(_Finish(decoder), DECODED_SCHEMA)


def _within_bounds(schema: Schema) -> Column:
    """Whether each bounded field of a record is absent, NULL or within its bound; a value
    outside is left to the Python decoder, which refuses it with the reason. The value is cut
    from the text (the pattern admits a field once, and no ``"`` inside a string), not parsed
    with ``from_json``: a second parse of every record was what reading the bounded fields
    that way cost (``tests/spark/test_plan_work.py``)."""
    within: Column = F.lit(True)
    for name, bound in schema.bounds:
        cut = F.regexp_extract(F.col("__text"), f'"{name}":(-?[0-9][0-9.eE+-]*)', 1)
        value = F.when(cut != "", cut.cast("double"))
        within = within & (value.isNull() | value.between(bound.low, bound.high))
    return within


def _struct(schema: Schema) -> str:
    """The DDL of ``schema``'s key and string fields (what stream keys read)."""
    names = [schema.key, *sorted(n for n, t in schema.fields.items() if t == "string")]
    return ", ".join(f"`{n}` string" for n in names)
