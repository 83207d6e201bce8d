"""Bounded subprocess helpers for tests: every process is stopped, never leaked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from app.runtime.settings import PROJECT_ROOT

T = TypeVar("T")


@contextmanager
def role(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m <args>`` in its own process group; SIGTERM it (then SIGKILL) on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield proc
    except BaseException:
        stop(proc)
        print_tail(log)  # pytest shows it with the failure: what the role was doing
        raise
    finally:
        stop(proc)


def run_script(code: str, *args: str, env: dict[str, str], timeout_s: float = 120) -> tuple[int, str, str]:
    """Run ``python -c code args`` from the project root in its own process group, to its end
    or ``timeout_s``; kill whatever of the group is left. The exit code, stdout and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = (b.decode(errors="replace") for b in proc.communicate(timeout=timeout_s))
    finally:
        _killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err


def print_tail(log: Path, lines: int = 60) -> None:
    """Print the last ``lines`` lines of a role's log, under its name."""
    text = log.read_text(errors="replace").splitlines() if log.exists() else ["(no log)"]
    print(f"----- last {lines} lines of {log.name} -----", *text[-lines:], sep="\n")


def stop(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> int:
    """Stop a process group started with start_new_session; return the exit code."""
    if proc.poll() is None:
        _killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    _killpg(proc.pid, signal.SIGKILL)  # stragglers in the group
    return proc.returncode


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_for(probe: Callable[[], T | None], timeout_s: float, interval_s: float = 0.25, what: str = "") -> T:
    """Poll ``probe`` until it returns a truthy value; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what or probe}; last value {last!r}")


def processes_with_env(marker: str) -> list[int]:
    """PIDs of live processes whose environment contains ``marker`` (e.g. a unique data dir)."""
    needle = marker.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                stat = (entry / "stat").read_text()
                if ") Z " not in stat:  # zombies hold no resources and are reaped by their parent
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def http_text(url: str, timeout_s: float = 2.0) -> str | None:
    """The body at ``url`` (a role's stats or metrics), or None while nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``url`` answers 200 (a role's health or metrics endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def gone(marker: str, timeout_s: float = 5.0) -> list[int]:
    """The processes still running with ``marker`` in their environment once ``timeout_s`` has
    passed (Spark's Python workers, which the signal reached too, may take a moment to exit)."""
    deadline = time.monotonic() + timeout_s
    while (left := processes_with_env(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
