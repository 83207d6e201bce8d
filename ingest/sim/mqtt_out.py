"""Publish a simulation to an MQTT broker instead of Kafka, as field devices would.

Each event goes, as its JSON object, to ``<prefix>/<device_id>/state`` at
QoS 1, paced like a replay (``--speedup``/``--fast``). The MQTT bridge
(``python -m ingest mqtt --map '<prefix>/+device_id/state'``) then validates
and publishes them to ``events.sensors``. Stops cleanly on SIGTERM/SIGINT,
waits for the broker's acknowledgements and prints a JSON summary line.

With a progress file (:mod:`ingest.progress`) it resumes after the events an
earlier run published and records, every second and at the end, the events up
to the first one the MQTT broker has not acknowledged (PUBACK) yet: a clean
stop republishes nothing; a crash republishes the unrecorded tail. The end of
the events is never recorded as final: a simulation cut by ``--duration`` goes
on when a later run is given a longer one.
"""

from __future__ import annotations

import itertools
import logging
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import orjson
import paho.mqtt.client as mqtt
from prometheus_client import Counter, Gauge

from app.events import parse_ts
from app.eventtime import Clock
from app.runtime.clockgate import ClockGate, leave, wait_sync
from ingest.pacing import Pacer
from ingest.progress import CHECKPOINT_S, Progress, ProgressFile

logger = logging.getLogger(__name__)

PUBLISHED = Counter("ingest_mqtt_published_total", "Events the simulator published to MQTT (QoS 1)")
PENDING = Gauge("ingest_mqtt_pending", "Published events from the first the MQTT broker has not acknowledged")


def _acked(info: mqtt.MQTTMessageInfo) -> bool:
    try:
        return bool(info.is_published())
    except RuntimeError:  # the connection dropped before the broker acknowledged it
        return False


class _Acks:
    """Messages in publish order with their sequence numbers; the acknowledged prefix
    is what the progress file may record."""

    def __init__(self, file: ProgressFile | None, base: Progress) -> None:
        self.file, self.saved, self.acked = file, base, base.consumed
        self.pending: deque[tuple[int, mqtt.MQTTMessageInfo]] = deque()
        self._last = time.monotonic()

    def add(self, seq: int, info: mqtt.MQTTMessageInfo) -> None:
        self.pending.append((seq, info))
        if self.file is None and len(self.pending) >= 1000:
            self._advance()

    def _advance(self) -> None:
        while self.pending and _acked(self.pending[0][1]):
            self.acked = self.pending.popleft()[0]
        PENDING.set(len(self.pending))

    def unacked(self) -> int:
        self._advance()
        return sum(not _acked(info) for _seq, info in self.pending)

    def save(self, *, force: bool = False) -> None:
        """Record the acknowledged prefix, at most every CHECKPOINT_S unless ``force``."""
        if self.file is None or (not force and time.monotonic() - self._last < CHECKPOINT_S):
            return
        self._last = time.monotonic()
        self._advance()
        done = Progress(self.acked, self.acked)
        if done != self.saved:
            self.file.save(done)
            self.saved = done


def publish_mqtt(
    events: Iterable[dict[str, Any]],
    broker: str,
    prefix: str,
    speedup: float | None,
    limit: int | None = None,
    client_id: str = "streamalert-simulator",
    *,
    progress: ProgressFile | None = None,
    clock: Clock | ClockGate | None = None,
) -> int:
    """Publish ``events``; return the exit code (0: every message acknowledged).
    ``limit`` counts over all runs with a ``progress`` file; see the module docstring.
    ``clock``: pace on this shared schedule (``app.eventtime.Clock``), with ``speedup``; a
    :class:`~app.runtime.clockgate.ClockGate`: on the clock it starts once the client is connected."""
    host, _, port = broker.rpartition(":")
    base = progress.load() if progress is not None else Progress()
    topics = f"{prefix}/+/state"
    if progress is not None and base.done(limit):
        leave(clock)
        logger.info("%s: already done (%d events sent); nothing to publish", progress.path, base.sent)
        _summary({"published": 0, "unacknowledged": 0, "mqtt": topics}, base.consumed, base)
        return 0
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
    if isinstance(clock, ClockGate):  # ready once connected, the bridge behind it subscribed (make run)
        while not (stop.is_set() or connected.wait(0.1)):
            pass
        clock = wait_sync(clock, stop)
    anchor = clock.anchor(time.monotonic(), time.time()) if clock else None
    pacer = Pacer(speedup, anchor=anchor) if speedup else None
    acks = _Acks(progress, base)
    stream = iter(events)
    skipped = sum(1 for _ in itertools.islice(stream, base.consumed))
    sent = 0
    try:
        for ev in stream:
            if stop.is_set() or (limit is not None and base.sent + sent >= limit):
                break
            if pacer is not None:
                delay = pacer.delay(parse_ts(ev["ts"]), time.monotonic())
                if delay > 0:
                    acks.save()
                    stop.wait(delay)
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
            sent += 1
            PUBLISHED.inc()
            acks.add(base.consumed + sent, info)
            acks.save()
        deadline = time.monotonic() + 10
        while acks.unacked() and time.monotonic() < deadline:
            time.sleep(0.05)
        unacked = acks.unacked()
        acks.save(force=True)
    finally:  # disconnect first: the network thread then ends at once (the other way round,
        # loop_stop waits out the thread's 1 s select)
        client.disconnect()
        client.loop_stop()
    summary = {"published": sent - unacked, "unacknowledged": unacked, "mqtt": topics}
    _summary(summary, skipped, acks.saved if progress is not None else None)
    return 1 if unacked else 0


def _summary(summary: dict[str, Any], skipped: int, progress: Progress | None) -> None:
    if progress is not None:
        summary |= {"skipped": skipped, "sent_total": progress.sent, "finished": progress.finished}
    sys.stdout.buffer.write(orjson.dumps(summary) + b"\n")
    sys.stdout.flush()
