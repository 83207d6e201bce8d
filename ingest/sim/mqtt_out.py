"""Publish a simulation to an MQTT broker instead of Kafka, as field devices would.

Each event goes, as its JSON object, to ``<prefix>/<device_id>/state`` at
QoS 1, paced like a replay (``--speedup``/``--fast``). The MQTT bridge
(``python -m ingest mqtt --map '<prefix>/+device_id/state'``) then validates
and publishes them to ``events.sensors``. Stops cleanly on SIGTERM/SIGINT,
waits for the broker's acknowledgements and prints a JSON summary line.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

import orjson
import paho.mqtt.client as mqtt

from app.events import parse_ts
from ingest.pacing import Pacer

logger = logging.getLogger(__name__)


def _acked(info: mqtt.MQTTMessageInfo) -> bool:
    try:
        return bool(info.is_published())
    except RuntimeError:  # the connection dropped before the broker acknowledged it
        return False


def publish_mqtt(
    events: Iterable[dict[str, Any]],
    broker: str,
    prefix: str,
    speedup: float | None,
    limit: int | None = None,
    client_id: str = "streamalert-simulator",
) -> int:
    """Publish ``events``; return the exit code (0: every message acknowledged)."""
    host, _, port = broker.rpartition(":")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    connected = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    client.on_connect = lambda *_a: connected.set()
    client.on_disconnect = lambda *_a: connected.clear()
    client.reconnect_delay_set(1, 30)
    client.connect_async(host or "127.0.0.1", int(port))
    client.loop_start()
    pacer = Pacer(speedup) if speedup else None
    infos: list[mqtt.MQTTMessageInfo] = []
    sent = 0
    try:
        for ev in events:
            if stop.is_set() or (limit is not None and sent >= limit):
                break
            if pacer is not None:
                stop.wait(pacer.delay(parse_ts(ev["ts"]), time.monotonic()))
                if stop.is_set():
                    break
            while not stop.is_set():
                connected.wait(1.0)  # publish only on a live connection; paho reconnects by itself
                if not connected.is_set():
                    continue
                info = client.publish(f"{prefix}/{ev['device_id']}/state", orjson.dumps(ev), qos=1)
                if info.rc == mqtt.MQTT_ERR_SUCCESS:
                    break
            else:
                break
            infos.append(info)
            sent += 1
            if len(infos) >= 1000:
                infos = [i for i in infos if not _acked(i)]
        deadline = time.monotonic() + 10
        while any(not _acked(i) for i in infos) and time.monotonic() < deadline:
            time.sleep(0.05)
        unacked = sum(not _acked(i) for i in infos)
    finally:
        client.loop_stop()
        client.disconnect()
    summary = {"published": sent - unacked, "unacknowledged": unacked, "mqtt": f"{prefix}/+/state"}
    sys.stdout.buffer.write(orjson.dumps(summary) + b"\n")
    sys.stdout.flush()
    return 1 if unacked else 0
