"""Decoding in the JVM (``jobs.fastdecode``) gives the Python decoder's rows, record for
record: the same source, validity, DLQ reason, event time, stream keys and field values.
Crafted records probe each edge of the pattern (what it must take, what it must leave to
Python); real NAB records check the common case, random keys and groups the placement."""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from app.errors import ConfigError
from app.events import LOGS, MAX_KEY_LEN, MAX_STRING_LEN, SENSORS, Event
from app.placement import partition_for
from app.rules.loader import load_rules
from app.rules.statekey import group_text
from app.runtime.settings import Settings
from ingest.adapters.nab import nab_events
from jobs import engine
from jobs.compile import plan_rules
from jobs.decode import DECODED_SCHEMA, Decoder
from jobs.fastdecode import decode, decode_mode, recognise
from jobs.streams import StreamRouter, router, stream_key
from tests.conftest import NAB_MACHINE_TEMP, require_dataset

pytestmark = [pytest.mark.integration]  # a real Spark

RULES = """
rules:
  - id: hot
    source: sensors
    where: temperature > 100
    clear: temperature < 97
    group_by: [device_id]
  - id: by-status
    source: sensors
    group_by: [status]
    window: {type: tumbling, size: 1h}
    aggregate: {n: count(*)}
    having: n > 3
  - id: everything
    source: logs
    window: {type: tumbling, size: 1m}
    aggregate: {n: count(*)}
    having: n > 100
  - id: ip-burst
    source: logs
    where: status = 403
    group_by: [client_ip, host]
    consecutive: 3
"""

GOOD = '{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","temperature":73.96732207}'

#: (record, whether the JVM must take it): the JVM may leave a valid record to Python,
#: never take one Python would refuse or change
CASES: list[tuple[str, bool]] = [
    (GOOD, True),
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z"}', True),
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","temperature":null,"status":"ok"}', True),
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","status":"","kind":"a b,c:d"}', True),
    ('{"device_id":"m-2","ts":"2013-12-02T21:15:00.000Z","temperature":-0.5,"lat":0.0}', True),
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","temperature":73.50}', True),
    ('{"host":"web-1","ts":"2024-01-01T00:00:00.000Z","client_ip":"10.0.0.1","status":403}', True),
    ('{"host":"web-1","ts":"2024-01-01T00:00:00.000Z","status":-0,"bytes":123456789012345678}', True),
    ('{"symbol":"ACME","ts":"2024-01-01T00:00:00.000Z","close":12.5,"volume":10}', True),
    # left to Python: valid but normalised, or invalid
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","temperature":74}', False),  # int -> float
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","temperature":7.4e1}', False),
    ('{"device_id":"m-1", "ts":"2013-12-02T21:15:00.000Z"}', False),  # whitespace
    ('{"ts":"2013-12-02T21:15:00.000Z","device_id":"m-1"}', False),  # key not first
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00Z"}', False),  # another ts form
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000+00:00"}', False),
    ('{"device_id":"m-1","ts":"2013-02-30T21:15:00.000Z"}', False),  # no such day
    ('{"device_id":"m-1","ts":"2013-12-02T24:00:00.000Z"}', False),
    ('{"device_id":"m-1","ts":"2013-12-02T23:59:60.000Z"}', False),
    ('{"device_id":"m-1","ts":"1969-12-31T23:59:59.999Z"}', False),  # before 1970
    ('{"device_id":"m-1","ts":"2100-01-01T00:00:00.000Z"}', False),  # 2100 and later
    ('{"device_id":"m-1","ts":"2099-12-31T23:59:59.999Z"}', True),
    ('{"device_id":"m-1","ts":"1970-01-01T00:00:00.000Z"}', True),
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","temperature":1.0,"temperature":2.0}', False),
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","device_id":"m-2"}', False),
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","host":"x"}', False),  # unknown field
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","temperature":"hot"}', False),
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","status":5}', False),
    ('{"device_id":"m-1","ts":"2013-12-02T21:15:00.000Z","status":"caf\\u00e9"}', False),  # escape
    ('{"device_id":"m-\u00e9","ts":"2013-12-02T21:15:00.000Z"}', False),  # non-ASCII
    ('{"device_id":"","ts":"2013-12-02T21:15:00.000Z"}', False),  # empty key
    ('{"device_id":"' + "k" * MAX_KEY_LEN + '","ts":"2013-12-02T21:15:00.000Z"}', True),
    ('{"device_id":"' + "k" * (MAX_KEY_LEN + 1) + '","ts":"2013-12-02T21:15:00.000Z"}', False),
    ('{"device_id":"m","ts":"2013-12-02T21:15:00.000Z","status":"' + "s" * MAX_STRING_LEN + '"}', True),
    (
        '{"device_id":"m","ts":"2013-12-02T21:15:00.000Z","status":"' + "s" * (MAX_STRING_LEN + 1) + '"}',
        False,
    ),
    (GOOD + "\r", False),
    (GOOD + " ", False),
    (GOOD[:-1], False),  # not JSON
    ("", False),
    ("[1,2]", False),
    ('{"host":"web-1","ts":"2024-01-01T00:00:00.000Z","status":403.0}', False),  # float -> long
    ('{"host":"web-1","ts":"2024-01-01T00:00:00.000Z","bytes":123456789012345678901}', False),
    # coordinates: the pattern takes any double, the decoder refuses one off the globe
    ('{"device_id":"v-1","ts":"2024-01-01T00:00:00.000Z","lat":90.0,"lon":-180.0}', True),
    ('{"device_id":"v-1","ts":"2024-01-01T00:00:00.000Z","lat":-90.0,"lon":180.0}', True),
    ('{"device_id":"v-1","ts":"2024-01-01T00:00:00.000Z","lat":90.000000000000001}', True),  # 90.0
    ('{"device_id":"v-1","ts":"2024-01-01T00:00:00.000Z","lat":999.0,"lon":10.0}', False),
    ('{"device_id":"v-1","ts":"2024-01-01T00:00:00.000Z","lat":90.0001,"lon":null}', False),
    ('{"device_id":"v-1","ts":"2024-01-01T00:00:00.000Z","lon":-180.00000000000003}', False),
]


def rows_of(df: DataFrame) -> dict[int, dict[str, object]]:
    """Per offset, the decoded row with ``__fields`` and ``__dlq`` parsed (the text may differ,
    the values not)."""
    out = {}
    for r in df.collect():
        d = r.asDict()
        if d["__fields"] is not None:  # 74 and 74.0 are equal in Python: compare canonical texts
            d["__fields"] = orjson.dumps(orjson.loads(d["__fields"])).decode()
        if d["__dlq"] is not None:  # the time the record was decoded differs, nothing else
            d["__dlq"] = {k: v for k, v in orjson.loads(d["__dlq"]).items() if k != "received_at"}
        out[d["__offset"]] = d
    return out


def raw_frame(spark: SparkSession, records: list[str], topics: list[str | None] | None = None) -> DataFrame:
    rows = [((topics[i] if topics else None), 0, i, r.encode()) for i, r in enumerate(records)]
    return spark.createDataFrame(rows, "topic string, partition int, offset long, value binary").repartition(
        2
    )


def routed_decoder(partitions: int, tmp_path: Path, split: int = 1, **kwargs: Any) -> Decoder:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    plan = plan_rules(load_rules([path]), every_rule=True)
    return Decoder(router=router(plan.streams, partitions, record_partitions=False, split=split), **kwargs)


def same_rows(raw: DataFrame, decoder: Decoder) -> None:
    python = rows_of(raw.mapInArrow(decoder, DECODED_SCHEMA))
    assert rows_of(decode(raw, decoder)) == python
    assert rows_of(decode(raw, decoder, native=False)) == python


@pytest.mark.parametrize("partitions", [1, 3])
def test_every_crafted_record_decodes_as_the_python_decoder_decodes_it(
    spark: SparkSession, tmp_path: Path, partitions: int
) -> None:
    same_rows(raw_frame(spark, [r for r, _ in CASES]), routed_decoder(partitions, tmp_path))


def test_the_jvm_takes_the_records_the_decoder_keeps_unchanged_and_no_other(
    spark: SparkSession, tmp_path: Path
) -> None:
    raw = raw_frame(spark, [r for r, _ in CASES])
    found = {r["offset"]: r["__fast"] for r in recognise(raw, routed_decoder(3, tmp_path)).collect()}
    assert found == {i: jvm for i, (_, jvm) in enumerate(CASES)}


def test_a_coordinate_off_the_globe_is_dead_lettered_with_its_reason_by_both_decoders(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The pattern takes ``"lat":999.0`` (a double); decoded in the JVM it passed, and a geofence
    rule read NULL on Spark while the worker dead-lettered it."""
    records = [
        '{"device_id":"v-1","ts":"2024-01-01T00:00:00.000Z","lat":999.0,"lon":10.0}',
        '{"device_id":"v-1","ts":"2024-01-01T00:00:00.000Z","lat":48.1,"lon":11.5}',
        '{"device_id":"v-1","ts":"2024-01-01T00:00:00.000Z","lat":-45.0,"lon":-180.5}',
    ]
    raw = raw_frame(spark, records)
    decoder = routed_decoder(3, tmp_path)
    fast = {r["offset"]: r["__fast"] for r in recognise(raw, decoder).collect()}
    assert fast == {0: False, 1: True, 2: False}
    rows = rows_of(decode(raw, decoder))
    assert (rows[0]["__dlq"]["reason"], rows[0]["__dlq"]["field"]) == (
        "field 'lat' must be within -90..90 (degrees), got float 999.0",
        "lat",
    )
    assert (rows[2]["__dlq"]["reason"], rows[2]["__dlq"]["field"]) == (
        "field 'lon' must be within -180..180 (degrees), got float -180.5",
        "lon",
    )
    assert rows[1]["__dlq"] is None and rows[1]["__fields"] is not None
    same_rows(raw, decoder)


def test_a_regrouped_stream_on_a_number_leaves_its_source_to_the_python_decoder(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES.replace("group_by: [status]", "group_by: [temperature]"))
    plan = plan_rules(load_rules([path]), every_rule=True)
    decoder = Decoder(router=router(plan.streams, 3, record_partitions=False))
    logs = '{"host":"web-1","ts":"2024-01-01T00:00:00.000Z","status":403}'
    raw = raw_frame(spark, [GOOD, logs])
    assert {r["offset"]: r["__fast"] for r in recognise(raw, decoder).collect()} == {0: False, 1: True}
    same_rows(raw, decoder)


def test_the_source_comes_from_the_topic_or_the_forced_one_as_in_the_decoder(
    spark: SparkSession, tmp_path: Path
) -> None:
    logs = '{"host":"web-1","ts":"2024-01-01T00:00:00.000Z","status":403}'
    raw = raw_frame(spark, [GOOD, GOOD, GOOD, logs], ["events.sensors", "events.logs", None, "elsewhere"])
    routes = routed_decoder(3, tmp_path).router
    same_rows(raw, Decoder(topics={"events.sensors": "sensors", "events.logs": "logs"}, router=routes))
    same_rows(raw, Decoder(source="logs", router=routes))
    same_rows(raw, Decoder())


def test_real_nab_records_decode_in_the_jvm_as_in_the_python_decoder(
    spark: SparkSession, tmp_path: Path
) -> None:
    require_dataset(NAB_MACHINE_TEMP)
    rows = [
        r for r in nab_events(str(NAB_MACHINE_TEMP), device="x", field="temperature") if isinstance(r, dict)
    ]
    records = [
        orjson.dumps({**r, "device_id": f"machine-{i % 7}"}).decode() for i, r in enumerate(rows[:5000])
    ]
    raw = raw_frame(spark, records)
    decoder = routed_decoder(3, tmp_path)
    assert recognise(raw, decoder).where(~F.col("__fast")).count() == 0  # every one in the JVM
    same_rows(raw, decoder)


@pytest.mark.parametrize("split", [1, 3])
def test_stream_keys_place_many_keys_and_groups_as_the_worker_does(
    spark: SparkSession, tmp_path: Path, split: int
) -> None:
    """With a split, the part of each partition too (``jobs.streams.place``)."""
    rng = random.Random(7)  # noqa: S311 - test data
    alphabet = string.ascii_letters + string.digits + " -_.:/,{}[]"
    records = [
        orjson.dumps(
            {
                "device_id": "".join(rng.choices(alphabet, k=rng.randrange(1, 30))),
                "ts": "2013-12-02T21:15:00.000Z",
                "status": "".join(rng.choices(alphabet, k=rng.randrange(0, 12))),
            }
        ).decode()
        for _ in range(600)
    ]
    raw = raw_frame(spark, records)
    decoder = routed_decoder(7, tmp_path, split)
    assert recognise(raw, decoder).where(~F.col("__fast")).count() == 0
    same_rows(raw, decoder)
    keys = {k for r in decode(raw, decoder).collect() for k in r["__streams"] or ()}
    assert len(keys) > 7 * split  # every part of every partition of two streams took some


@pytest.mark.parametrize("split", [1, 2])
def test_live_records_take_their_own_partition_for_the_topic_key_stream(
    spark: SparkSession, tmp_path: Path, split: int
) -> None:
    """In the streaming query the topic-key stream is the record's partition (with a split,
    the key's part of it); a partition beyond the emulated count is left to the Python
    decoder, which names it all the same."""
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    plan = plan_rules(load_rules([path]), every_rule=True)
    decoder = Decoder(router=router(plan.streams, 3, record_partitions=True, split=split))
    records = [r for r, _ in CASES] + [GOOD] * 8
    rows = [(None, i % 4, i, r.encode()) for i, r in enumerate(records)]
    raw = spark.createDataFrame(rows, "topic string, partition int, offset long, value binary")
    fast = {r["offset"]: r["__fast"] for r in recognise(raw, decoder).collect()}
    assert {i for i, jvm in fast.items() if jvm and i % 4 == 3} == set()
    takes = [jvm for _, jvm in CASES] + [True] * 8
    assert {i for i, jvm in fast.items() if jvm} == {i for i, jvm in enumerate(takes) if jvm and i % 4 < 3}
    same_rows(raw, decoder)


def test_app_spark_decode_picks_the_streaming_querys_decoder(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python`` by default (the worker's decoder for every record, no pattern in the plan),
    ``jvm`` on request (the patterns in the plan); the rows are the same either way; a wrong
    value is refused naming the variable."""
    assert decode_mode({}) == "python" and decode_mode({"APP_SPARK_DECODE": " jvm "}) == "jvm"
    with pytest.raises(ConfigError, match="APP_SPARK_DECODE='java'"):
        decode_mode({"APP_SPARK_DECODE": "java"})
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    plan = plan_rules(load_rules([path]), every_rule=True)
    raw = raw_frame(spark, [r for r, _ in CASES])
    settings = Settings.from_env({"APP_DATA_DIR": str(tmp_path)})
    found = {}
    for mode in ("python", "jvm"):
        monkeypatch.setenv("APP_SPARK_DECODE", mode)
        df = engine.decoded(raw, plan, settings)
        found[mode] = "rlike" in df._jdf.queryExecution().analyzed().toString().lower(), rows_of(df)
    assert found["python"][0] is False and found["jvm"][0] is True
    assert found["python"][1] == found["jvm"][1]


def test_the_router_reuses_a_live_records_topic_keys_and_never_a_regrouped_streams() -> None:
    """A live record's topic-key streams depend on its partition only: their keys are made
    once per partition and shared. A regrouped stream's key hashes each event's own values,
    so a source with one is worked out per event. A backtest places the topic key by its
    hash, whatever partition the record came from."""

    def sensor(device: str) -> Event:
        return SENSORS.validate({"device_id": device, "ts": "2024-01-01T00:00:00Z", "temperature": 1.0})

    def log(status: int) -> Event:
        return LOGS.validate({"host": "web-1", "ts": "2024-01-01T00:00:00Z", "status": status})

    streams = {"sensors": (("sensors", None),), "logs": (("logs", None), ("logs.status", ("status",)))}
    live = StreamRouter(streams, 3, record_partitions=True)
    first = live.keys("sensors", 1, sensor("d1"))
    assert first == [stream_key("sensors", 1)] and live.keys("sensors", 1, sensor("d2")) is first
    assert live.keys("sensors", 2, sensor("d1")) == [stream_key("sensors", 2)]
    by_status = {s: partition_for(group_text([str(s)]).encode(), 3) for s in range(200, 220)}
    a, b = next((x, y) for x in by_status for y in by_status if by_status[x] != by_status[y])
    for status in (a, b, a):
        keys = live.keys("logs", 0, log(status))
        assert keys == [stream_key("logs", 0), stream_key("logs.status", by_status[status])]
    replay = StreamRouter(streams, 3, record_partitions=False)
    for part in (0, 1, 2):
        assert replay.keys("sensors", part, sensor("d1")) == [stream_key("sensors", partition_for(b"d1", 3))]
