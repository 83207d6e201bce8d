"""Waiting on a child process until a deadline, or no longer once an event is set (a second
Ctrl-C): what the supervisor's staged stop and the embedded broker's stop both do."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time

POLL_S = 0.05  # how soon a set event ends a wait


def exited_by(proc: subprocess.Popen[bytes], deadline: float, force: threading.Event | None = None) -> bool:
    """Whether ``proc`` exited by ``deadline`` (``time.monotonic()``); once ``force`` is set,
    whether it has exited now."""
    while proc.poll() is None:
        left = deadline - time.monotonic()
        if left <= 0 or (force is not None and force.is_set()):
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(min(left, POLL_S))
    return True
