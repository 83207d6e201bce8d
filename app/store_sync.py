"""The ``store-sync`` role: the ``alerts`` topic into the SQLite alert store.

Lifecycle: :func:`run` opens the store at ``settings.store_path`` (creating
it), joins consumer group ``alert-store`` and, per poll of up to
``max_batch`` records, applies every decodable alert in one durable SQLite
transaction, then commits the polled offsets. A crash between the two
re-applies the batch on restart, which the store ignores (``alert_id`` is
its key), so the store converges to exactly one row per transition.
Undecodable records and alerts the store rejects (bad times or status) are
logged, counted as invalid and committed. On ``stop`` it finishes the
current batch, then closes the consumer and the store.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Counter

from app.alerts import Alert
from app.config import Settings
from app.kafka import make_consumer
from app.store import AlertStore, order_key
from app.topics import ALERTS

logger = logging.getLogger(__name__)

GROUP_ID = "alert-store"

APPLIED = Counter(
    "store_alerts_applied",
    "Alerts applied to the alert store by result: new (first time seen) or duplicate "
    "(alert_id already stored, so nothing changed).",
    ["result"],
)
INVALID = Counter("store_alerts_invalid", "Records on the alerts topic the store could not use.")
for _result in ("new", "duplicate"):
    APPLIED.labels(_result)


def decode_batch(polled: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> list[Alert]:
    """The usable alerts of a poll, in offset order per partition; logs and counts the rest."""
    out: list[Alert] = []
    for tp, records in polled.items():
        for rec in records:
            try:
                alert = Alert.from_json(rec.value or b"")
                order_key(alert)
            except (ValueError, TypeError, KeyError) as exc:
                INVALID.inc()
                logger.error("skipping unusable alert at %s:%d@%d: %s", *tp, rec.offset, exc)
                continue
            out.append(alert)
    return out


async def run(settings: Settings, stop: asyncio.Event, *, max_batch: int = 500, poll_ms: int = 500) -> None:
    """Keep the alert store in sync with the ``alerts`` topic until ``stop`` is set."""
    store = AlertStore(settings.store_path)
    consumer = make_consumer(settings, ALERTS, group_id=GROUP_ID)
    try:
        await consumer.start()
        logger.info("syncing alerts into %s", settings.store_path)
        while not stop.is_set():
            polled = await consumer.getmany(timeout_ms=poll_ms, max_records=max_batch)
            if not polled:
                continue
            alerts = decode_batch(polled)
            new = store.apply_many(alerts)
            APPLIED.labels("new").inc(new)
            APPLIED.labels("duplicate").inc(len(alerts) - new)
            try:
                await consumer.commit({tp: recs[-1].offset + 1 for tp, recs in polled.items()})
            except KafkaError as exc:
                logger.warning("offset commit failed (%r); the batch will be re-applied (no-op)", exc)
    finally:
        await consumer.stop()
        store.close()
        logger.info("store sync stopped")
