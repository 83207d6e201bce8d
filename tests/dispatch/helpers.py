"""Factories for dispatcher tests: a fake clock, alerts and routes files written to tmp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from app.alerts import Alert
from app.dispatch.config import RoutesFile, load_routes
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.messages import OutboxMessage

SECRET = "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS1kaXNwYXRjaGVyLXRlc3Rz"
T0 = 1_700_000_000.0

BASE = f"""
receivers:
  - {{name: ops, type: webhook, url: "http://127.0.0.1:9/hook", secret: "{SECRET}"}}
  - {{name: pager, type: webhook, url: "http://127.0.0.1:9/pager", secret: "{SECRET}"}}
  - {{name: bus, type: kafka}}
  - {{name: quiet, type: kafka, send_resolved: false}}
"""


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def routes(tmp_path: Path, body: str, name: str = "routes.yaml") -> RoutesFile:
    path = tmp_path / name
    path.write_text(BASE + body)
    return load_routes(path, {})


def alert(
    device: str = "d1",
    status: str = "firing",
    start: str = "2024-05-01T10:00:00Z",
    event: str | None = None,
    severity: str = "critical",
    rule: str = "hot",
    **labels: str,
) -> Alert:
    ended = status == "resolved"
    event = event or ("2024-05-01T10:30:00Z" if ended else start)
    return Alert.build(
        rule_id=rule, rule_version="1", status=status,  # type: ignore[arg-type]
        severity=severity, labels={"alertname": rule, "severity": severity, "device_id": device, **labels},
        annotations={"summary": f"{device} is hot"}, starts_at=start, ends_at=event if ended else None,
        source="sensors", event_ts=event, values={"temp": 101},
    )  # fmt: skip


def sent(d: Dispatcher) -> list[OutboxMessage]:
    return d.take_effects().outbox


def ids_in(msg: OutboxMessage) -> list[tuple[str, str]]:
    """(device_id or alertname, status) of each alert in a message body (v4 payload)."""
    body: Any = orjson.loads(msg.body)
    return [(a["labels"].get("device_id", a["labels"]["alertname"]), a["status"]) for a in body["alerts"]]


def run_until(d: Dispatcher, clock: FakeClock, seconds: float, step: float = 1.0) -> list[OutboxMessage]:
    """Advance the clock in steps, ticking whenever a timer is due; collect the messages."""
    out: list[OutboxMessage] = []
    end = clock.now + seconds
    while clock.now < end:
        clock.advance(step)
        timer = d.next_timer()
        if timer is not None and timer <= clock.now:
            d.tick()
        out += sent(d)
    return out


TIMERS = """
route:
  receiver: ops
  group_by: [alertname]
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 4h
"""
