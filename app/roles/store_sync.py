"""The ``store-sync`` role: the ``alerts``, ``commands`` and ``notifications`` topics into the SQLite store.

Lifecycle: :func:`run` opens the store at ``settings.store_path`` (creating
it), assigns itself every partition of the three topics and starts each at
the offset kept in the store, or at the beginning when the store has none
(first start, or the file was lost: the store is then rebuilt from the
topics). Each alert is recorded with its engine, from the record's ``engine`` header
(:func:`engine_of`). Per poll of up to ``max_batch`` records it applies every usable
alert, command and notification event *and the new offsets* in one durable
SQLite transaction, so a crash at any point resumes exactly where the kept
data ends. Offsets are also committed to Kafka (group ``alert-store``, best
effort) for lag monitoring. Unusable records are logged, counted as invalid
and skipped. On ``stop`` it finishes the current batch, then closes.

One store-sync per store file: it does not join a consumer group, so two
instances would both apply everything (harmless, as every write is
idempotent, but wasteful).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from prometheus_client import Counter

from app.alerts import Alert, order_key
from app.dispatch.commands import RESOLVED_BY_HAND, parse_command, verify_command
from app.kafka.clients import Target, assign_kept, commit_for_monitoring, make_consumer, stop_consumer
from app.kafka.wait import until_answered
from app.runtime.settings import Settings
from app.storage.alert_store import DEFAULT_ENGINE, AlertStore
from app.topics import ALERTS, COMMANDS, NOTIFICATIONS

logger = logging.getLogger(__name__)

GROUP_ID = "alert-store"
TOPICS = (ALERTS, COMMANDS, NOTIFICATIONS)

APPLIED = Counter(
    "store_alerts_applied",
    "Alerts applied to the alert store by result: new (first time seen) or duplicate "
    "(alert_id already stored, so nothing changed).",
    ["result"],
)
INVALID = Counter("store_alerts_invalid", "Records on the store's topics the store could not use.")
OPERATOR = Counter("store_records_applied", "Commands and notification events applied.", ["topic"])
FORGED = Counter("store_commands_forged", "Commands not recorded: unsigned, or signed with another key.")
for _result in ("new", "duplicate"):
    APPLIED.labels(_result)

Polled = dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]


#: an ``engine`` header's value the store records as is (anything else: "unknown")
_ENGINE_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def engine_of(headers: Sequence[tuple[str, bytes]] | None) -> str:
    """The engine an alert record names in its ``engine`` header (the Spark engine writes
    ``spark``); ``faust`` without one, as the Faust worker writes none. A value that is not a
    short lower-case name is recorded as ``unknown``."""
    for key, value in headers or ():
        if key == "engine":
            name = (value or b"").decode("utf-8", "replace")
            return name if _ENGINE_NAME.fullmatch(name) else "unknown"
    return DEFAULT_ENGINE


@dataclass
class Decoded:
    """A poll's usable records, in offset order per partition: alerts with the engine of
    each, commands and notification events."""

    alerts: list[Alert] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


def decode_batch(polled: Polled, secret: str) -> Decoded:
    """The usable records of a poll (:class:`Decoded`); logs and counts the records that are
    not usable."""
    out = Decoded()
    alerts, engines, commands, events = out.alerts, out.engines, out.commands, out.events
    for tp, records in polled.items():
        for rec in records:
            try:
                if tp.topic == ALERTS:
                    alert = Alert.from_json(rec.value or b"")
                    order_key(alert)
                    alerts.append(alert)
                    engines.append(engine_of(rec.headers))
                elif tp.topic == COMMANDS:
                    cmd = parse_command(rec.value or b"")
                    if not verify_command(cmd, secret):
                        FORGED.inc()
                        logger.error(
                            "not recording an unsigned or forged %s command at %s:%d@%d",
                            cmd.type,
                            *tp,
                            rec.offset,
                        )
                        continue
                    commands.append(cmd.model_dump())
                else:
                    event = orjson.loads(rec.value or b"")
                    if not isinstance(event, dict):
                        msg = "a notification event is a JSON object"
                        raise ValueError(msg)
                    if event.get("event") == RESOLVED_BY_HAND:  # a transition, as the dispatcher built it
                        alert = Alert.from_json(orjson.dumps(event["alert"]))
                        order_key(alert)
                        alerts.append(alert)
                        engines.append(engine_of(rec.headers))
                    else:
                        events.append(event)
            except (ValueError, TypeError, KeyError) as exc:
                INVALID.inc()
                logger.error("skipping unusable record at %s:%d@%d: %s", *tp, rec.offset, exc)
    return out


async def assign_from_store(
    consumer: AIOKafkaConsumer, store: AlertStore, bootstrap: Target
) -> dict[TopicPartition, int]:
    """Assign every partition of :data:`TOPICS` at the store's offset, or the beginning (also
    when the kept offset lies past the partition's end: the topic was recreated); the
    partitions' end offsets."""
    kept = store.offsets()
    marks = await assign_kept(consumer, bootstrap, list(TOPICS), kept)
    if not kept:
        logger.info("the store has no offsets: reading the topics from the beginning")
    return marks


async def run(settings: Settings, stop: asyncio.Event, *, max_batch: int = 500, poll_ms: int = 500) -> None:
    """Keep the alert store in sync with its topics until ``stop`` is set."""
    store = AlertStore(settings.store_path)
    consumer = make_consumer(settings, group_id=GROUP_ID)
    try:
        await consumer.start()
        assign = lambda: assign_from_store(consumer, store, settings)  # noqa: E731
        if await until_answered("assign the store's partitions", assign, stop) is None:
            return
        logger.info("syncing %s into %s", ", ".join(TOPICS), settings.store_path)
        while not stop.is_set():
            polled = await consumer.getmany(timeout_ms=poll_ms, max_records=max_batch)
            if not polled:
                continue
            got = decode_batch(polled, settings.command_secret.get_secret_value())
            offsets = {(tp.topic, tp.partition): recs[-1].offset + 1 for tp, recs in polled.items()}
            new = store.apply_batch(got.alerts, got.commands, got.events, offsets, engines=got.engines)
            APPLIED.labels("new").inc(new)
            APPLIED.labels("duplicate").inc(len(got.alerts) - new)
            OPERATOR.labels(COMMANDS).inc(len(got.commands))
            OPERATOR.labels(NOTIFICATIONS).inc(len(got.events))
            await commit_for_monitoring(consumer, {tp: recs[-1].offset + 1 for tp, recs in polled.items()})
    finally:
        await stop_consumer(consumer)
        store.close()
        logger.info("store sync stopped")
