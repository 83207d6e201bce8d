"""The input of the rule-kind conformance suite (``test_kinds``), shared with the batch and
Spark stream tests: the rule file, the registry table, and the crafted window events on top of
the threshold suite's input."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from app.tables import Tables
from tests.conformance.threshold_cases import at, input_lines

RULES = Path(__file__).with_name("kinds.yaml")

DEVICES = [
    {"device_id": "machine-temp-1", "site": "plant-a", "max_temp": 95.0},
    {"device_id": "w-1", "site": "lab", "max_temp": 99.0},
    # never seen: registry-silent (expect_from) fires for them, one on each partition of 2
    {"device_id": "ghost-1", "site": "lab", "max_temp": 90.0},
    {"device_id": "ghost-3", "site": "lab", "max_temp": 90.0},
]


def crafted_windows() -> Iterator[dict[str, Any]]:
    """w-1 and w-2 share partition 1 of 2 (murmur2); every odd case is commented."""

    def w(device: str, minute: float, temp: float | None, **extra: Any) -> dict[str, Any]:
        return {"device_id": device, "ts": at(600 + minute), "temperature": temp, **extra}

    for m in range(0, 60, 5):
        yield w("w-1", m, 95.0 + m / 10, status="ok")
        yield w("w-2", m, 20.0)
    yield w("w-1", 62, 96.0, status="maint")  # status change
    yield w("w-1", 58, 97.0, status="maint")  # out of order, within hourly-heat's 10m lateness
    yield w("w-1", 62, 96.0, status="maint")  # exact duplicate
    for m in range(65, 95, 5):
        yield w("w-1", m, 96.0, status="ok")
        yield w("w-2", m, 20.0)
    yield w("w-1", 10, 200.0)  # late beyond every lateness: dropped, or copied aside (side)
    yield w("w-1", 86, 130.0)  # late for heat-rising's [60, 90) window: amend raises it
    yield w("w-1", 95, 96.0)
    yield w("w-1", 101, 125.0)  # overheat-held fires; 96 below clears, keep_firing_for holds it
    yield w("w-1", 102, 96.0)
    yield w("w-1", 110, 101.0)  # back within keep_firing_for: still the same alert
    yield w("w-1", 111, 90.0)
    for m in range(115, 200, 5):  # w-1 is silent from 111: w-2 moves the clock past 30m
        yield w("w-2", m, 21.0)
    yield w("w-1", 200, 96.0)  # w-1 is back: its absence resolves
    yield w("w-3", 201, 101.0)  # not in the registry: missing null vs skip

    def log(client: str, minute: float, status: int) -> dict[str, Any]:
        return {"host": "www-9", "ts": at(600 + minute), "client_ip": client, "path": "/x", "status": status}

    yield from (log("10.0.0.9", 0, 404), log("10.0.0.9", 1, 404), log("10.0.0.9", 2, 200))  # scan, then a hit
    yield from (log("10.0.0.8", 0, 500), log("10.0.0.8", 3, 404))  # no 200 within 2m of the 500


def lines_for_test() -> list[bytes]:
    return input_lines() + [orjson.dumps(e) for e in crafted_windows()]


def tables() -> Tables:
    t = Tables()
    t.load_rows("devices", DEVICES)
    return t
