"""Annotation templates: ``{{ name }}`` placeholders filled from event or aggregate values.

Deliberately tiny: a placeholder is a field name (``device.site`` for enriched
fields), optionally with one formatting filter (``| round(1)``, ``| upper``,
``| lower``). There is no code execution, no attribute access and no loops.
Unknown names are load-time errors, found by :func:`placeholders`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

_PLACEHOLDER = re.compile(
    r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)\s*"
    r"(?:\|\s*(round\((\d)\)|upper|lower)\s*)?\}\}"
)


def braces(template: str) -> list[str]:
    r"""Each ``{{ ... }}`` on one line, leftmost first: what ``re.findall(r"\{\{.*?\}\}")``
    finds, in linear time (that regex scans to the line's end from every ``{{`` left open)."""
    found: list[str] = []
    for line in template.split("\n"):
        pos = 0
        while (start := line.find("{{", pos)) != -1:
            end = line.find("}}", start + 2)
            if end == -1:  # no later "{{" on this line can be closed either
                break
            found.append(line[start : end + 2])
            pos = end + 2
    return found


def placeholders(template: str) -> list[str]:
    """The names a template uses. Raises ``ValueError`` on a malformed placeholder."""
    for raw in braces(template):
        if not _PLACEHOLDER.fullmatch(raw):
            msg = (
                f"bad placeholder {raw!r}: expected {{{{ name }}}} with an optional "
                "filter round(N), upper or lower"
            )
            raise ValueError(msg)
    return [m.group(1) for m in _PLACEHOLDER.finditer(template)]


def format_value(value: Any, digits: int | None = None) -> str:
    """How a value reads in an annotation: floats with up to 6 significant digits."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if digits is not None:
            return f"{value:.{digits}f}"
        return f"{value:.6g}"
    return str(value)


def render(template: str, values: Mapping[str, Any]) -> str:
    """Fill every placeholder; a name missing from ``values`` renders as ``null``."""

    def sub(m: re.Match[str]) -> str:
        value = values.get(m.group(1))
        flt = m.group(2)
        if flt == "upper":
            return format_value(value).upper()
        if flt == "lower":
            return format_value(value).lower()
        if flt and isinstance(value, int | float) and not isinstance(value, bool):
            return format_value(float(value), int(m.group(3)))
        return format_value(value)

    return _PLACEHOLDER.sub(sub, template)
