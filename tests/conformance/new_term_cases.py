"""The crafted input of the native new-term conformance suite (``test_native_new_terms``): log
lines that stress each way a new term fires, extends its alert and resolves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conformance.threshold_cases import at

RULES = Path(__file__).with_name("new_terms.yaml")


def t(minute: float) -> str:
    return at(2000 + minute)


def crafted() -> Iterator[dict[str, Any]]:
    """In arrival order; every case is commented with what it tests."""

    def log(host: str, minute: float, agent: str | None = "A", **extra: Any) -> dict[str, Any]:
        line = {"host": host, "ts": t(minute), "client_ip": "10.0.0.1", "method": "GET", "path": "/",
                "status": 200, **extra}  # fmt: skip
        return line if agent is None else {**line, "user_agent": agent}

    for m in range(0, 301, 2):
        yield log("www-2", m, "pacer")  # moves every partition's clock (1 partition: the test's)
        if m < 60:
            yield log("www-1", m, "A" if m % 4 else "B")  # the learning hour: nothing fires
        if m == 70:
            yield log("www-1", m, "C")  # new: fires
        if m == 72:
            yield log("www-1", m, "D")  # new while firing: extends it to 77
            yield log("www-1", m, None)  # no term: creates nothing, moves nothing
        if m == 74:
            yield log("www-1", m, "A")  # seen at 58, within the hour: not new
        if m == 150:
            yield log("www-1", 65, "E")  # new but late by more than resolve_after: fires and resolves at once
        if m == 200:
            yield log("www-1", m, "A")  # not seen for more than the hour: new again
        if m == 298:
            yield log("www-1", m, "F")  # new at the end: still firing when the input ends
        if m in (0, 10, 40, 42, 100, 102, 140):  # errors only (where): DELETE at 100, GET at 140 new
            method = "DELETE" if m in (100, 102) else "GET"
            yield log("www-1", m + 0.5, None, status=404, method=method, client_ip="10.0.0.2")
        if m in (0, 30, 32, 60):  # status per client: learning to 20, then 500 new at 30 and at 60
            yield log("www-3", m + 0.5, "Z", client_ip="10.0.0.9", status=500 if m else 200)
        if m in (90, 94):  # new paths across every host: b extends a's alert, c fires anew
            yield log("www-3", m + 0.5, "Z", path=f"/new-{m}")
            if m == 90:
                yield log("www-3", m + 1.5, "Z", path="/new-b")
        for i in range(10 * m, min(10 * m + 20, 1100)):  # 1,100 distinct request ids: pruned at 1,000
            yield log("busy", i * 0.1, "Q", request_id=f"r-{i}")
            if i == 1050:  # out of order, seen at 12 (not new) unless pruned (new: a trigger more)
                yield log("busy", 15.0, "Q", request_id="r-120")
