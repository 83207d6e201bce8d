"""The transport of each receiver type: signed webhook, Alertmanager API push, Kafka topic.

Every transport makes one attempt per :meth:`Notifier.deliver` call and
raises :class:`~app.errors.NotifierError` with ``retryable`` set as the retry
policy needs it; ``disabled`` turns true when the endpoint is gone (410).
:func:`make_notifier` builds the transport of one configured receiver.
"""

from __future__ import annotations

import logging
from typing import Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from app.errors import NotifierError
from app.notify.config import AlertmanagerReceiverConfig, KafkaReceiverConfig, WebhookReceiverConfig
from app.notify.config import AnyReceiver as ReceiverConfig
from app.notify.webhook import WebhookNotifier

logger = logging.getLogger(__name__)


class Notifier(Protocol):
    """One receiver's transport: one attempt per call, classified by NotifierError.retryable."""

    disabled: bool

    async def deliver(self, msg_id: str, body: bytes, key: str = "") -> None:
        """Send ``body`` once under ``msg_id``; ``key`` (the group key) is the Kafka record key."""
        ...

    async def aclose(self) -> None: ...


class KafkaNotifier:
    """Produces the message to ``topic`` (key: group key, header ``webhook-id``) and waits for the ack."""

    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.disabled = False

    async def deliver(self, msg_id: str, body: bytes, key: str = "") -> None:
        try:
            await self.producer.send_and_wait(
                self.topic, body, key=key.encode(), headers=[("webhook-id", msg_id.encode())]
            )
        except KafkaError as exc:
            msg = f"kafka receiver topic {self.topic}: {exc!r}"
            raise NotifierError(msg, retryable=True) from None

    async def aclose(self) -> None:
        return None


def make_notifier(
    cfg: ReceiverConfig,
    *,
    producer: AIOKafkaProducer,
    allow_private: tuple[str, ...],
    external_url: str = "",
) -> Notifier | None:
    """The transport of one configured receiver; None for a webhook without URL."""
    if isinstance(cfg, KafkaReceiverConfig):
        return KafkaNotifier(producer, cfg.topic_name)
    if not cfg.url.strip():
        return None
    if isinstance(cfg, AlertmanagerReceiverConfig):
        url = cfg.url.rstrip("/") + "/api/v2/alerts"
        return WebhookNotifier(url, None, cfg.timeout, cfg.headers, allow_private, receiver=cfg.name)
    assert isinstance(cfg, WebhookReceiverConfig)  # noqa: S101 - the union is closed
    return WebhookNotifier(
        cfg.url,
        cfg.secret.get_secret_value(),
        cfg.timeout,
        cfg.headers,
        allow_private,
        receiver=cfg.name,
        external_url=external_url,
    )
