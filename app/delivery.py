"""The ``deliver`` role: alerts from the ``alerts`` topic to the signed webhook.

Lifecycle: :func:`run` joins consumer group ``delivery``, then per poll takes
up to ``max_batch`` alerts (all partitions together, offset order kept within
each partition), sends them as one signed webhook message under the retry
policy, and commits the polled offsets only after the message was delivered
or given up. It returns after ``stop`` is set: an HTTP attempt in progress
finishes (bounded by ``timeout_s``), a retry wait is cut short and its alerts
stay uncommitted, then the consumer and HTTP client are closed.

Only statuses in ``statuses`` are sent (default firing and resolved, as
Prometheus never notifies pending alerts); the rest are committed as skipped.
An alert id delivered or given up among the last ``dedup_window`` ids is not
sent again (duplicates on the topic come from producer retries and replays).
Two failures are about the endpoint, not the alerts: a 410 Gone and a URL
the SSRF guard refuses. After either, the role pauses until restart without
committing that message, so it and every later alert stay in Kafka for a
corrected configuration. A URL that is not http(s) with a host fails
:func:`run` at once with ConfigError.

Delivery is at least once: a crash, or a rebalance before the commit, sends
the uncommitted alerts again. ``webhook-id`` is stable across the retries of
one message, but a restart may group alerts differently, so ``alert_id`` is
the key receivers should dedup on. Known limit until the durable outbox exists: alerts the policy
gives up on are logged at ERROR with their alert ids and counted as failed,
then committed; nothing keeps them for a later attempt. While one message is
retried, no other alert is sent (head-of-line blocking).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import Literal

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import Counter, Gauge, Histogram

from app.alerts import Alert
from app.config import Settings
from app.errors import NotifierError
from app.kafka import make_consumer
from app.notify import RetryAbortedError, RetryPolicy, SSRFBlockedError, WebhookNotifier
from app.topics import ALERTS

logger = logging.getLogger(__name__)

GROUP_ID = "delivery"
Outcome = Literal["done", "aborted", "paused"]
DELIVERED_STATUSES = ("firing", "resolved")

DELIVERIES = Counter(
    "webhook_deliveries",
    "Webhook messages (one request carrying a batch of alerts) by outcome: delivered, "
    "failed (given up or refused) and retried (a failed attempt that will be retried).",
    ["outcome"],
)
ALERTS_SENT = Counter(
    "webhook_alerts",
    "Alerts read by the delivery role by outcome: delivered, failed, skipped (status not "
    "delivered), duplicate (alert id sent recently) and invalid (undecodable record).",
    ["outcome"],
)
DELIVERY_SECONDS = Histogram(
    "webhook_delivery_seconds",
    "Duration of one webhook HTTP attempt, in seconds.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
INFLIGHT = Gauge("webhook_inflight", "Webhook HTTP attempts in progress.")
PAUSED = Gauge(
    "webhook_delivery_paused",
    "1 while delivery is paused until restart: the receiver answered 410 Gone or the SSRF guard "
    "refused the URL.",
)
for _outcome in ("delivered", "failed", "retried"):
    DELIVERIES.labels(_outcome)
for _outcome in ("delivered", "failed", "skipped", "duplicate", "invalid"):
    ALERTS_SENT.labels(_outcome)


async def run(
    settings: Settings,
    stop: asyncio.Event,
    *,
    policy: RetryPolicy | None = None,
    max_batch: int = 50,
    timeout_s: float = 10.0,
    statuses: Collection[str] = DELIVERED_STATUSES,
    poll_ms: int = 500,
    dedup_window: int = 10_000,
    external_url: str = "",
) -> None:
    """Deliver alerts until ``stop`` is set; see the module docstring.

    Options: ``policy`` (default ``RetryPolicy()``: 1 s base, 60 s cap, 10
    attempts, 15 min), ``max_batch`` alerts per message, ``timeout_s`` per HTTP
    attempt, ``statuses`` to send, ``poll_ms`` per poll (the stop latency while
    idle), ``dedup_window`` alert ids remembered and ``external_url`` (makes
    the payload's ``generatorURL`` absolute). With an empty
    ``settings.webhook_url`` it logs that delivery is disabled and only waits.
    """
    if not settings.webhook_url:
        logger.warning("webhook delivery disabled: APP_WEBHOOK_URL is empty; idling until stop")
        await stop.wait()
        return
    policy = policy or RetryPolicy()
    PAUSED.set(0)
    notifier = WebhookNotifier(
        settings.webhook_url,
        settings.webhook_secret,
        timeout_s,
        allow_private=settings.webhook_allow_private,
        external_url=external_url,
    )
    # The consumer must not leave the group while one message is being retried.
    budget_s = (policy.max_age_s or 86_400) + policy.cap_s + timeout_s + 60
    consumer = make_consumer(settings, ALERTS, group_id=GROUP_ID, max_poll_interval_ms=int(budget_s * 1000))
    recent: OrderedDict[str, None] = OrderedDict()
    try:
        await consumer.start()
        logger.info("delivering alerts to %s (batch <= %d)", notifier.safe_url, max_batch)
        while not stop.is_set():
            polled = await consumer.getmany(timeout_ms=poll_ms, max_records=max_batch)
            if not polled:
                continue
            alerts = _decode(polled, statuses, recent)
            outcome = await _send(alerts, notifier, policy, stop) if alerts else "done"
            if outcome == "aborted":
                break
            if outcome == "paused":
                PAUSED.set(1)
                logger.error("delivery paused until restart; alerts stay uncommitted in Kafka")
                await stop.wait()
                break
            _remember(recent, (a.alert_id for a in alerts), dedup_window)
            await _commit(consumer, polled)
    finally:
        await consumer.stop()
        await notifier.aclose()
        logger.info("delivery stopped")


def _decode(
    polled: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
    statuses: Collection[str],
    recent: OrderedDict[str, None],
) -> list[Alert]:
    """The alerts of one poll worth sending, in offset order per partition, once each."""
    alerts: dict[str, Alert] = {}
    for tp, records in polled.items():
        for rec in records:
            try:
                alert = Alert.from_json(rec.value or b"")
            except (ValueError, TypeError, KeyError) as exc:
                ALERTS_SENT.labels("invalid").inc()
                logger.error("skipping undecodable alert at %s:%d@%d: %s", *tp, rec.offset, exc)
                continue
            if alert.status not in statuses:
                ALERTS_SENT.labels("skipped").inc()
            elif alert.alert_id in recent or alert.alert_id in alerts:
                ALERTS_SENT.labels("duplicate").inc()
            else:
                alerts[alert.alert_id] = alert
    return list(alerts.values())


def _remember(recent: OrderedDict[str, None], ids: Iterable[str], window: int) -> None:
    for alert_id in ids:
        recent[alert_id] = None
        recent.move_to_end(alert_id)
    while len(recent) > window:
        recent.popitem(last=False)


async def _commit(
    consumer: AIOKafkaConsumer, polled: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]
) -> None:
    """Commit past the polled records; a failure (say, a rebalance) is logged, not raised."""
    try:
        await consumer.commit({tp: records[-1].offset + 1 for tp, records in polled.items()})
    except KafkaError as exc:
        logger.warning("offset commit failed (%r); these alerts may be delivered again", exc)


async def _send(
    alerts: list[Alert], notifier: WebhookNotifier, policy: RetryPolicy, stop: asyncio.Event
) -> Outcome:
    """One message under the policy: ``done`` (delivered or given up, so commit),
    ``aborted`` (stop during a retry wait) or ``paused`` (the endpoint is unusable)."""

    async def attempt() -> None:
        INFLIGHT.inc()
        started = time.perf_counter()
        try:
            await notifier.send(alerts)
        finally:
            INFLIGHT.dec()
            DELIVERY_SECONDS.observe(time.perf_counter() - started)

    def on_retry(n: int, err: NotifierError, wait: float) -> None:
        DELIVERIES.labels("retried").inc()
        logger.warning(
            "webhook attempt %d for %d alert(s) failed, retry in %.2fs: %s", n, len(alerts), wait, err
        )

    try:
        await policy.run(attempt, stop=stop, on_retry=on_retry)
    except RetryAbortedError:
        logger.info("stopping: %d alert(s) left uncommitted for the next run", len(alerts))
        return "aborted"
    except NotifierError as err:
        DELIVERIES.labels("failed").inc()
        if notifier.disabled or isinstance(err, SSRFBlockedError):
            logger.error("webhook endpoint unusable: %s", err)
            return "paused"
        ALERTS_SENT.labels("failed").inc(len(alerts))
        ids = " ".join(a.alert_id for a in alerts)
        logger.error("gave up delivering %d alert(s) [%s]: %s", len(alerts), ids, err)
        return "done"
    DELIVERIES.labels("delivered").inc()
    ALERTS_SENT.labels("delivered").inc(len(alerts))
    return "done"
