"""The crafted input of the native change conformance suite (``test_native_changes``): sensor
and log events that stress each way a change fires, extends its alert and resolves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conformance.threshold_cases import at

RULES = Path(__file__).with_name("changes.yaml")


def t(minute: float) -> str:
    return at(3000 + minute)


def crafted() -> Iterator[dict[str, Any]]:
    """In arrival order; every case is commented with what it tests."""

    def s(device: str, minute: float, status: str | None, temp: float = 20.0, **extra: Any) -> dict[str, Any]:
        event = {"device_id": device, "ts": t(minute), "temperature": temp, **extra}
        return event if status is None else {**event, "status": status}

    def log(client: str, minute: float, status: int) -> dict[str, Any]:
        return {"host": "www-1", "ts": t(minute), "client_ip": client, "path": "/", "status": status}

    for m in range(0, 121, 2):
        yield s("p-1", m, "ok", kind="pacer")  # moves the clock
        yield s("p-3", m, "ok", kind="pacer")
        if m in (0, 2, 10, 12, 14, 30, 60):
            status = {10: "maint", 12: "maint", 14: "ok", 30: "maint", 60: "ok"}.get(m, "ok")
            yield s("s-1", m, status)  # ok -> maint at 10 (fires), -> ok at 14 (extends to 19)
        if m == 20:
            yield s("s-1", 11, "broken")  # late: older than 14, skipped though it differs
            yield s("s-1", 12.5, None)  # late too, with no status: counted late all the same
            yield s("s-1", 20, None)  # no status: touches nothing
            yield s("s-1", 20, "ok")  # the same as the last on-time one: nothing
        if m == 30:
            yield s("s-1", 30, "maint")  # an exact duplicate: the same value, nothing
        if m in (0, 4):
            yield s("s-2", m, "ok" if m == 0 else "maint")  # a change at 4
        if m == 80:
            yield s("s-2", 3, "ok")  # late (older than 4), and it differs: skipped
            yield s("s-2", 6, "ok")  # on time, its clock at 80: a change that resolves at once
        if m == 0:
            yield s("s-5", 0, "ok")
        if m == 100:  # on time for s-5, but the clock is at 100: fires and resolves at once
            yield s("s-5", 50, "maint")
        if m in (0, 10, 20, 40):  # hot readings only (where): status changes at 20 (cold 10 ignored)
            temp = 20.0 if m == 10 else 60.0
            yield s("h-1", m + 0.5, "ok" if m < 20 else "maint", temp, kind="gadget" if m == 40 else "pacer")
        if m in (0, 6, 8, 50):  # status per client (an integer): 200 -> 500 at 6, -> 200 at 8, same at 50
            yield log("10.0.0.4", m + 0.5, 500 if m == 6 else 200)
    yield s("s-1", 120.5, "maint")  # a change at the end: still firing when the input ends
