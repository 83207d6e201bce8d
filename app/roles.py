"""Run one async role as a process: signals set a stop event, metrics are served.

Every long-running role (delivery, receiver, store sync) has the signature
``async def run(settings, stop, **options) -> None`` and returns once ``stop``
is set and it has shut down cleanly. SIGINT and SIGTERM set ``stop``; a
second signal is left to the default handler so a stuck role can still die.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from app import metrics
from app.config import Settings

logger = logging.getLogger(__name__)

RoleFn = Callable[..., Awaitable[None]]


def run_role(fn: RoleFn, settings: Settings, **options: Any) -> int:
    """Run ``fn(settings, stop, **options)`` until a signal; return an exit code."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            logger.info("received %s, stopping", sig.name)
            stop.set()
            loop.remove_signal_handler(sig)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        metrics.serve(settings.metrics_port)
        await fn(settings, stop, **options)

    asyncio.run(main())
    return 0
