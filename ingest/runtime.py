"""Run one ingest adapter as a process: settings, signals, metrics, one summary line.

:func:`run_adapter` is the shared ``main`` of every command that publishes:
it reads :class:`~app.runtime.settings.Settings` from the environment, serves
``/metrics`` on ``APP_METRICS_PORT`` when non-zero, and runs
``body(settings, stop)`` in an event loop. The first SIGTERM or SIGINT sets
``stop`` (also one that arrives during start-up); the adapter then stops
accepting input, flushes and returns its summary. A second signal is left to
the default handler, so a stuck adapter can still be killed. The summary is
printed to stdout as one JSON line; the exit code is 0, or 1 when some records
were never acknowledged by the broker.

Before ``body`` runs, the adapter waits until Kafka answers
(:func:`app.kafka.wait.wait_for_broker`: one warning, then quiet retries). A stop
signal during that wait ends the adapter with :class:`NotStarted` (nothing read,
nothing published, exit code 0).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson

from app.errors import ConfigError
from app.kafka.wait import quiet_client_logs, wait_for_broker
from app.runtime.metrics import serve
from app.runtime.role import STOP_SIGNALS, stop_on_signals
from app.runtime.settings import Settings, setup_logging
from ingest.publisher import NO_BOOTSTRAP, Publisher

logger = logging.getLogger(__name__)


T = TypeVar("T")


class Summary(Protocol):
    """What an adapter returns: counts, serialisable as the final stdout line."""

    @property
    def failed(self) -> int: ...

    def to_json(self) -> bytes: ...


@dataclass(frozen=True)
class AdapterSummary:
    """Acknowledged counts of one adapter run: ``published`` on ``topic``,
    ``dlq`` on dlq.events, ``failed`` never acknowledged, plus adapter-specific
    ``extra`` counters (lines read, requests served, ...)."""

    adapter: str
    topic: str
    published: int
    dlq: int
    failed: int
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, pub: Publisher, **extra: Any) -> AdapterSummary:
        return cls(pub.adapter, pub.topic, pub.produced, pub.dead_lettered, pub.failed, extra)

    def to_json(self) -> bytes:
        head = {"adapter": self.adapter, "topic": self.topic, "published": self.published}
        return orjson.dumps({**head, "dlq": self.dlq, "failed": self.failed, **self.extra})


@dataclass(frozen=True)
class NotStarted:
    """The summary of an adapter stopped while it waited for Kafka: it read and published nothing."""

    failed: int = 0

    def to_json(self) -> bytes:
        return orjson.dumps({"published": 0, "dlq": 0, "failed": 0, "started": False})


Body = Callable[[Settings, asyncio.Event], Awaitable[Summary]]


def process_settings(*, kafka: bool = True) -> Settings:
    """An adapter process's settings from the environment, with its logging set up and its
    ``/metrics`` served. With ``kafka``, a ConfigError when no Kafka is configured (the fleet
    simulator over MQTT publishes to mosquitto, not to Kafka)."""
    settings = Settings.from_env()
    setup_logging(settings.log_level)
    if kafka and not settings.bootstrap_servers:
        raise ConfigError(NO_BOOTSTRAP)
    serve(settings.metrics_port)
    return settings


def run_adapter(body: Body) -> int:
    """Run ``body`` until it returns (by itself, or after a stop signal); print
    its summary; return the exit code. ConfigError when no Kafka is configured."""
    early: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    settings = process_settings()
    quiet_client_logs()
    summary = asyncio.run(_until_signal(body, settings, early))
    sys.stdout.buffer.write(summary.to_json() + b"\n")
    sys.stdout.flush()
    return 1 if summary.failed else 0


async def _until_signal(body: Body, settings: Settings, early: list[int]) -> Summary:
    stop = asyncio.Event()
    stop_on_signals(stop, "stopping: flushing what was accepted")
    if early:
        stop.set()
    try:
        work = body(settings, stop)  # checks in a body's synchronous part come before the wait
        if not await wait_for_broker(settings, stop):
            if isinstance(work, Coroutine):
                work.close()
            return NotStarted()
        return await work
    finally:
        for sig in STOP_SIGNALS:
            asyncio.get_running_loop().remove_signal_handler(sig)


async def take_batch(queue: asyncio.Queue[T], stop: asyncio.Event, limit: int = 1000) -> list[T]:
    """Wait until ``queue`` has items or ``stop`` is set; return up to ``limit``
    items at once (empty only when stopped), so a busy consumer does not pay
    for a wait per item."""
    items: list[T] = []
    if queue.empty():
        getter = asyncio.ensure_future(queue.get())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not getter.done():
            getter.cancel()
            return items
        items.append(getter.result())
    while len(items) < limit and not queue.empty():
        items.append(queue.get_nowait())
    return items


async def stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    """Wait up to ``seconds``; True as soon as ``stop`` is set."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True
