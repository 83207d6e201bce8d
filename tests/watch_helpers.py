"""What the tests of `backtest --watch` share (tests/cli, tests/spark): a rule file's text,
its input, the watched command as a child process, and a bounded wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from app.runtime.settings import PROJECT_ROOT
from tests.conftest import child_env

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


def terminal() -> None:
    """In the child, before it runs: Ctrl-C's default, as in a terminal. A shell without job
    control starts a background command with SIGINT ignored (POSIX), a process inherits that,
    and Python then leaves it ignored: so it is under ``(make test &)`` from a script."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def backtest_process(args: list[str], err: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m app backtest ARGS`` started, its stderr into ``err``, as a terminal starts
    it (:func:`terminal`); killed at the exit if it still runs."""
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "backtest", *args],
            cwd=PROJECT_ROOT,
            env=child_env(),
            stderr=stderr,
            preexec_fn=terminal,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
