"""Fixtures for the ingest adapters: a real mosquitto broker and async helpers.

mosquitto is the Debian binary (``make test`` installs it when missing); each
test gets its own process on a free loopback port, with a generated config,
killed at the end. Nothing here mocks MQTT, Kafka or sockets.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from app.kafka.broker import free_port
from app.kafka.clients import end_offsets

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"

T = TypeVar("T")


class Mosquitto:
    """A mosquitto process on 127.0.0.1:``port``; restartable on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.host = "127.0.0.1"
        self._conf = workdir / "mosquitto.conf"
        self._log = workdir / "mosquitto.log"
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true", "persistence false"]
        self._conf.write_text("\n".join(lines) + "\n")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        with open(self._log, "ab") as log:
            self._proc = subprocess.Popen(
                [MOSQUITTO, "-c", str(self._conf)], stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._proc.poll() is None, self._log.read_text()
            with socket.socket() as s:
                if s.connect_ex((self.host, self.port)) == 0:
                    return
            time.sleep(0.02)
        raise AssertionError(f"mosquitto did not listen on {self.port} within {timeout_s} s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    if not os.access(MOSQUITTO, os.X_OK):
        pytest.skip(f"mosquitto not installed at {MOSQUITTO} (`make test` installs it)")
    broker = Mosquitto(tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 50 ms; fail the test with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def topic_count(bootstrap: str, topic: str) -> int:
    return (await end_offsets(bootstrap, [topic]))[topic]


async def until_count(bootstrap: str, topic: str, n: int, timeout_s: float = 15.0) -> None:
    """Wait until ``topic`` holds at least ``n`` records."""

    async def enough() -> bool:
        return await topic_count(bootstrap, topic) >= n

    await wait_for(enough, timeout_s, f"{n} records on {topic}")


async def stop_task(stop: asyncio.Event, task: asyncio.Task[T], timeout_s: float = 30.0) -> T:
    """Set ``stop`` and return the task's result, bounded in time."""
    stop.set()
    return await asyncio.wait_for(task, timeout_s)


def udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
