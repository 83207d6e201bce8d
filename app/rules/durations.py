"""Durations as operators write them: ``500ms``, ``30s``, ``15m``, ``1h``, ``1d``, ``1w``."""

from __future__ import annotations

import re

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d|w)\s*$")

#: Longest duration a rule may name: a year is plenty and bounds state lifetimes.
MAX_DURATION_MS = 366 * 86_400_000


def parse_duration(value: object) -> int:
    """Parse a duration into milliseconds.

    Raises ``ValueError`` with the expected form on anything else, including
    bare numbers (units are never implied) and values over a year.
    """
    if isinstance(value, bool) or not isinstance(value, str):
        msg = f"expected a duration such as 30s, 15m, 1h or 1d, got {value!r}"
        raise ValueError(msg)
    m = _DURATION.match(value)
    if not m:
        msg = f"expected a duration such as 30s, 15m, 1h or 1d, got {value!r}"
        raise ValueError(msg)
    ms = int(m.group(1)) * _UNITS_MS[m.group(2)]
    if ms > MAX_DURATION_MS:
        msg = f"duration {value!r} is longer than the maximum of 366d"
        raise ValueError(msg)
    return ms


def format_duration(ms: int) -> str:
    """The shortest exact spelling of ``ms``: 900000 -> ``15m``."""
    for unit in ("w", "d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
