"""Child processes of the supervisor and of the embedded broker's owner: waiting on one until
a deadline, or no longer once an event is set (a second Ctrl-C), as their staged stops do;
and a child that dies with its parent."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

POLL_S = 0.05  # how soon a set event ends a wait

_PR_SET_PDEATHSIG = 1
try:  # resolved here, not in the forked child: it only calls it
    import ctypes

    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: the owner's stop is the only cleanup
    _prctl = None


def _die_with(parent: int, nice: int = 0) -> None:
    if nice:
        os.nice(nice)
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the line above: nothing will tell us
        os.kill(os.getpid(), signal.SIGTERM)


def dies_with_parent(nice: int = 0) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when the thread that
    started it ends (on Linux; ``PR_SET_PDEATHSIG``), however it ends, ``kill -9`` included;
    it runs at niceness ``nice`` (``os.nice``: its own children inherit it).
    Without it a child started in a session of its own (``start_new_session``) outlives its
    owner and goes on beside the next one. Start children from the thread that owns them for
    their whole life: the main thread, for the supervisor and the embedded broker."""
    return functools.partial(_die_with, os.getpid(), nice)


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
