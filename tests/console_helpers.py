"""Alerts, a seeded store and a users file for the console's tests (dashboard, browser)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from app.alerts import Alert
from app.console.users import hash_password, save_user
from app.rules.loader import load_rules
from app.storage.alert_store import AlertStore

PASSWORD = "correct horse battery"
#: when the seeded notification died: 2024-05-01T10:00:30Z, 30 s after pump-7 fired, as Unix seconds
NOTIFIED_AT = 1_714_557_630.0


def make_alert(
    device: str,
    status: str,
    severity: str = "critical",
    start: str = "2024-05-01T10:00:00Z",
    rule: str = "machine-overheat",
    values: dict[str, object] | None = None,
    event_ts: str | None = None,
) -> Alert:
    return Alert.build(
        rule_id=rule,
        rule_version="2",
        status=status,  # type: ignore[arg-type]
        severity=severity,
        labels={"device_id": device, "team": "plant-ops"},
        annotations={"summary": f"{device} runs hot", "runbook_url": "https://runbooks.example/overheat"},
        starts_at=start,
        ends_at="2024-05-01T10:09:00Z" if status == "resolved" else None,
        source="sensors",
        event_ts=event_ts or ("2024-05-01T10:09:00Z" if status == "resolved" else start),
        values=values if values is not None else {"temperature": 105.5},
    )


def seed(path: Path) -> list[Alert]:
    """pump-7 (critical, pending then firing), pump-9 (warning), fan-1 (fired, resolved),
    vehicle-01 (geofence, firing at a position, from the Spark engine; the others from Faust);
    a dead notification for pump-7."""
    alerts = [
        make_alert("pump-7", "pending", values={"temperature": 101.0}, event_ts="2024-05-01T09:50:00Z"),
        make_alert("pump-7", "firing", values={"temperature": 104.0}),
        make_alert("pump-9", "firing", "warning", "2024-05-01T10:02:00Z"),
        make_alert("fan-1", "firing"),
        make_alert("fan-1", "resolved"),
        make_alert("vehicle-01", "firing", "warning", "2024-05-01T10:03:00Z", rule="vehicle-geofence",
                   values={"lat": 48.2, "lon": 11.7}),
    ]  # fmt: skip
    firing_pump7 = alerts[1]
    with AlertStore(path) as store:
        store.apply_batch(alerts, engines=["faust"] * 5 + ["spark"])
        store.apply_batch(
            notifications=[{"event": "dead", "msg_id": "wh-123", "receiver": "ops", "group_key": "g",
                            "at": NOTIFIED_AT, "alert_ids": [firing_pump7.alert_id], "attempts": 2,
                            "reason": "answered 400"}],
        )  # fmt: skip
    return alerts


#: a rule file whose machine-overheat is another version than the seeded alerts' ("2")
RUNNING = """rules:
  - id: machine-overheat
    source: sensors
    where: temperature > 100
    group_by: [device_id]
    severity: critical
"""


def seed_with_a_running_rule(data_dir: Path, rules_dir: Path) -> tuple[list[Alert], str]:
    """:func:`seed`'s store, where every alert is open under a rule version no longer running
    once ``rules_dir`` holds :data:`RUNNING` (written here), and pump-1 firing under the version
    that runs; the seeded alerts and pump-1's fingerprint."""
    rules_dir.mkdir()
    (rules_dir / "iot.yaml").write_text(RUNNING)
    version = load_rules([rules_dir]).rules[0].version
    alerts = seed(data_dir / "alerts.sqlite3")
    current = dataclasses.replace(make_alert("pump-1", "firing"), rule_version=version)
    with AlertStore(data_dir / "alerts.sqlite3") as store:
        store.apply_batch([current], engines=["faust"])
    return alerts, current.fingerprint


def add_user(data_dir: Path, name: str = "ann", password: str = PASSWORD) -> Path:
    path = data_dir / "console-users.json"
    save_user(path, hash_password(name, password))
    return path
