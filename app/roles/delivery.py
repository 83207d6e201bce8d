"""Delivery from the durable outbox: one sender per receiver, and the Kafka publisher.

:class:`OutboxSender` drains one receiver's pending outbox messages in order
(FIFO per receiver, so a receiver's outage never delays another's). Per
message, one attempt at a time through the receiver's notifier:

- success: the row becomes ``delivered`` and a ``delivered`` event is queued
  for the notifications topic, in one transaction;
- a retryable failure (5xx, 429, timeout, connection error, Kafka error): the
  next attempt is scheduled by the one :class:`~app.notify.RetryPolicy`
  (exponential backoff with full jitter, ``Retry-After`` honoured) and
  persisted, so a restart keeps the schedule;
- a non-retryable failure (another 4xx, a redirect), or a retry that would
  end past ``max_age`` since the message was queued: the row becomes
  ``dead`` (the dead-letter list) with the reason, logged at ERROR;
- a 410 Gone, an SSRF refusal, a webhook without URL, an invalid configuration
  (``invalid``: :func:`app.notify.check.receiver_problems`, as ``routes check``
  reports it) or a transport that raised something else than a NotifierError
  make the *receiver* unusable, alone: logged at ERROR once, its messages stay
  pending (so a corrected configuration delivers them after a reload or a
  restart) until ``max_age``, then dead. Every other receiver keeps delivering.

A kill -9 during an attempt leaves the row pending; the next run sends the
same body under the same ``webhook-id``. :class:`Publisher` produces the
rows of the ``publish`` table in order and deletes them once acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from prometheus_client import Counter, Gauge, Histogram

from app.dispatch.base import Clock, wall_clock
from app.errors import NotifierError
from app.notify import RetryPolicy, SSRFBlockedError
from app.notify.receivers import Notifier
from app.storage.dispatch_db import DispatchDB, OutboxRow
from app.topics import NOTIFICATIONS

logger = logging.getLogger(__name__)

DELIVERIES = Counter(
    "webhook_deliveries",
    "Notification attempts by outcome: delivered, retried (will be retried) and failed (dead-lettered).",
    ["outcome"],
)
ALERTS_SENT = Counter(
    "webhook_alerts", "Alerts in delivered or dead-lettered messages, by outcome.", ["outcome"]
)
DELIVERY_SECONDS = Histogram(
    "webhook_delivery_seconds",
    "Duration of one delivery attempt, in seconds.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
INFLIGHT = Gauge("webhook_inflight", "Delivery attempts in progress.")
PAUSED = Gauge(
    "webhook_delivery_paused",
    "1 per receiver that is unusable until restart (410 Gone, SSRF refusal, no URL, invalid configuration).",
    ["receiver"],
)
INVALID = Gauge(
    "dispatch_receiver_invalid",
    "1 per receiver disabled because its configuration is invalid (the ERROR log says why; "
    "`python -m app routes check` lists it).",
    ["receiver"],
)
for _outcome in ("delivered", "failed", "retried"):
    DELIVERIES.labels(_outcome)
for _outcome in ("delivered", "failed"):
    ALERTS_SENT.labels(_outcome)


def log_record(row: OutboxRow, event: str, at: float, reason: str = "") -> tuple[str, bytes, bytes]:
    """A ``delivered``/``dead`` event for the notifications topic (same key as its ``queued``)."""
    m = row.message
    value = {
        "event": event, "msg_id": m.msg_id, "receiver": m.receiver, "group_key": m.group_key, "at": at,
        "queued_at": m.created_at, "attempts": row.attempts + 1, "alert_ids": list(m.alert_ids),
        "notice": m.notice, "reason": reason,
    }  # fmt: skip
    return (NOTIFICATIONS, m.group_key.encode(), orjson.dumps(value))


class OutboxSender:
    """Delivers one receiver's outbox; see the module docstring. ``wake`` is set when new
    messages were committed; the sender clears it."""

    def __init__(
        self,
        db: DispatchDB,
        receiver: str,
        notifier: Notifier | None,
        policy: RetryPolicy,
        *,
        max_age_s: float,
        clock: Clock = wall_clock,
        on_published: Callable[[], None] = lambda: None,
        invalid: str = "",
    ) -> None:
        self.db = db
        self.receiver = receiver
        self.notifier = notifier
        self.policy = policy
        self.max_age_s = max_age_s
        self.clock = clock
        self.on_published = on_published
        self.wake = asyncio.Event()
        self.unusable = invalid and f"invalid configuration: {invalid}"
        if not self.unusable and notifier is None:
            self.unusable = "no URL configured"
        PAUSED.labels(receiver).set(1 if self.unusable else 0)
        INVALID.labels(receiver).set(1 if invalid else 0)

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop``; an attempt in progress finishes first (bounded by its timeout)."""
        if self.unusable:
            logger.error(
                "RECEIVER %s UNUSABLE: %s; its messages wait in the outbox", self.receiver, self.unusable
            )
        while not stop.is_set():
            row = self.db.next_pending(self.receiver)
            now = self.clock()
            if row is None:
                await self._wait(stop, 1.0)
                continue
            expires = row.message.created_at + self.max_age_s
            if self.unusable:
                if now >= expires:
                    self._dead(row, now, f"receiver unusable: {self.unusable}")
                else:
                    await self._wait(stop, min(expires - now, 1.0))
                continue
            if row.next_at > now:
                await self._wait(stop, min(row.next_at - now, 1.0))
                continue
            await self._attempt(row, now)

    async def _attempt(self, row: OutboxRow, now: float) -> None:
        assert self.notifier is not None  # noqa: S101 - unusable handled by run
        INFLIGHT.inc()
        started = time.perf_counter()
        try:
            await self.notifier.deliver(row.message.msg_id, row.message.body, row.message.group_key)
        except NotifierError as err:
            self._failed(row, err)
            return
        except Exception as exc:  # a transport's bug disables its receiver, not every receiver
            self._disable(row, f"delivery raised {exc!r}")
            return
        finally:
            INFLIGHT.dec()
            took = time.perf_counter() - started
            DELIVERY_SECONDS.observe(took)
        done = self.clock()
        self.db.finish(row.message.msg_id, "delivered", done, publish=[log_record(row, "delivered", done)])
        self.on_published()
        DELIVERIES.labels("delivered").inc()
        ALERTS_SENT.labels("delivered").inc(len(row.message.alert_ids))
        logger.info(
            "delivered %s to %s: group %s, %d alert(s), attempt %d, %.0f ms",
            row.message.msg_id, self.receiver, row.message.group_key, len(row.message.alert_ids),
            row.attempts + 1, took * 1000,
        )  # fmt: skip

    def _failed(self, row: OutboxRow, err: NotifierError) -> None:
        now = self.clock()
        if isinstance(err, SSRFBlockedError) or (self.notifier is not None and self.notifier.disabled):
            self._disable(row, str(err))
            return
        wait = self.policy.next_delay(row.attempts + 1, err, now - row.message.created_at)
        if wait is None or now + wait > row.message.created_at + self.max_age_s:
            self._dead(row, now, str(err))
            return
        DELIVERIES.labels("retried").inc()
        logger.warning(
            "%s attempt %d of %s failed, retry in %.2fs: %s",
            self.receiver, row.attempts + 1, row.message.msg_id, wait, err,
        )  # fmt: skip
        self.db.reschedule(row.message.msg_id, now + wait, str(err))

    def _disable(self, row: OutboxRow, reason: str) -> None:
        self.unusable = reason
        PAUSED.labels(self.receiver).set(1)
        logger.error("RECEIVER %s DISABLED until restart: %s", self.receiver, reason)
        self.db.reschedule(row.message.msg_id, self.clock(), reason)

    def _dead(self, row: OutboxRow, now: float, reason: str) -> None:
        self.db.finish(row.message.msg_id, "dead", now, reason, [log_record(row, "dead", now, reason)])
        self.on_published()
        DELIVERIES.labels("failed").inc()
        ALERTS_SENT.labels("failed").inc(len(row.message.alert_ids))
        logger.error(
            "DEAD LETTER %s to %s after %d attempt(s), alerts [%s]: %s",
            row.message.msg_id, self.receiver, row.attempts + 1, " ".join(row.message.alert_ids), reason,
        )  # fmt: skip

    async def _wait(self, stop: asyncio.Event, seconds: float) -> None:
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self.wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=max(seconds, 0.0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
        self.wake.clear()


class Publisher:
    """Produces the ``publish`` table's records in order; deletes them once acknowledged."""

    def __init__(self, db: DispatchDB, producer: AIOKafkaProducer) -> None:
        self.db = db
        self.producer = producer
        self.wake = asyncio.Event()
        #: the last flush failed: the next sends the first record alone, until one is acknowledged
        self.failing = False

    async def flush(self) -> int:
        """Publish everything queued now; return how many records. KafkaError propagates, once
        the records acknowledged before the first that failed are marked published; after a
        failure, the first record goes alone until the broker takes it. A record the broker
        kept refusing (it was an ACL) had the whole queue sent again with it, every second."""
        rows = self.db.to_publish(limit=1 if self.failing else 500)
        if not rows:
            return 0
        futures = [await self.producer.send(topic, value, key=key) for _, topic, key, value in rows]
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = next((i for i, r in enumerate(results) if isinstance(r, BaseException)), None)
        self.failing = failed is not None
        if failed is None:
            self.db.published(rows[-1][0])
            return len(rows)
        if failed:
            self.db.published(rows[failed - 1][0])
        raise results[failed]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                if await self.flush():
                    continue
            except KafkaError as exc:
                logger.warning("publishing to Kafka failed (%r); retrying in 1s", exc)
            try:
                await asyncio.wait_for(self.wake.wait(), 1.0)
            except TimeoutError:
                pass
            self.wake.clear()
        try:
            await asyncio.wait_for(self.flush(), 5.0)
        except (KafkaError, TimeoutError) as exc:
            logger.warning("could not publish the last records (%r); they go out on the next start", exc)
