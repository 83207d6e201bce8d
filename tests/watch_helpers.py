"""What the tests of `backtest --watch` share (tests/cli, tests/spark): a rule file's text,
its input and a bounded wait."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import orjson

RULE = (
    "rules:\n  - id: too-hot\n    source: sensors\n"
    "    where: temperature > {limit}\n    group_by: [device_id]\n"
)


def readings() -> bytes:
    """One device, 25, 27, 29, 31, 33 °C over and over: above 30 twice in each five."""
    return b"".join(
        orjson.dumps({"device_id": "d1", "ts": f"2024-01-01T00:{i:02d}:00Z", "temperature": 25 + (i % 5) * 2})
        + b"\n"
        for i in range(20)
    )


def save(path: Path, text: str) -> None:
    """Write ``path`` as an editor saves it: whole, at once. A plain write truncates first, so a
    check between the two sees an empty file: one more rejection than the test means."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)


def wait_for(what: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
