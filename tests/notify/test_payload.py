"""The v4 body and the message id are pure functions of the alerts."""

from __future__ import annotations

from app.notify import NOT_ENDED, build_payload, webhook_id
from tests.notify.servers import make_alert


def test_firing_alert_has_alertmanager_v4_fields_and_ours() -> None:
    alert = make_alert(1)
    body = build_payload([alert], external_url="http://alerts.example")
    assert body["version"] == "4"
    assert body["status"] == "firing"
    assert body["truncatedAlerts"] == 0
    assert body["groupLabels"] == {"alertname": "cpu_hot"}
    assert body["groupKey"] == '{}:{alertname="cpu_hot"}'
    (item,) = body["alerts"]
    assert item["endsAt"] == NOT_ENDED
    assert item["startsAt"] == "2024-05-01T10:00:00Z"
    assert item["labels"] == {"device_id": "dev-1", "alertname": "cpu_hot", "severity": "critical"}
    assert item["generatorURL"] == "http://alerts.example/rules/cpu_hot"
    assert item["fingerprint"] == alert.fingerprint
    assert (item["alert_id"], item["rule_version"], item["values"]) == (alert.alert_id, "3", {"temp_c": 92.5})


def test_batch_status_and_common_labels() -> None:
    a, b = make_alert(1, "resolved", site="x"), make_alert(2, "resolved", site="x")
    body = build_payload([a, b])
    assert body["status"] == "resolved"
    assert body["commonLabels"] == {"alertname": "cpu_hot", "severity": "critical", "site": "x"}
    assert body["alerts"][0]["endsAt"] == "2024-05-01T10:05:00Z"
    assert build_payload([a, make_alert(3)])["status"] == "firing"


def test_webhook_id_is_stable_order_free_and_distinct() -> None:
    a, b, c = make_alert(1), make_alert(2), make_alert(3)
    assert webhook_id([a]) == f"msg_{a.alert_id}"
    assert webhook_id([a, b]) == webhook_id([b, a]) == webhook_id([b, a, b])
    assert webhook_id([a, b]) != webhook_id([a, c])
    assert webhook_id([a, b]).startswith("msg_")
