"""A Kafka client's failures, raised again as the :class:`~app.errors.BrokerError` callers handle."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from aiokafka.errors import KafkaError

from app.errors import BrokerError

logger = logging.getLogger(__name__)

#: what a Kafka client raises when the cluster cannot be reached or used: a timeout,
#: a protocol or broker error, or a socket error
CLIENT_ERRORS: tuple[type[Exception], ...] = (TimeoutError, KafkaError, OSError)


@contextmanager
def broker_errors(doing: str) -> Iterator[None]:
    """Run the block; one of :data:`CLIENT_ERRORS` raised in it becomes
    ``BrokerError("cannot <doing>: <the error's repr>")`` (chained to it). Anything else,
    a BrokerError included, passes unchanged."""
    try:
        yield
    except CLIENT_ERRORS as exc:
        msg = f"cannot {doing}: {exc!r}"
        raise BrokerError(msg) from exc
