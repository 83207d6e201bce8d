"""Shared vocabulary of the dispatcher: the clock, the Muter protocol, and change-tracking tables.

Every piece of dispatcher state lives in a :class:`Table`: a dict of values
that can be dumped to JSON and that remembers which keys changed since the
last :meth:`Table.drain`. The role writes the drained changes to SQLite in
the same transaction as the consumed offsets and the outbox rows, so state,
input position and output never disagree after a crash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

import orjson

from app.alerts import Alert

logger = logging.getLogger(__name__)

#: Seconds since the epoch (wall clock, or a fake in tests).
Clock = Callable[[], float]
V = TypeVar("V")


def wall_clock() -> float:
    return time.time()


def iso(ts: float) -> str:
    """Epoch seconds -> RFC 3339 UTC with milliseconds and ``Z``."""
    dt = datetime.fromtimestamp(ts, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse_iso(text: str) -> float:
    """RFC 3339 -> epoch seconds; a time without offset is UTC. ValueError otherwise."""
    dt = datetime.fromisoformat(text.strip())
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


class Muter(Protocol):
    """Something that can keep an alert out of notifications (silences, inhibition, acks, flapping)."""

    def mutes(self, alert: Alert, now: float) -> bool: ...


class Table(Generic[V]):
    """A change-tracking dict. Not thread-safe; one event loop owns it."""

    def __init__(self, name: str, dump: Callable[[V], Any], load: Callable[[Any], V]) -> None:
        self.name = name
        self._dump = dump
        self._load = load
        self._items: dict[str, V] = {}
        self._dirty: set[str] = set()

    def get(self, key: str) -> V | None:
        return self._items.get(key)

    def put(self, key: str, value: V) -> None:
        self._items[key] = value
        self._dirty.add(key)

    def delete(self, key: str) -> None:
        if self._items.pop(key, None) is not None:
            self._dirty.add(key)

    def touch(self, key: str) -> None:
        """Mark ``key`` changed after mutating its value in place."""
        if key in self._items:
            self._dirty.add(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._items))

    def items(self) -> list[tuple[str, V]]:
        return list(self._items.items())

    def values(self) -> list[V]:
        return list(self._items.values())

    def drain(self) -> list[tuple[str, bytes | None]]:
        """``(key, json or None if deleted)`` for every key changed since the last drain."""
        out = []
        for key in sorted(self._dirty):
            value = self._items.get(key)
            out.append((key, None if value is None else orjson.dumps(self._dump(value))))
        self._dirty.clear()
        return out

    def restore(self, rows: Iterable[tuple[str, bytes]]) -> None:
        """Replace the contents with persisted rows (nothing is marked changed)."""
        self._items = {key: self._load(orjson.loads(raw)) for key, raw in rows}
        self._dirty.clear()
