"""How far a replay or a simulator got, kept in a small JSON file so a restart resumes.

A producer of a deterministic sequence (a file replay, a seeded simulator: the same input
and options give the same items in the same order) given ``--progress PATH`` records:

- ``consumed``: input items whose records the broker acknowledged, events and dead letters
  alike. A resumed run skips exactly this many items of the sequence and goes on from there;
- ``sent``: the events among them. ``--limit`` (``--count``) bounds this total across runs;
- ``finished``: the input ended. A later run says so and exits 0 at once;
- ``input``: what decides the sequence (file name, format and its options; a simulator's
  seed, start and sizes). A run whose input differs refuses the file instead of skipping
  items of another sequence.

The file is one JSON object (``version`` 1)::

    {"version": 1, "input": {"file": "machine_temperature_system_failure.csv", "format": "nab", ...},
     "consumed": 4210, "sent": 4210, "finished": false, "updated_at": "2026-11-25T10:00:00.000Z"}

Writes are atomic (temporary file in the same directory, fsync, rename, fsync of the
directory), so a crash leaves the old or the new counts, never a torn file. Producers write
only counts the broker acknowledged, after a flush: every second while they run and once
at a clean stop. A clean stop (SIGTERM, Ctrl-C) therefore republishes nothing; a crash
between an acknowledgement and the next write republishes at most those items on the next
run (at least once; deterministic alert ids make the repeats harmless downstream).

A file that cannot be read, or that another input wrote, is an error naming the file
(:class:`ProgressError`), never a silent restart from zero, which would publish everything
again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from app.errors import ConfigError
from app.events import format_ts
from app.runtime.statefile import read_json, write_json

logger = logging.getLogger(__name__)

VERSION = 1
#: seconds between two progress writes while a producer runs
CHECKPOINT_S = 1.0

_START_OVER = (
    "delete it to publish the input from the beginning again (what is on the topic is then "
    "published twice), or start the whole system from nothing with `python -m app run --fresh`"
)


class ProgressError(ConfigError):
    """The progress file exists but cannot be used: unreadable, malformed, or written for
    another input. The message names the file and what to do."""


class OtherInputError(ProgressError):
    """The progress file was written for another input (``input`` differs)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """Acknowledged counts of a producer over all its runs; see the module docstring."""

    consumed: int = 0
    sent: int = 0
    finished: bool = False

    def done(self, limit: int | None) -> bool:
        """True when nothing is left to publish: the input ended or ``limit`` events were sent."""
        return self.finished or (limit is not None and self.sent >= limit)


def _normal(identity: Mapping[str, Any]) -> dict[str, Any]:
    """``identity`` as it reads back from JSON (tuples become lists, keys stay strings)."""
    value: dict[str, Any] = orjson.loads(orjson.dumps(dict(identity)))
    return value


class ProgressFile:
    """The progress of one producer role in ``path``, for the input described by ``identity``
    (JSON-serialisable values). Not thread-safe; one producer owns one file."""

    def __init__(self, path: Path, identity: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.identity = _normal(identity)

    def load(self) -> Progress:
        """The saved progress; ``Progress()`` when there is no file yet. ProgressError when the
        file cannot be read or is malformed, OtherInputError when another input wrote it."""
        data = _read(self.path)
        if data is None:
            return Progress()
        if data["input"] != self.identity:
            msg = (
                f"{self.path}: the progress file was written for another input "
                f"({orjson.dumps(data['input']).decode()}, not {orjson.dumps(self.identity).decode()}); "
                f"{_START_OVER}"
            )
            raise OtherInputError(msg)
        return Progress(data["consumed"], data["sent"], data["finished"])

    @staticmethod
    def stored_input(path: Path) -> dict[str, Any] | None:
        """The ``input`` the progress file at ``path`` was written for, or None when there is
        no file (a simulator started without ``--start`` takes its start from there).
        ProgressError as for :meth:`load`."""
        data = _read(Path(path))
        return None if data is None else dict(data["input"])

    def save(self, progress: Progress) -> None:
        """Atomically replace the file with ``progress`` (temp file, fsync, rename, fsync dir);
        creates the directory when missing."""
        record = {
            "version": VERSION,
            "input": self.identity,
            "consumed": progress.consumed,
            "sent": progress.sent,
            "finished": progress.finished,
            "updated_at": format_ts(time.time_ns() // 1_000_000),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, record)


def _read(path: Path) -> dict[str, Any] | None:
    """The record in ``path``, checked; None when there is no file."""
    data = read_json(path, "the progress file", _START_OVER, ProgressError)
    if data is None:
        return None
    problem = _problem(data)
    if problem:
        msg = f"{path}: not a progress file: {problem}; {_START_OVER}"
        raise ProgressError(msg)
    checked: dict[str, Any] = data
    return checked


def _problem(data: Any) -> str | None:
    """What makes ``data`` not a version-1 progress record, or None."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    if data.get("version") != VERSION:
        return f"version {data.get('version')!r}, expected {VERSION}"
    for name in ("consumed", "sent"):
        value = data.get(name)
        if type(value) is not int or value < 0:
            return f"{name!r} must be an integer >= 0, got {value!r}"
    if type(data.get("finished")) is not bool:
        return f"'finished' must be true or false, got {data.get('finished')!r}"
    if not isinstance(data.get("input"), dict):
        return f"'input' must be an object, got {data.get('input')!r}"
    if data["sent"] > data["consumed"]:
        return f"'sent' ({data['sent']}) exceeds 'consumed' ({data['consumed']})"
    return None
