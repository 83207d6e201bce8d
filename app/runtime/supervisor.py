"""A small process supervisor: start roles, restart crashed ones, stop them in order.

:mod:`app.runtime.system` decides which roles make up the product; this module only
runs processes:
- start every role as a child process in its own process group, that gets SIGTERM when
  the supervisor dies, however it dies (``kill -9`` included), and holds the run's lock
  (:mod:`app.runtime.runlock`) while it lives;
- restart a child that exits non-zero, after 1, 2, 4, 8 then 16 s; a child that
  crashed more than ``MAX_RESTARTS`` times in a row, each within ``RESTART_WINDOW_S`` of
  its start, is crash-looping: tried again every ``CRASH_LOOP_S``, never given up on (the
  broker it waited for, a file it needs, a host less loaded may be back by then). A run
  of ``RESTART_WINDOW_S`` or more starts the count again; a one-shot child (a replay)
  that exits 0 is done;
- on stop, SIGTERM the roles stage by stage (producers first) and SIGKILL
  whatever outlives its grace period, including grandchildren in its group;
  the whole stop has a budget (``STOP_BUDGET_S``), and a second Ctrl-C or
  SIGTERM during it kills what is left at once.

The supervisor never touches a role's internals; roles are plain commands
that also run alone against an external Kafka.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson

from app.runtime.procs import dies_with_parent, exited_by
from app.runtime.settings import Settings

logger = logging.getLogger(__name__)


def stop_on_signals(what: str, force: threading.Event | None = None) -> threading.Event:
    """An event that SIGINT, SIGTERM or SIGHUP sets (logging "received SIG..., stopping ``what``").
    With ``force``, a second signal sets that event too: the operator wants out now."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if force is not None and stop.is_set():
            if not force.is_set():
                logger.warning("received %s again: killing %s now", name, what)
            force.set()
            return
        logger.info("received %s, stopping %s", name, what)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # under nohup it stays ignored
        signal.signal(signal.SIGHUP, on_signal)  # the terminal closed: stop as for Ctrl-C
    return stop


MAX_RESTARTS = 5
#: the wait between two tries of a crash-looping role
CRASH_LOOP_S = 60.0
#: output lines of each child kept in memory, to say why it exited
TAIL_LINES = 20
#: the longest reason a crash is told with
ERROR_CHARS = 300
#: how long :meth:`Supervisor.poll` waits for a crashed child's last output to be read
READ_TAIL_S = 1.0
RESTART_WINDOW_S = 60.0
STOP_GRACE_S = 6.0  # per stage
#: the whole stop: a stage gets its grace, or what is left of this (a role ignoring SIGTERM
#: in every stage cannot make a stop take 4 x 6 s)
STOP_BUDGET_S = 15.0


@dataclass
class Role:
    """A child process the supervisor owns."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    one_shot: bool = False  # exits 0 when its work is done (replays)
    requires_file: Path | None = None  # not started before this file exists (written by another role)
    #: not started before this many seconds after the supervisor's start: a role whose work can
    #: wait leaves the cores to the others' start (the archive's JVM, ``app.runtime.system``)
    delay_s: float = 0.0
    stage: int = 1  # stop order: lower stages stop first
    url: str | None = None
    metrics: bool = True  # serves /metrics on APP_METRICS_PORT (mosquitto and the dashboard do not)
    #: on SIGTERM the role stops its own children (a Spark JVM) in order: the signal goes to
    #: its process alone, not to its group, so no child is stopped under it; a group still
    #: running at the end of the grace is killed whole, as any other
    stops_children: bool = False
    nice: int = 0  # its CPU niceness (os.nice), inherited by its children
    proc: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)  # its crashes in the last RESTART_WINDOW_S
    streak: int = 0  # crashes in a row, each within RESTART_WINDOW_S of its start
    started_at: float = 0.0
    next_start: float = 0.0
    retry_at: float | None = None  # next_start as a Unix time, for the console
    done: bool = False
    exit_code: int | None = None
    #: the last line the role printed before it last exited non-zero (a traceback's last
    #: line names the error): in the supervisor's warning and in the console's health
    last_error: str | None = None
    #: the last lines of the running child's output, kept by the thread that copies them
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None


def _pump(stream: IO[bytes], prefix: str, log_file: IO[bytes], tail: deque[str]) -> None:
    """Copy a child's output to our stdout with a role prefix, to its log file and to ``tail``."""
    for line in iter(stream.readline, b""):
        log_file.write(line)
        log_file.flush()
        text = line.decode("utf-8", "replace")
        tail.append(text)
        sys.stdout.write(f"[{prefix}] {text}")
        sys.stdout.flush()
    stream.close()
    log_file.close()


def last_error(tail: Sequence[str]) -> str | None:
    """What a crashed role said last: its last non-blank line, stripped and cut to
    :data:`ERROR_CHARS` (a Python traceback ends with the exception and its message)."""
    for line in reversed(tail):
        if line.strip():
            text = line.strip()
            return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"
    return None


class Supervisor:
    """Owns the broker and the role processes. Not thread-safe; drive it from one thread."""

    def __init__(
        self, settings: Settings, roles: list[Role], log_dir: Path, quiet: bool = False,
        state_file: Path | None = None, hold_fds: tuple[int, ...] = (),
    ) -> None:  # fmt: skip
        self.settings = settings
        #: descriptors every role inherits: the run's lock (app.runtime.runlock), held while any lives
        self.hold_fds = hold_fds
        self.roles = roles
        self.log_dir = log_dir
        self.quiet = quiet
        self._stopping = False
        #: where :meth:`poll` keeps each role's process state for the console (None: nowhere)
        self.state_file = state_file
        self._written: list[dict[str, object]] | None = None

    def states(self) -> list[dict[str, object]]:
        """Each role's process state: ``running``, ``waiting`` (for a file another role writes, or
        for its ``delay_s``),
        ``restarting`` (after a crash, backing off), ``crash-looping`` (crashed more than
        ``MAX_RESTARTS`` times in a row: tried again every ``CRASH_LOOP_S``), ``done`` (a
        one-shot role finished) or ``stopped``; with its pid, exit code, crashes (in a row
        while it crashes, else in the last ``RESTART_WINDOW_S``), what it said last before
        its last crash, and when it is tried again (``retry_at``: a Unix time, while it waits)."""
        out: list[dict[str, object]] = []
        for r in self.roles:
            waits = not r.done and not self._stopping and r.proc is None
            if r.done:
                state = "done"
            elif self._stopping:
                state = "stopped"
            elif r.proc is not None:
                state = "running"
            elif r.streak > MAX_RESTARTS:
                state = "crash-looping"
            else:
                state = "restarting" if r.restarts else "waiting"
            out.append({
                "name": r.name, "state": state, "pid": r.proc.pid if r.proc is not None else None,
                "exit_code": r.exit_code, "crashes": r.streak if waits and r.streak else len(r.restarts),
                "last_error": r.last_error, "retry_at": r.retry_at if waits and r.streak else None,
            })  # fmt: skip
        return out

    def write_states(self) -> None:
        """Write :meth:`states` to ``state_file`` when they changed (atomically)."""
        if self.state_file is None:
            return
        states = self.states()
        if states == self._written:
            return
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        try:
            tmp.write_bytes(orjson.dumps({"roles": states}))
            tmp.replace(self.state_file)
        except OSError as exc:  # the console's view only: never the supervisor's end
            logger.warning("cannot write %s: %r", self.state_file, exc)
            return
        self._written = states

    def _spawn(self, role: Role) -> None:
        env = dict(os.environ)
        env.update(role.env)
        env["PYTHONUNBUFFERED"] = "1"
        log_file = (self.log_dir / f"{role.name}.log").open("ab")
        role.proc = subprocess.Popen(  # noqa: S603 - argv built by us, no shell
            role.argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor alone
            preexec_fn=dies_with_parent(role.nice),  # ... and its death, however it comes, every role
            pass_fds=self.hold_fds,
        )
        assert role.proc.stdout is not None  # noqa: S101 - PIPE was requested
        role.tail = deque(maxlen=TAIL_LINES)
        if self.quiet:
            reader = threading.Thread(
                target=_drain, args=(role.proc.stdout, log_file, role.tail), daemon=True
            )
        else:
            args = (role.proc.stdout, role.name, log_file, role.tail)
            reader = threading.Thread(target=_pump, args=args, daemon=True)
        reader.start()
        role.reader = reader
        role.started_at = time.monotonic()
        logger.info("started %s (pid %d)", role.name, role.proc.pid)

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        now = time.monotonic()
        for role in self.roles:
            if role.delay_s > 0:
                role.next_start = now + role.delay_s  # started by poll(), "waiting" until then
            elif role.requires_file is None or role.requires_file.exists():
                self._spawn(role)
        self.write_states()

    def poll(self) -> None:
        """Reap exited children and restart the ones that failed; write the states."""
        try:
            self._poll()
        finally:
            self.write_states()

    def _poll(self) -> None:
        now = time.monotonic()
        for role in self.roles:
            if role.done or self._stopping:
                continue
            if role.proc is None:
                ready = role.requires_file is None or role.requires_file.exists()
                if now >= role.next_start and ready:
                    self._spawn(role)
                continue
            code = role.proc.poll()
            if code is None:
                continue
            role.exit_code = code
            role.proc = None
            if code == 0 and role.one_shot:
                logger.info("%s finished", role.name)
                role.done = True
                continue
            if role.reader is not None:  # its last lines may still be in the pipe
                role.reader.join(READ_TAIL_S)
            role.last_error = last_error(role.tail)
            said = f" ({role.last_error})" if role.last_error else ""
            role.restarts = [t for t in role.restarts if now - t < RESTART_WINDOW_S]
            role.restarts.append(now)
            role.streak = role.streak + 1 if now - role.started_at < RESTART_WINDOW_S else 1
            if role.streak > MAX_RESTARTS:
                delay = CRASH_LOOP_S
                log = logger.error if role.streak == MAX_RESTARTS + 1 else logger.warning
                log(
                    "%s exited with %d%s: %d crashes in a row, each within %.0f s of its start; "
                    "trying again every %.0f s", role.name, code, said, role.streak, RESTART_WINDOW_S, delay,
                )  # fmt: skip
            else:
                delay = float(2 ** (role.streak - 1))
                logger.warning("%s exited with %d%s; restarting in %.0fs", role.name, code, said, delay)
            role.next_start = now + delay
            role.retry_at = time.time() + delay

    def stop_stage(
        self, stage: int, grace_s: float = STOP_GRACE_S, force: threading.Event | None = None
    ) -> None:
        """SIGTERM every live child of ``stage``, wait up to ``grace_s``, then SIGKILL the
        rest; at once when ``force`` is (or gets) set."""
        procs = [r for r in self.roles if r.stage == stage and r.proc is not None]
        started = time.monotonic()
        for r in procs:
            _signal_group(r.proc, signal.SIGTERM, group=not r.stops_children)
        deadline = started + grace_s
        for r in procs:
            assert r.proc is not None  # noqa: S101
            if not exited_by(r.proc, deadline, force):
                if force is not None and force.is_set():
                    logger.warning("killing %s (a second signal)", r.name)
                else:
                    logger.warning("%s did not stop within %.1fs; killing it", r.name, grace_s)
                _signal_group(r.proc, signal.SIGKILL)
                r.proc.wait(5)
            r.exit_code = r.proc.returncode
            # the group may still hold grandchildren (a JVM, a browser): none may survive
            _signal_group(r.proc, signal.SIGKILL)
            r.proc = None
        if procs:  # where a slow stop spends its time, for whoever reads the log
            names = ", ".join(r.name for r in procs)
            logger.info("stopped stage %d (%s) in %.1f s", stage, names, time.monotonic() - started)

    def stop(
        self, between_stages: Callable[[int], None] | None = None, force: threading.Event | None = None,
        budget_s: float = STOP_BUDGET_S,
    ) -> None:  # fmt: skip
        """Stop every role, stage by stage, within ``budget_s`` in all: each stage gets
        ``STOP_GRACE_S`` or what is left of the budget (at least a moment to flush);
        ``force`` set: kill without waiting."""
        self._stopping = True
        ends = time.monotonic() + budget_s
        for stage in sorted({r.stage for r in self.roles}):
            self.stop_stage(stage, min(STOP_GRACE_S, max(0.5, ends - time.monotonic())), force)
            if between_stages:
                between_stages(stage)
        self.write_states()


def _drain(stream: IO[bytes], log_file: IO[bytes], tail: deque[str]) -> None:
    """Copy a child's output to its log file and ``tail`` only (``--quiet``), a line at a time."""
    for line in iter(stream.readline, b""):
        log_file.write(line)
        log_file.flush()
        tail.append(line.decode("utf-8", "replace"))
    stream.close()
    log_file.close()


def _signal_group(proc: subprocess.Popen[bytes] | None, sig: signal.Signals, *, group: bool = True) -> None:
    """Signal a child's whole process group (its pgid is its pid: start_new_session), or
    with ``group`` False its own process only."""
    if proc is None:
        return
    try:
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
