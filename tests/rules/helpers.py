"""Factories of the evaluator tests: a rule file written to tmp, sensor events at a minute
after 2024-01-01, and a threshold rule to vary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from app.events import SENSORS, Event
from app.rules.loader import RuleSet, load_rules

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def rules(tmp_path: Path, body: str) -> RuleSet:
    """The rule set of ``body`` (the items under ``rules:``), written to ``tmp_path``."""
    f = tmp_path / "r.yaml"
    f.write_text("rules:\n" + body)
    return load_rules([f])


def sensor(minute: int, temp: float | None, device: str = "d1") -> tuple[str, Event]:
    """A sensors event of ``device`` at ``minute`` minutes after :data:`T0`."""
    ts = (T0 + timedelta(minutes=minute)).isoformat()
    return "sensors", SENSORS.validate({"device_id": device, "ts": ts, "temperature": temp})


#: a threshold rule (temperature > 100 per device) the tests vary with options
HOT = """  - id: hot
    source: sensors
    where: temperature > 100
    group_by: [device_id]
    severity: critical
    annotations: {summary: "{{ device_id }} at {{ temperature }}"}
"""
