"""The MQTT bridge with a real mosquitto and the real Kafka broker."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from app import topics
from app.runtime.settings import Settings
from ingest.mqtt.bridge import MqttOptions, bridge
from ingest.mqtt.mapping import load_mapping_file, parse_map_option
from ingest.runtime import AdapterSummary
from tests.ingest.conftest import Mosquitto, stop_task, topic_count, until_count, wait_for
from tests.kafka_helpers import consume, consume_json

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _publish(broker: Mosquitto, messages: list[tuple[str, bytes]]) -> None:
    """Publish at QoS 1 and wait for every PUBACK (bounded)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="test-publisher")
    client.connect(broker.host, broker.port)
    client.loop_start()
    try:
        for topic, payload in messages:
            client.publish(topic, payload, qos=1).wait_for_publish(timeout=5)
    finally:
        client.disconnect()
        client.loop_stop()


def _opts(broker: Mosquitto, *rules: str) -> MqttOptions:
    parsed = tuple(parse_map_option(r) for r in rules)
    return MqttOptions(broker.host, broker.port, "bridge-under-test", parsed, reconnect_max_s=1)


async def _bridged(
    settings: Settings, opts: MqttOptions, scenario: Callable[[], Awaitable[None]]
) -> AdapterSummary:
    stop = asyncio.Event()
    connected = asyncio.Event()
    task = asyncio.create_task(bridge(settings, opts, stop, on_connected=connected.set))
    await asyncio.wait_for(connected.wait(), 15)
    try:
        await scenario()
    finally:
        summary = await stop_task(stop, task)
    return summary


@pytest.mark.timeout(60)
def test_topics_map_to_devices_and_fields_and_bad_payloads_are_dead_lettered(
    settings: Settings, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    mapping = tmp_path / "mqtt.yaml"
    mapping.write_text(
        "mappings:\n"
        "  - topic: plant/+site/+device_id/+field\n"
        '    device: "{site}-{device_id}"\n'
        '    field: "{field}"\n'
        "  - topic: devices/+device_id/state\n"
    )
    rules = (parse_map_option("sensors/+device_id/temperature=temperature"), *load_mapping_file(mapping))
    opts = MqttOptions(mosquitto.host, mosquitto.port, "bridge-under-test", rules)
    state = {"lat": 48.1, "lon": 11.5, "speed_kmh": 12, "ts": "2024-01-01T00:00:00Z"}
    messages = [
        ("sensors/t-1/temperature", b"21.5"),
        ("plant/a/m-7/status", b"running"),
        ("devices/v-1/state", orjson.dumps(state)),
        ("sensors/t-2/temperature", b"hot"),
        ("devices/v-2/state", b'{"colour": "red"}'),
    ]

    async def scenario() -> None:
        await asyncio.to_thread(_publish, mosquitto, messages)
        await until_count(settings.bootstrap_servers, topics.SENSORS, 3)
        await until_count(settings.bootstrap_servers, topics.DLQ, 2)

    summary = asyncio.run(_bridged(settings, opts, scenario))
    assert (summary.published, summary.dlq, summary.extra["messages"], summary.extra["mqtt_acked"]) == (
        3,
        2,
        5,
        5,
    )
    records = consume(settings.bootstrap_servers, topics.SENSORS, min_count=3)
    by_key = {r.key.decode(): orjson.loads(r.value) for r in records}
    assert by_key["t-1"]["temperature"] == 21.5
    assert by_key["a-m-7"]["status"] == "running"
    assert by_key["v-1"] == {"device_id": "v-1", "ts": "2024-01-01T00:00:00.000Z", "lat": 48.1, "lon": 11.5,
                             "speed_kmh": 12.0}  # fmt: skip
    dead = consume_json(settings.bootstrap_servers, topics.DLQ, min_count=2)
    assert dead[0]["reason"].startswith("mqtt topic sensors/t-2/temperature: payload is neither a number")
    assert dead[1]["field"] == "colour"


@pytest.mark.timeout(60)
def test_the_ready_file_appears_once_subscribed_so_a_publisher_waiting_for_it_loses_nothing(
    settings: Settings, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    ready = tmp_path / "bridge.ready"
    opts = dataclasses.replace(_opts(mosquitto, "fleet/+device_id/state"), ready_file=ready)
    state = orjson.dumps({"ts": "2024-01-01T00:00:00Z", "temperature": 20.5})

    async def scenario() -> None:
        async def exists() -> bool:
            return ready.exists()

        await wait_for(exists, 15, "the ready file")
        await asyncio.to_thread(_publish, mosquitto, [("fleet/s-1/state", state)])  # at once: a new session
        await until_count(settings.bootstrap_servers, topics.SENSORS, 1)

    assert not ready.exists()
    summary = asyncio.run(_bridged(settings, opts, scenario))

    assert summary.published == 1
    assert ready.read_text() == "bridge-under-test subscribed\n"


@pytest.mark.timeout(60)
def test_messages_published_while_the_bridge_is_down_arrive_after_it_restarts(
    settings: Settings, mosquitto: Mosquitto
) -> None:
    opts = _opts(mosquitto, "sensors/+device_id/temperature=temperature")

    async def nothing() -> None:
        pass

    asyncio.run(_bridged(settings, opts, nothing))  # creates the persistent session
    _publish(mosquitto, [(f"sensors/d-{i % 4}/temperature", str(i).encode()) for i in range(50)])

    async def wait() -> None:
        await until_count(settings.bootstrap_servers, topics.SENSORS, 50)

    summary = asyncio.run(_bridged(settings, opts, wait))
    assert summary.published == 50
    values = sorted(
        v["temperature"] for v in consume_json(settings.bootstrap_servers, topics.SENSORS, min_count=50)
    )
    assert values == [float(i) for i in range(50)]


@pytest.mark.timeout(60)
def test_the_bridge_reconnects_and_resubscribes_after_the_broker_restarts(
    settings: Settings, mosquitto: Mosquitto
) -> None:
    opts = _opts(mosquitto, "sensors/+device_id/temperature=temperature")

    async def scenario() -> None:
        await asyncio.to_thread(_publish, mosquitto, [("sensors/d-1/temperature", b"1")])
        await until_count(settings.bootstrap_servers, topics.SENSORS, 1)
        mosquitto.stop()  # the restarted broker has no persistence: the bridge must subscribe again
        await asyncio.sleep(0.3)
        mosquitto.start()
        for _ in range(100):  # until the bridge is back, probes published at QoS 1 find no subscriber
            await asyncio.to_thread(_publish, mosquitto, [("sensors/probe/temperature", b"0")])
            if await topic_count(settings.bootstrap_servers, topics.SENSORS) > 1:
                break
            await asyncio.sleep(0.2)
        await asyncio.to_thread(_publish, mosquitto, [("sensors/d-2/temperature", b"2")])
        await until_count(settings.bootstrap_servers, topics.SENSORS, 3)

    asyncio.run(_bridged(settings, opts, scenario))
    keys = [r.key for r in consume(settings.bootstrap_servers, topics.SENSORS, min_count=3)]
    assert keys[0] == b"d-1"
    assert keys[-1] == b"d-2"
    assert b"probe" in keys
