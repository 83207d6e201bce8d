"""The input chart's raw readings read from a real broker (the session's): a replay of the real
NAB series (record timestamps at produce time, event times in 2013) found by bisection, live
events found by ``offsets_for_times``, the bounds, and the topic's retention."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.structs import TopicPartition

from app.console.readings import ReadingsPlan, describe, plan_readings
from app.console.source_reader import PROBE_CHUNK, read_readings
from app.events import SENSORS
from app.kafka.broker import KafkaBroker
from app.placement import partition_for
from tests.agents.worker_helpers import nab_lines
from tests.kafka_helpers import consume, produce

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TOPIC = "events.sensors"


def nab_plan(rows: list[bytes], first: int, last: int) -> ReadingsPlan:
    """The plan of an alert of machine-temp-1 from row ``first`` to row ``last`` (an hour before)."""
    start, end = (orjson.loads(rows[i])["ts"] for i in (first, last))
    p = plan_readings(source="sensors", group_by=("device_id",), field="temperature", window_ms=None,
                      labels={"device_id": "machine-temp-1"}, starts_at=start, ends_at=end,
                      now_ms=0)  # fmt: skip
    assert isinstance(p, ReadingsPlan)
    return p


def expected(rows: list[bytes], p: ReadingsPlan) -> list[tuple[int, float]]:
    events = [SENSORS.decode(r) for r in rows]
    return [(e.ts_ms, e.fields["temperature"]) for e in events if p.start_ms <= e.ts_ms <= p.end_ms]


def test_a_replayed_series_is_found_by_event_time_within_the_bounds(broker: KafkaBroker) -> None:
    one, two = nab_lines(2000, "machine-temp-1"), nab_lines(2000, "machine-temp-2")
    interleaved = [x for pair in zip(one, two, strict=True) for x in pair]
    produce(broker.bootstrap, TOPIC, [(orjson.loads(v)["device_id"].encode(), v) for v in interleaved])
    p = nab_plan(one, 1500, 1530)

    collect, report = read_readings(broker.bootstrap, p)
    assert [(r.ts_ms, r.value) for r in collect.readings] == expected(one, p)
    assert len(collect.readings) >= 40  # the hour before the start and the 30 rows of the alert
    assert report.partitions == (partition_for(b"machine-temp-1", 2),)
    assert (report.bound, report.retained_from_ms, report.error) == ("", None, "")
    # the record timestamps are all later than 2013: the start was found by bisection, not by
    # reading the partition from its first record (1,500 of the group's records come before)
    assert len(collect.readings) <= report.records < 1500

    _, cut = read_readings(broker.bootstrap, p, max_records=30)
    assert cut.bound == "records" and cut.records <= 30
    assert "stopped at the bound of" in describe(p, cut, 0)

    # retention deletes the partition's head up to a reading inside the window
    records = [r for r in consume(broker.bootstrap, TOPIC, min_count=4000)
               if r.partition == report.partitions[0] and r.key == b"machine-temp-1"]  # fmt: skip
    kept = records[1495]  # 5 rows before the alert started: an hour before it was row 1488
    asyncio.run(delete_before(broker.bootstrap, TopicPartition(TOPIC, kept.partition), kept.offset))
    collect, report = read_readings(broker.bootstrap, p)
    kept_ts = SENSORS.decode(kept.value).ts_ms
    assert report.retained_from_ms == kept_ts
    assert [(r.ts_ms, r.value) for r in collect.readings] == [x for x in expected(one, p) if x[0] >= kept_ts]


async def delete_before(bootstrap: str, tp: TopicPartition, offset: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20_000)
    await admin.start()
    try:
        await admin.delete_records({tp: RecordsToDelete(before_offset=offset)}, timeout_ms=20_000)
    finally:
        await admin.close()


async def produce_at_event_time(bootstrap: str, events: list[dict[str, object]]) -> None:
    """Produce ``events`` keyed by device, each record stamped with the event's own time."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futs = []
        for ev in events:
            ts = int(datetime.fromisoformat(str(ev["ts"])).timestamp() * 1000)
            futs.append(await producer.send(TOPIC, orjson.dumps(ev), key=str(ev["device_id"]).encode(),
                                            timestamp_ms=ts))  # fmt: skip
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


def test_live_events_are_found_by_record_time_and_other_groupings_read_every_partition(
    broker: KafkaBroker,
) -> None:
    now = datetime.now(tz=UTC).replace(microsecond=0)
    events = [
        {"device_id": device, "ts": (now - timedelta(minutes=180 - m)).isoformat(), "temperature": float(m),
         "kind": "pump"}
        for m in range(0, 180) for device in ("pump-1", "pump-2")
    ]  # fmt: skip
    asyncio.run(produce_at_event_time(broker.bootstrap, events))
    started = (now - timedelta(minutes=30)).isoformat()
    p = plan_readings(source="sensors", group_by=("device_id",), field="temperature", window_ms=None,
                      labels={"device_id": "pump-1"}, starts_at=started, ends_at=None,
                      now_ms=int(time.time() * 1000))  # fmt: skip
    assert isinstance(p, ReadingsPlan)
    collect, report = read_readings(broker.bootstrap, p)
    assert [r.value for r in collect.readings] == [float(m) for m in range(90, 180)]  # the last 90 minutes
    in_window = sum(1 for ev in events if str(ev["ts"]) >= (now - timedelta(minutes=90)).isoformat())
    # offsets_for_times started it at the window: nothing before it read (but the first probe's records)
    assert in_window <= report.records <= in_window + PROBE_CHUNK

    by_kind = plan_readings(source="sensors", group_by=("kind",), field="temperature", window_ms=None,
                            labels={"kind": "pump"}, starts_at=started, ends_at=None,
                            now_ms=int(time.time() * 1000))  # fmt: skip
    assert isinstance(by_kind, ReadingsPlan)
    collect, report = read_readings(broker.bootstrap, by_kind)
    assert report.partitions == (0, 1)
    assert sorted(r.value for r in collect.readings) == sorted(2 * [float(m) for m in range(90, 180)])


def test_a_topic_that_cannot_be_read_is_said_not_raised() -> None:
    p = ReadingsPlan("sensors", TOPIC, "temperature", b"d1", (("device_id", "d1"),), 0, 1)
    _, report = read_readings("127.0.0.1:1", p, budget_s=1.0)
    assert report.error.startswith(f"{TOPIC} could not be read")
