"""The crafted input of the native-absence conformance suite (``test_native_absence``): sensor
and log events that stress each way an absence begins and ends, and the registry table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.tables import Tables
from tests.conformance.threshold_cases import at

RULES = Path(__file__).with_name("absences.yaml")
#: on 2 partitions (murmur2): p-1, p-5, a-1, a-5 and ghost-c on 0; p-3, a-2, a-3, a-4, a-6, r-1,
#: ghost-a on 1
DEVICES = [{"device_id": d} for d in ("a-1", "r-1", "ghost-a", "ghost-c")]


def t(minute: float) -> str:
    return at(1000 + minute)


def crafted() -> Iterator[dict[str, Any]]:
    """In arrival order; every case is commented with what it tests."""

    def s(device: str, minute: float, temp: float = 20.0) -> dict[str, Any]:
        return {"device_id": device, "ts": t(minute), "temperature": temp}

    def log(client: str, minute: float) -> dict[str, Any]:
        return {"host": "www-1", "ts": t(minute), "client_ip": client, "path": "/", "status": 200}

    for m in range(0, 305, 5):
        yield s("p-1", m)  # pacers: move each partition's clock every 5 minutes
        yield s("p-3", m)
        if m <= 30 or m in (100, 105):
            yield s("a-1", m)  # silent from 30 to 100: fires at the pacers' 65, resolves at 100
        if m == 100:
            yield s("a-1", m)  # an exact duplicate of the resolving event
        if m <= 20:
            yield s("a-2", m)  # silent from 20 to the end: fires, never resolves
        if m <= 30 or m >= 125:
            yield s("a-4", m) if m != 155 else s("a-4", 130)  # 155: an old event, moves nothing
        if m == 120:
            yield s("a-4", 40)  # a backlog older than the silence's start: does not resolve it
        if m <= 30 or m >= 75:
            yield s("a-7", m)  # silent from 30: fires at 65 (its silence began at 60) ...
        if m == 70:
            yield s("a-7", 55)  # ... a backlog just short of 60 does not resolve it, 75 does
        if m == 200:
            yield s("a-3", 100)  # a first event late by more than the silence: fires at once
        if m == 205:
            yield s("a-3", 205)  # ... and resolves at its next
        if m in (0, 30) or m >= 60:
            yield s("a-5", m)  # back exactly at the deadline (30m, no lateness): on time
        yield s("a-6", m, 60.0 if m in (0, 5, 60, 100) else 20.0)  # hot readings stop, come back
        if m in (0, 40, 45, 90):
            yield s("p-5", m + 0.5, 150.0)  # the fleet's hot readings (abs-fleet-hot)
        if m >= 100:
            yield s("r-1", m)  # in the registry, first seen at 100: its wait began at 0
        if m in (0, 5, 50, 55):
            yield log("10.1.1.1", m)
        if m in (0, 30):
            yield log("10.1.1.4", m)


def tables() -> Tables:
    out = Tables()
    out.load_rows("devices", DEVICES)
    return out
