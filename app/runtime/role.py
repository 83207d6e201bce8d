"""Run one async role as a process: signals set a stop event, metrics are served.

Every long-running role (delivery, receiver, store sync) has the signature
``async def run(settings, stop, **options) -> None`` and returns once ``stop``
is set and it has shut down cleanly. SIGINT and SIGTERM set ``stop``; a
second signal is left to the default handler so a stuck role can still die.

A role that uses Kafka (``kafka=True``, the default) starts once the cluster answers
(:func:`app.kafka.wait.wait_for_broker`: one warning, then quiet retries); a stop
signal during that wait exits 0 without running the role.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from app.kafka.wait import quiet_client_logs, wait_for_broker
from app.runtime import metrics
from app.runtime.settings import Settings

logger = logging.getLogger(__name__)

RoleFn = Callable[..., Awaitable[None]]
#: the signals that ask a role or an adapter to stop cleanly
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_on_signals(stop: asyncio.Event, stopping: str = "stopping") -> None:
    """In the running loop: the first SIGINT or SIGTERM sets ``stop``, logged as ``received
    <signal>, <stopping>``; a second one of the same is left to the default handler, so a
    stuck process can still die."""
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        logger.info("received %s, %s", sig.name, stopping)
        stop.set()
        loop.remove_signal_handler(sig)

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)


def run_role(fn: RoleFn, settings: Settings, *, kafka: bool = True, **options: Any) -> int:
    """Run ``fn(settings, stop, **options)`` until a signal; return an exit code. With
    ``kafka``, first wait until ``settings.bootstrap_servers`` answers."""

    async def main() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        metrics.serve(settings.metrics_port)
        if kafka:
            quiet_client_logs()
            if not await wait_for_broker(settings, stop):
                return
        await fn(settings, stop, **options)

    asyncio.run(main())
    return 0
