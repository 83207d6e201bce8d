"""The webhook body: Alertmanager's v4 webhook payload plus our fields.

Existing Alertmanager receivers read ``version``, ``groupKey``, ``status``,
``receiver``, ``groupLabels``, ``commonLabels``, ``commonAnnotations``,
``externalURL``, ``truncatedAlerts`` and ``alerts[]`` (``status``, ``labels``,
``annotations``, ``startsAt``, ``endsAt``, ``generatorURL``, ``fingerprint``).
Each alert also carries ``alert_id``, ``rule_id``, ``rule_version``,
``severity`` and ``values``.

Compatibility choices: ``labels`` gain ``alertname`` (the rule id) and
``severity`` when the rule did not set them, as Alertmanager routes and
templates expect both; ``endsAt`` is ``0001-01-01T00:00:00Z`` (Go's zero time)
until the alert ends. The body and the message id are pure functions of the
alerts, so a retry sends the same bytes under the same ``webhook-id``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from app.alerts import Alert

logger = logging.getLogger(__name__)

NOT_ENDED = "0001-01-01T00:00:00Z"
PAYLOAD_VERSION = "4"


def webhook_id(alerts: Sequence[Alert]) -> str:
    """Standard Webhooks message id: ``msg_`` + the alert id for one alert, else
    a hash of the sorted distinct alert ids, so order does not matter."""
    ids = sorted({a.alert_id for a in alerts})
    if len(ids) == 1:
        return f"msg_{ids[0]}"
    return "msg_" + hashlib.sha256("\n".join(ids).encode()).hexdigest()[:32]


def alert_labels(alert: Alert) -> dict[str, str]:
    labels = dict(alert.labels)
    labels.setdefault("alertname", alert.rule_id)
    labels.setdefault("severity", alert.severity)
    return labels


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return {k: v for k, v in sorted(first.items()) if all(m.get(k) == v for m in maps[1:])}


def _absolute(url: str, external_url: str) -> str:
    if url.startswith("/") and external_url:
        return external_url.rstrip("/") + url
    return url


def build_payload(
    alerts: Sequence[Alert],
    *,
    receiver: str = "webhook",
    external_url: str = "",
    group_key: str | None = None,
    group_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The v4 payload for ``alerts`` (one notification). ``status`` is
    ``resolved`` when every alert is resolved, else ``firing``. The dispatcher
    passes its aggregation group's key and labels; without them the group is
    the rule (``alertname``) when all alerts share one."""
    labels = [alert_labels(a) for a in alerts]
    if group_labels is None:
        rules = {a.rule_id for a in alerts}
        group_labels = {"alertname": next(iter(rules))} if len(rules) == 1 else {}
    if group_key is None:
        group_key = "{}:{" + ",".join(f'{k}="{v}"' for k, v in sorted(group_labels.items())) + "}"
    items = [
        {
            "status": a.status,
            "labels": lbls,
            "annotations": dict(a.annotations),
            "startsAt": a.starts_at,
            "endsAt": a.ends_at or NOT_ENDED,
            "generatorURL": _absolute(a.generator_url, external_url),
            "fingerprint": a.fingerprint,
            "alert_id": a.alert_id,
            "rule_id": a.rule_id,
            "rule_version": a.rule_version,
            "severity": a.severity,
            "values": a.values,
        }
        for a, lbls in zip(alerts, labels, strict=True)
    ]
    return {
        "version": PAYLOAD_VERSION,
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": "resolved" if all(a.status == "resolved" for a in alerts) else "firing",
        "receiver": receiver,
        "groupLabels": dict(group_labels),
        "commonLabels": _common(labels),
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": external_url,
        "alerts": items,
    }


def alertmanager_alerts(alerts: Sequence[Alert], *, external_url: str = "") -> list[dict[str, Any]]:
    """The body of a push to Alertmanager's ``POST /api/v2/alerts`` (postable alerts).

    A firing alert carries no ``endsAt``: Alertmanager then keeps it active for
    its ``resolve_timeout``, so a route to an Alertmanager should repeat
    within that time. A resolved alert carries its ``endsAt``.
    """
    out = []
    for a in alerts:
        item: dict[str, Any] = {
            "labels": alert_labels(a),
            "annotations": dict(a.annotations),
            "startsAt": a.starts_at,
            "generatorURL": _absolute(a.generator_url, external_url),
        }
        if a.status == "resolved" and a.ends_at:
            item["endsAt"] = a.ends_at
        out.append(item)
    return out


def encode(payload: Mapping[str, Any] | Sequence[Any]) -> bytes:
    """Compact UTF-8 JSON; deterministic for a deterministic payload."""
    return orjson.dumps(payload)
