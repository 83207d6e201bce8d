"""Annotation templates: ``{{ name }}`` placeholders filled from event or aggregate values.

Deliberately tiny: a placeholder is a field name (``device.site`` for enriched
fields), optionally with one formatting filter (``| round(1)``, ``| upper``,
``| lower``). There is no code execution, no attribute access and no loops.
Unknown names are load-time errors, found by :func:`placeholders`; so are an unclosed
``{{``, a stray ``}}`` and a ``{% %}`` block (:func:`template_problem`), and a filter on a
value of the wrong type, ``round`` on text or ``upper`` on a number (:func:`filter_problems`).
Labels are static: a ``{{`` in one is an error (:func:`static_problem`).
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


#: how a problem names a value's type
_TYPE_WORDS = {
    "string": "text (a string)",
    "long": "a number",
    "double": "a number",
    "boolean": "true/false (a boolean)",
    "timestamp": "a timestamp",
}


def filter_problems(template: str, types: Mapping[str, str]) -> list[str]:
    """One problem for each placeholder whose filter cannot apply to the value it names, by
    the value's type (``types``: name -> ``string``, ``long``, ``double``, ``boolean`` or
    ``timestamp``); empty when every filter can. ``round(N)`` rounds a number, ``upper`` and
    ``lower`` change the case of text: on another value either would leave it as it is, or
    render it oddly, at every alert. A name missing from ``types`` is not checked."""
    problems = []
    for m in _PLACEHOLDER.finditer(template):
        name, flt = m.group(1), m.group(2)
        kind = types.get(name)
        if flt is None or kind is None:
            continue
        numeric = kind in ("long", "double")
        if flt.startswith("round") and not numeric:
            need = "a number"
        elif flt in ("upper", "lower") and numeric:
            need = "text (a string)"
        else:
            continue
        what = _TYPE_WORDS.get(kind, kind)
        problems.append(f"{m.group(0)!r}: the filter {flt} needs {need}, but '{name}' is {what}")
    return problems


def template_problem(template: str) -> str | None:
    """Why an annotation would print part of itself as written, None when it would not: a
    ``{% ... %}`` block (there is no code: no statements, loops or imports), a ``{{`` that no
    ``}}`` closes on its line, or a ``}}`` that closes no ``{{``. Linear in the template's
    length. (A closed but malformed ``{{ ... }}`` is :func:`placeholders`' to report.)"""
    if "{%" in template or "%}" in template:
        return (
            "'{% ... %}' blocks are not supported: an annotation only fills {{ name }} "
            "placeholders, with an optional filter round(N), upper or lower"
        )
    base = 0
    for line in template.split("\n"):
        pos = 0
        while True:
            opens, closes = line.find("{{", pos), line.find("}}", pos)
            if closes != -1 and (opens == -1 or closes < opens):
                return f"'}}}}' (character {base + closes + 1}) closes no '{{{{'"
            if opens == -1:
                break
            end = line.find("}}", opens + 2)
            if end == -1:
                return (
                    f"'{{{{' (character {base + opens + 1}) is not closed by '}}}}' on its line; "
                    "expected {{ name }}"
                )
            pos = end + 2
        base += len(line) + 1
    return None


def static_problem(value: str) -> str | None:
    """Why a label's value looks like a template, None when it does not. Labels are static:
    they identify the alert (its fingerprint and id), so they are never filled in."""
    if "{{" in value or "{%" in value:
        return (
            "labels are static, never filled in (they identify the alert); templates go in "
            "annotations, and a field in group_by becomes a label of each alert"
        )
    return None


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
