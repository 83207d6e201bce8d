"""Outbox messages: one notification to one receiver, with its id and body fixed at enqueue time.

The body is built once, when the dispatcher decides to notify, and stored
with the message, so every retry and every redelivery after a crash sends
the same bytes under the same ``webhook-id``. The id is
``msg_`` + a hash of (receiver, group key, notification sequence number,
alert ids): a retry keeps it, a repeat notification (a later sequence
number) gets a new one.

Body per receiver type: ``webhook`` and ``kafka`` get the Alertmanager v4
payload plus our fields; ``alertmanager`` gets the postable-alerts list of
``POST /api/v2/alerts``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.alerts import Alert
from app.notify.config import AlertmanagerReceiverConfig, AnyReceiver
from app.notify.payload import alertmanager_alerts, build_payload, encode

logger = logging.getLogger(__name__)

ReceiverConfig = AnyReceiver


@dataclass(frozen=True)
class OutboxMessage:
    """One notification waiting for delivery. ``created_at`` is epoch seconds."""

    msg_id: str
    receiver: str
    group_key: str
    created_at: float
    body: bytes
    alert_ids: tuple[str, ...]
    notice: str = ""  # "", "flapping", "storm" or "escalation"

    def log_event(self, extra: Mapping[str, Any]) -> dict[str, Any]:
        """The ``queued`` event published on the notifications topic (body included,
        so the outbox can be rebuilt from the topic)."""
        return {
            "event": "queued", "msg_id": self.msg_id, "receiver": self.receiver, "group_key": self.group_key,
            "at": self.created_at, "alert_ids": list(self.alert_ids), "notice": self.notice,
            "body": self.body.decode(), **extra,
        }  # fmt: skip


def message_id(receiver: str, group_key: str, seq: int, alerts: Sequence[Alert]) -> str:
    ids = sorted({a.alert_id for a in alerts})
    raw = "\x1f".join((receiver, group_key, str(seq), *ids)).encode()
    return "msg_" + hashlib.sha256(raw).hexdigest()[:32]


def build_message(
    receiver: ReceiverConfig,
    alerts: Sequence[Alert],
    *,
    group_key: str,
    group_labels: Mapping[str, str],
    seq: int,
    now: float,
    external_url: str = "",
    notice: str = "",
) -> OutboxMessage:
    """The outbox message for ``alerts`` (non-empty) to ``receiver``."""
    if isinstance(receiver, AlertmanagerReceiverConfig):
        body = encode(alertmanager_alerts(alerts, external_url=external_url))
    else:
        payload = build_payload(
            alerts,
            receiver=receiver.name,
            external_url=external_url,
            group_key=group_key,
            group_labels=group_labels,
        )
        if notice:
            payload["notice"] = notice
        body = encode(payload)
    return OutboxMessage(
        msg_id=message_id(receiver.name, group_key, seq, alerts),
        receiver=receiver.name,
        group_key=group_key,
        created_at=now,
        body=body,
        alert_ids=tuple(a.alert_id for a in alerts),
        notice=notice,
    )
