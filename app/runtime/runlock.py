"""One ``python -m app run`` per data dir, and none beside the roles of one that died.

The supervisor locks ``<data dir>/run.lock`` (``flock``) before it touches anything there
(``--fresh`` wipes it), writes its pid in it, and passes the locked descriptor to every
role it starts (``pass_fds``): a lock belongs to the open file, so it stays held while the
supervisor *or any of its roles* lives. Each role also gets SIGTERM when the supervisor dies
(:func:`app.runtime.procs.dies_with_parent`).

Before, a supervisor killed with ``kill -9``, or by the hang-up of a terminal closed under
it, left every role running in its own session: the next ``make run`` started a second
worker, Spark query and archive on the same checkpoints beside them, and its dispatcher
crash-looped on the one the dead run had left holding ``dispatch.sqlite3``. Now the next run:

- refuses at once, naming the pid, while another run's supervisor holds the lock;
- waits while only the roles of a dead one hold it: each got SIGTERM as it died, and stops;
- kills those still there after :data:`ORPHANS_WAIT_S` (with their process groups: a Spark
  role's JVM), as the dead supervisor's own stop would have (a role whose broker died with
  the supervisor can wait on it forever), and starts;
- refuses, naming each, if any is still there (another user's, which it cannot kill).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import threading
import time
from pathlib import Path

from app.errors import ConfigError
from app.runtime.supervisor import STOP_BUDGET_S

logger = logging.getLogger(__name__)

LOCK_FILE = "run.lock"
#: how long a new run waits for the roles of a dead run to stop before it kills them: the
#: budget of the supervisor's own stop
ORPHANS_WAIT_S = STOP_BUDGET_S
#: how long the killed ones may take to be gone
_KILLED_WAIT_S = 5.0
_POLL_S = 0.2


def hold(data_dir: Path, stop: threading.Event | None = None, wait_s: float = ORPHANS_WAIT_S) -> int:
    """Lock ``data_dir`` for this run: the descriptor to keep open for the whole run, and to
    pass to every role (it is close-on-exec otherwise). Raises ConfigError, naming who holds
    it, when another run does, or the roles of a dead one still do after ``wait_s`` (or once
    ``stop`` is set)."""
    path = data_dir / LOCK_FILE
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        msg = f"cannot lock the data dir {data_dir} for this run ({path}): {exc.strerror}"
        raise ConfigError(msg) from None
    try:
        _wait_for(fd, path, stop, wait_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _wait_for(fd: int, path: Path, stop: threading.Event | None, wait_s: float) -> None:
    deadline: float | None = None
    killed = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        owner = _recorded_pid(fd)
        holders = holders_of(path) - {os.getpid()}  # we have it open too, to lock it
        if owner is not None and owner in holders:
            msg = (
                f"another `python -m app run` (pid {owner}) is running on {path.parent}: stop it "
                f"first (Ctrl-C in its terminal, or kill {owner}), or give this one another "
                "APP_DATA_DIR"
            )
            raise ConfigError(msg)
        now = time.monotonic()
        if deadline is None:
            deadline = now + wait_s
            logger.warning(
                "the roles of an earlier run on %s are still stopping (its supervisor%s is gone): "
                "waiting up to %.0f s for them",
                path.parent, f", pid {owner}," if owner else "", wait_s,
            )  # fmt: skip
        if stop is not None and stop.is_set():
            msg = f"stopped while waiting for the roles of an earlier run to release {path}"
            raise ConfigError(msg)
        if now >= deadline and not killed:
            for pid in sorted(holders):
                logger.warning("killing pid %d of the earlier run, still running: %s", pid, _command(pid))
                _kill(pid)
            killed, deadline = True, now + _KILLED_WAIT_S
        elif now >= deadline:
            who = ", ".join(f"{pid} ({_command(pid)})" for pid in sorted(holders)) or "processes not listed"
            msg = f"processes of an earlier run still hold {path}: {who}; stop them and run again"
            raise ConfigError(msg)
        time.sleep(_POLL_S)


def _kill(pid: int) -> None:
    """SIGKILL a role with its process group (a role leads its own: a Spark role's JVM is in
    it), or the process alone when it leads none."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except OSError as exc:  # gone already, or not ours to kill: the next look says which
        logger.warning("cannot kill pid %d: %s", pid, exc)


def _recorded_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def holders_of(path: Path) -> set[int]:
    """The pids with ``path`` open, from ``/proc`` (Linux; empty elsewhere, and for the
    processes of other users)."""
    target = os.path.realpath(path)
    found: set[int] = set()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{name}") == target:
                    found.add(pid)
                    break
            except OSError:
                continue
    return found


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(raw.decode(errors="replace").split("\0")).strip()[:100]
