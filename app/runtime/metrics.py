"""Prometheus metrics plumbing shared by every role.

Each role defines its own counters next to its code (module-level, created
once per process) and calls :func:`serve` once with ``Settings.metrics_port``.
"""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

logger = logging.getLogger(__name__)

_started: set[int] = set()


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Expose /metrics on ``addr:port`` (0 disables). Safe to call twice."""
    if port <= 0 or port in _started:
        return
    start_http_server(port, addr=addr)
    _started.add(port)
    logger.info("metrics on http://%s:%d/metrics", addr, port)
