"""``python -m ingest mqtt``: bridge MQTT sensor topics to ``events.sensors``.

Delivery: at least once, end to end. The bridge subscribes at QoS 1 with a
persistent session (``clean_session=False`` and a stable ``client_id``), so
the MQTT broker keeps messages published while the bridge is away (mosquitto:
up to ``max_queued_messages``, 1000 by default). Acknowledgements are manual:
a message's PUBACK is sent only once its event (or its dead-letter record) is
acknowledged by Kafka, in the order the messages arrived (MQTT 3.1.1, 4.6).
A crash therefore loses nothing; the broker redelivers what was not acked,
which may duplicate events already on the topic.

Reconnects: paho-mqtt's network thread reconnects on its own with an
exponential backoff between ``reconnect_min_s`` and ``reconnect_max_s``; the
first connection is retried the same way, so the bridge may start before the
broker. Every (re)connect subscribes again (a broker without persistence
forgets sessions when it restarts). Acks owed on a previous connection are not
sent on the new one, since the broker redelivers those messages itself.

Threading: paho callbacks run in its network thread and only hand messages to
the event loop (``call_soon_threadsafe``); all publishing and acking happens
in the loop. When more than ``max_queue`` messages wait, the network thread
pauses reading, which slows the broker down instead of growing memory.

Stopping: messages already received are published, everything is flushed and
acked, then the client disconnects (the session stays on the broker).

Start-up: a message published before the first subscription exists is dropped by
the broker (nobody subscribed yet). ``ready_file`` (``--ready-file``) is written
once the broker acknowledged the subscription; ``make run`` starts the fleet
simulator only then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client import Counter

from app.errors import IngestDecodeError
from app.runtime.settings import Settings
from app.topics import SENSORS
from ingest.mqtt.mapping import MappingRule
from ingest.publisher import Delivery, Publisher
from ingest.runtime import AdapterSummary, take_batch

logger = logging.getLogger(__name__)

MESSAGES = Counter("ingest_mqtt_messages_total", "MQTT messages received")
CONNECTS = Counter("ingest_mqtt_connects_total", "Successful MQTT (re)connections")


@dataclass(frozen=True)
class MqttOptions:
    """Broker address, session identity, mapping rules and limits (seconds)."""

    host: str
    port: int
    client_id: str
    rules: tuple[MappingRule, ...]
    qos: int = 1
    keepalive_s: int = 30
    reconnect_min_s: int = 1
    reconnect_max_s: int = 30
    username: str | None = None
    password: str | None = None
    max_queue: int = 10_000
    ready_file: Path | None = None  # written once the broker confirmed the first subscription


class _Message(NamedTuple):
    generation: int
    mid: int
    qos: int
    topic: str
    payload: bytes
    received_ms: int


class _Client:
    """The paho client and its thread-side state. Callbacks run in paho's thread."""

    def __init__(self, opts: MqttOptions, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue[_Message]):
        self.opts, self._loop, self._inbox = opts, loop, inbox
        self.generation = 0  # bumped on every successful connect, read by the loop
        self.connected = threading.Event()
        self.subscribed = threading.Event()  # the broker acknowledged a subscription (SUBACK)
        self.closing = False
        self._handoff: list[_Message] = []  # filled by paho's thread, emptied by the loop
        self._lock = threading.Lock()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=opts.client_id, clean_session=False, manual_ack=True
        )
        client.reconnect_delay_set(opts.reconnect_min_s, opts.reconnect_max_s)
        if opts.username is not None:
            client.username_pw_set(opts.username, opts.password)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = lambda *_a: self.subscribed.set()
        self.paho = client

    def _on_connect(self, client: mqtt.Client, _ud: Any, flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            logger.warning("MQTT connect to %s:%d refused: %s", self.opts.host, self.opts.port, reason)
            return
        self.generation += 1
        CONNECTS.inc()
        client.subscribe([(r.subscription, self.opts.qos) for r in self.opts.rules])
        logger.info(
            "MQTT connected to %s:%d as %s (session present: %s)",
            self.opts.host, self.opts.port, self.opts.client_id, flags.session_present,
        )  # fmt: skip
        self.connected.set()

    def _on_disconnect(self, _c: mqtt.Client, _ud: Any, _flags: Any, reason: Any, _props: Any) -> None:
        self.connected.clear()
        if not self.closing:
            logger.warning("MQTT connection lost (%s); reconnecting with backoff", reason)

    def _on_message(self, _c: mqtt.Client, _ud: Any, msg: mqtt.MQTTMessage) -> None:
        while self._inbox.qsize() > self.opts.max_queue and not self.closing:
            time.sleep(0.01)  # backpressure: stop reading the socket until the loop catches up
        now_ms = time.time_ns() // 1_000_000
        item = _Message(self.generation, msg.mid, msg.qos, msg.topic, bytes(msg.payload), now_ms)
        with self._lock:
            self._handoff.append(item)
            wake = len(self._handoff) == 1  # one loop wake-up per burst, not per message
        if wake:
            self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        """In the event loop: move the handed-off messages to the inbox, in order."""
        with self._lock:
            items, self._handoff = self._handoff, []
        for item in items:
            self._inbox.put_nowait(item)


class _Acker:
    """Sends PUBACKs in arrival order once each message's record is acknowledged."""

    def __init__(self, client: _Client) -> None:
        self._client = client
        self._queue: deque[tuple[_Message, Delivery]] = deque()
        self.acked = self.failed = 0

    def add(self, message: _Message, delivery: Delivery) -> None:
        self._queue.append((message, delivery))
        delivery.add_done_callback(lambda _f: self.ack_ready())

    def ack_ready(self) -> None:
        while self._queue and self._queue[0][1].done():
            message, fut = self._queue[0]
            if fut.cancelled() or fut.exception() is not None:
                self.failed += 1
                return  # never ack past a record Kafka does not have: the broker will redeliver
            self._queue.popleft()
            if message.qos > 0 and message.generation == self._client.generation:
                self._client.paho.ack(message.mid, message.qos)
                self.acked += 1


def match(rules: tuple[MappingRule, ...], topic: str) -> tuple[MappingRule, dict[str, str]] | None:
    """The first rule matching ``topic`` and its captured names."""
    for rule in rules:
        names = rule.match(topic)
        if names is not None:
            return rule, names
    return None


async def bridge(
    settings: Settings,
    opts: MqttOptions,
    stop: asyncio.Event,
    on_connected: Callable[[], None] | None = None,
) -> AdapterSummary:
    """Bridge until ``stop`` is set; ``on_connected`` runs after the first subscribe."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[_Message] = asyncio.Queue()
    client = _Client(opts, loop, inbox)
    acker = _Acker(client)
    received = 0
    async with Publisher(settings, SENSORS, "sensors", "mqtt") as pub:

        async def publish(message: _Message) -> None:
            found = match(opts.rules, message.topic)
            where = f"mqtt topic {message.topic}"
            try:
                if found is None:
                    msg = "no mapping rule matches the topic"
                    raise IngestDecodeError(msg)
                rule, names = found
                record = rule.to_record(names, message.payload, message.received_ms)
            except (IngestDecodeError, UnicodeDecodeError) as exc:
                reason = exc.reason if isinstance(exc, IngestDecodeError) else f"payload is not UTF-8: {exc}"
                field = exc.field if isinstance(exc, IngestDecodeError) else None
                acker.add(message, await pub.reject(f"{where}: {reason}", message.payload, field=field))
                return
            acker.add(message, await pub.submit(record, where=where))

        client.paho.connect_async(opts.host, opts.port, opts.keepalive_s)
        client.paho.loop_start()
        try:
            if on_connected is not None:
                await _wait_connected(client, stop)
                on_connected()
            if opts.ready_file is not None:
                await _wait_subscribed(client, stop)
                _write_ready(opts.ready_file, opts.client_id)
            while not stop.is_set() and not acker.failed and (batch := await take_batch(inbox, stop)):
                for message in batch:
                    received += 1
                    MESSAGES.inc()
                    await publish(message)
            for _ in range(inbox.qsize()):  # what arrived before the stop; later ones are redelivered
                if acker.failed:
                    break
                received += 1
                MESSAGES.inc()
                await publish(inbox.get_nowait())
            await pub.flush(timeout_s=60)
            acker.ack_ready()
        finally:
            client.closing = True
            client.paho.disconnect()
            await asyncio.to_thread(client.paho.loop_stop)
    extra = {"messages": received, "mqtt_acked": acker.acked, "redelivered_later": inbox.qsize()}
    return AdapterSummary.of(pub, **extra)


async def _wait_connected(client: _Client, stop: asyncio.Event) -> None:
    while not client.connected.is_set() and not stop.is_set():
        await asyncio.sleep(0.05)


async def _wait_subscribed(client: _Client, stop: asyncio.Event) -> None:
    while not client.subscribed.is_set() and not stop.is_set():
        await asyncio.sleep(0.05)


def _write_ready(path: Path, client_id: str) -> None:
    """Atomically create ``path``: publishers waiting for it know the broker now queues
    the subscribed topics for this session, so nothing they send is dropped."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{client_id} subscribed\n")
    os.replace(tmp, path)
