"""A shared clock that starts once every producer on it is ready (``--clock-gate FILE --clock-party NAME``).

``--clock WALL@TIME`` fixes in advance the Unix time its event time is due at. A producer
that is not publishing by then bursts its first events in behind the others, and on a
partition they share its devices look silent to the clock the others drive. ``make run``
gave its producers a 5 s lead; on 2 busy cores the fleet's MQTT bridge alone took 5 s to
come up, the fleet's readings arrived up to 134 minutes of event time behind the NAB
replay's, and its devices fired 18 false ``device-silent`` alerts in two short runs while
reporting every 5 minutes.

A gate starts the clock when its producers are ready instead. FILE (JSON) names the
event time the clock starts at and the producers (parties) that share it::

    {"event_ms": 1386676800000, "parties": ["replay-sensors", "sim-fleet", "sim-ticks"],
     "lead_s": 0.5, "timeout_s": 30}

(other keys are its writer's own, and kept).

Each party, once connected to its sink (or with nothing left to publish), writes
``FILE.<party>.ready`` with the Unix time it was ready, and waits. Once every party's file
is there, ``event_ms`` is due ``lead_s`` after the last of them. Every party computes that
same time from the same files, and records it in FILE as ``wall_s``: a party restarted
later, and the next run, read it there. A party not ready ``timeout_s`` after the first
is not waited for: the clock starts at that deadline plus ``lead_s``, with a warning that
names it, and when it comes it publishes on that schedule (its events already due in a
burst). A ready time after the deadline never moves the start, so every party computes the
same one either way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import ConfigError
from app.events import format_ts
from app.eventtime import Clock
from app.runtime.statefile import read_json, write_json

logger = logging.getLogger(__name__)

#: how often a waiting party looks at the others' ready files
POLL_S = 0.02
_KEYS = ("event_ms", "parties", "lead_s", "timeout_s", "wall_s")
REMEDY = "its writer (make run) rewrites it at its next start; remove it to start the clock afresh"


@dataclass(frozen=True)
class GateSpec:
    """FILE's content (see the module docstring); ``wall_s`` once the clock started."""

    event_ms: int
    parties: tuple[str, ...]
    lead_s: float
    timeout_s: float
    wall_s: float | None = None
    others: Mapping[str, Any] = field(default_factory=dict)  # its writer's own keys, kept

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.others, "event_ms": self.event_ms, "parties": list(self.parties)}
        out |= {"lead_s": self.lead_s, "timeout_s": self.timeout_s}
        return out if self.wall_s is None else {**out, "wall_s": self.wall_s}


@dataclass(frozen=True)
class ClockGate:
    """Party ``party`` of the gate in ``path``."""

    path: Path
    party: str

    def ready_path(self, party: str) -> Path:
        return ready_path(self.path, party)

    def arrive(self, wall_now: float) -> None:
        """Say this party is ready (Unix time ``wall_now``)."""
        write_json(self.ready_path(self.party), {"ready_s": wall_now})

    def poll(self, wall_now: float) -> Clock | None:
        """The clock, once it has started or may start (Unix time ``wall_now``); None while
        it waits for a party. Raises ConfigError for a FILE that is not a gate."""
        spec = read_spec(self.path)
        if spec.wall_s is not None:
            return Clock(spec.wall_s, spec.event_ms)
        times = {p: t for p in spec.parties if (t := self._ready_s(p)) is not None}
        if not times:
            return None
        deadline = min(times.values()) + spec.timeout_s
        missing = [p for p in spec.parties if p not in times]
        if missing and wall_now < deadline:
            return None
        wall = (deadline if missing else min(max(times.values()), deadline)) + spec.lead_s
        if missing:
            logger.warning(
                "%s: %s not ready %.0f s after the first party; the clock starts without it",
                self.path, ", ".join(missing), spec.timeout_s,
            )  # fmt: skip
        write_json(self.path, dataclasses.replace(spec, wall_s=wall).record())
        return Clock(wall, spec.event_ms)

    def _ready_s(self, party: str) -> float | None:
        path = self.ready_path(party)
        record = read_json(path, "a party's ready time", REMEDY, ConfigError)
        if record is None:
            return None
        try:
            return float(record["ready_s"])
        except (KeyError, TypeError, ValueError):
            msg = f'{path}: expected {{"ready_s": <Unix seconds>}}, got {record!r}; {REMEDY}'
            raise ConfigError(msg) from None


def ready_path(gate: Path, party: str) -> Path:
    """Where ``party`` of the gate in ``gate`` says it is ready (``"*"``: a glob of them all)."""
    return gate.with_name(f"{gate.name}.{party}.ready")


def read_spec(path: Path) -> GateSpec:
    """FILE's content; ConfigError naming the file and what is wrong when it is missing or not a gate."""
    record = read_json(path, "the clock gate", REMEDY, ConfigError)
    if record is None:
        msg = f"{path}: no such clock gate; {REMEDY}"
        raise ConfigError(msg)
    try:
        parties = record["parties"]
        if not isinstance(parties, list) or not parties or not all(isinstance(p, str) and p for p in parties):
            raise TypeError
        wall = record.get("wall_s")
        return GateSpec(
            int(record["event_ms"]),
            tuple(parties),
            float(record["lead_s"]),
            float(record["timeout_s"]),
            None if wall is None else float(wall),
            {k: v for k, v in record.items() if k not in _KEYS},
        )
    except (AttributeError, KeyError, TypeError, ValueError):
        msg = (
            f"{path}: expected event_ms, parties (a non-empty list of names), lead_s and timeout_s, "
            f"got {record!r}; {REMEDY}"
        )
        raise ConfigError(msg) from None


def write_gate(path: Path, spec: GateSpec) -> None:
    """A new gate in ``path`` (its clock not started), the ready files of an earlier one removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(ready_path(path, "*").name):
        old.unlink(missing_ok=True)
    write_json(path, spec.record())


def leave(clock: object) -> None:
    """A party with nothing to publish: the others need not wait for it (a no-op for a
    plain :class:`~app.eventtime.Clock` or None)."""
    if isinstance(clock, ClockGate):
        clock.arrive(time.time())


async def wait_async(gate: ClockGate, stop: asyncio.Event) -> Clock | None:
    """Arrive at ``gate`` and wait for its clock; None when ``stop`` is set first."""
    gate.arrive(time.time())
    while (clock := gate.poll(time.time())) is None:
        if stop.is_set():
            return None
        await asyncio.sleep(POLL_S)
    _started(gate, clock)
    return clock


def wait_sync(gate: ClockGate, stop: threading.Event) -> Clock | None:
    """:func:`wait_async` for a thread."""
    gate.arrive(time.time())
    while (clock := gate.poll(time.time())) is None:
        if stop.wait(POLL_S):
            return None
    _started(gate, clock)
    return clock


def _started(gate: ClockGate, clock: Clock) -> None:
    start, due = format_ts(clock.event_ms), format_ts(int(clock.wall_s * 1000))
    logger.info("%s: %s ready; event time %s is due at %s", gate.path, gate.party, start, due)
