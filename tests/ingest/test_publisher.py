"""Publisher against the real embedded broker: keys, dead letters, bounded in-flight."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY

from app import topics
from app.errors import ConfigError
from app.kafka.broker import KafkaBroker
from app.runtime.settings import Settings
from ingest.model import ConvertError
from ingest.publisher import Publisher
from tests.conftest import make_settings
from tests.kafka_helpers import consume, consume_json


def refused_ahead() -> float:
    labels = {"source": "sensors", "bound": "ahead", "stage": "ingest"}
    return REGISTRY.get_sample_value("events_time_refused_total", labels) or 0.0


def _reading(i: int) -> dict[str, object]:
    return {"device_id": f"dev-{i % 3}", "ts": f"2014-01-01T00:{i % 60:02d}:00Z", "temperature": i}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_valid_events_are_keyed_and_normalised(settings: Settings) -> None:
    async def run() -> Publisher:
        async with Publisher(settings, topics.SENSORS, "sensors", "test", max_in_flight=3) as pub:
            for i in range(200):
                assert await pub.publish(_reading(i)) is not None
                assert pub.in_flight <= 3
        return pub

    pub = asyncio.run(run())
    assert (pub.accepted, pub.produced, pub.rejected, pub.failed, pub.in_flight) == (200, 200, 0, 0, 0)
    records = consume(settings.bootstrap_servers, topics.SENSORS, min_count=200)
    assert len(records) == 200
    for r in records:
        value = orjson.loads(r.value)
        assert r.key == value["device_id"].encode()
        assert value["ts"].endswith(".000Z")
        assert isinstance(value["temperature"], float)  # normalised from int


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_invalid_input_goes_to_the_dlq_with_reason_and_raw(settings: Settings) -> None:
    bad_raw = b'{"device_id": "d", "ts": "2014-01-01T00:00:00Z", "temperature": "hot"}'

    async def run() -> Publisher:
        async with Publisher(settings, topics.SENSORS, "sensors", "test") as pub:
            assert await pub.publish(bad_raw) is None
            assert await pub.publish({"device_id": "d", "ts": "2014-01-01T00:00:00Z", "colour": 1}) is None
            assert await pub.publish('{"device_id": "d", "ts": "2014-01-01T00:00:00Z"}') is not None
        return pub

    pub = asyncio.run(run())
    assert (pub.accepted, pub.produced, pub.rejected, pub.dead_lettered) == (1, 1, 2, 2)
    dlq = consume(settings.bootstrap_servers, topics.DLQ, min_count=2)
    assert [r.key for r in dlq] == [b"sensors", b"sensors"]
    first, second = (orjson.loads(r.value) for r in dlq)
    assert (first["field"], first["raw"], first["adapter"]) == ("temperature", bad_raw.decode(), "test")
    assert "must be a number" in first["reason"]
    assert second["field"] == "colour"
    assert orjson.loads(second["raw"]) == {"device_id": "d", "ts": "2014-01-01T00:00:00Z", "colour": 1}
    assert len(consume_json(settings.bootstrap_servers, topics.SENSORS, min_count=1)) == 1


@pytest.mark.timeout(10)
def test_no_bootstrap_servers_is_a_clear_config_error(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)

    async def run() -> None:
        async with Publisher(settings, topics.SENSORS, "sensors", "test"):
            pass

    with pytest.raises(ConfigError, match="KAFKA_BOOTSTRAP_SERVERS is not set"):
        asyncio.run(run())


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_submit_returns_a_delivery_for_events_errors_and_dead_letters(settings: Settings) -> None:
    async def run() -> tuple[Publisher, list[str], bool]:
        async with Publisher(settings, topics.SENSORS, "sensors", "test") as pub:
            event = pub.check(_reading(1))  # validates without sending or counting
            assert (pub.accepted, pub.in_flight) == (0, 0)
            deliveries = [
                await pub.submit(_reading(2), where="here"),
                await pub.submit(ConvertError("test", 7, b"junk", "bad line", "ts"), where="f.log byte 10"),
                await pub.submit({"device_id": "d", "ts": "x"}, where="f.log byte 20"),
                await pub.send(pub.accept(event)),
            ]
            all_acked = await pub.flush(timeout_s=30)
            assert all(d.done() for d in deliveries)
            return pub, [d.result().topic for d in deliveries], all_acked

    pub, landed, all_acked = asyncio.run(run())
    assert all_acked
    assert landed == [topics.SENSORS, topics.DLQ, topics.DLQ, topics.SENSORS]
    assert (pub.accepted, pub.produced, pub.rejected, pub.dead_lettered) == (2, 2, 2, 2)
    dead = consume_json(settings.bootstrap_servers, topics.DLQ, min_count=2)
    assert dead[0]["reason"] == "f.log byte 10: bad line"
    assert dead[1]["reason"].startswith("f.log byte 20: field 'ts' is not an RFC 3339 timestamp")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_live_ingest_bounds_event_time_by_the_wall_clock_and_replays_do_not(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_MAX_EVENT_AGE="7d")
    now = datetime.now(tz=UTC)
    at = {
        "now": now,
        "in 4 minutes": now + timedelta(minutes=4),
        "in 6 minutes": now + timedelta(minutes=6),
        "2099": datetime(2099, 12, 31, tzinfo=UTC),
        "6 days ago": now - timedelta(days=6),
        "8 days ago": now - timedelta(days=8),
    }
    ahead_before = refused_ahead()

    async def run(wall_clock: bool) -> Publisher:
        async with Publisher(settings, topics.SENSORS, "sensors", "test", wall_clock=wall_clock) as pub:
            for ts in at.values():
                await pub.publish({"device_id": "d", "ts": ts.isoformat(), "temperature": 1.0})
        return pub

    live = asyncio.run(run(wall_clock=True))
    assert (live.produced, live.dead_lettered) == (3, 3)
    dead = consume_json(settings.bootstrap_servers, topics.DLQ, min_count=3)
    bounds = [("ahead of" in d["reason"], "behind the wall clock" in d["reason"]) for d in dead]
    assert bounds == [(True, False), (True, False), (False, True)]
    assert [orjson.loads(d["raw"])["ts"] for d in dead] == [
        at[k].isoformat() for k in ("in 6 minutes", "2099", "8 days ago")
    ]
    assert all(d["field"] == "ts" for d in dead)
    assert "(max age 7d, APP_MAX_EVENT_AGE)" in dead[2]["reason"]
    assert refused_ahead() == ahead_before + 2
    replay = asyncio.run(run(wall_clock=False))  # recorded times: the evaluator judges them
    assert (replay.produced, replay.dead_lettered) == (6, 0)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_dead_letter_keeps_the_payload_whole_up_to_a_kafka_record(settings: Settings) -> None:
    big = b'{"device_id": "d", "ts": "2014-01-01T00:00:00Z", "status": "' + b"x" * 700_000 + b'", "x": 1}'
    huge = b"\xff" * 3_000_000  # not UTF-8 either: base64, 4/3 larger

    async def run() -> None:
        async with Publisher(settings, topics.SENSORS, "sensors", "test") as pub:
            assert await pub.publish(big) is None
            assert await pub.publish(huge) is None
            assert await pub.flush(timeout_s=30)

    asyncio.run(run())
    whole, cut = consume_json(settings.bootstrap_servers, topics.DLQ, min_count=2)
    assert whole["raw"].encode() == big and (whole["truncated"], whole["raw_size"]) == (False, len(big))
    assert (cut["truncated"], cut["raw_size"], cut["raw_encoding"]) == (True, 3_000_000, "base64")
    assert 700_000 < len(cut["raw"]) < 1_000_000
