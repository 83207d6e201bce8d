"""The problems of one YAML file, a rule file, a rule test file or the routes file
(:mod:`app.dispatch.config`), in the same words whatever the file: each at the line and
column of the value it is about, pydantic's validation errors in the rule language's words,
and at most :data:`MAX_PROBLEMS` of them listed, a last line counting the others.

The files differ only in how a problem names where it is (:class:`Problems`' ``context``
and ``label``): a rule file by the rule's id and the key at fault
(``file:line:col: hot: 'size' must be above 0 (got '0s')``), a test file by the case and the
path to the value in it (``file:line:col: case 1 'x': expect 1: unknown key 'stauts'``), the
routes file by the key alone (``file:line:col: matchers 2: expected a matcher ...``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from app.errors import RuleProblem
from app.rules.yamlpos import Path, Positions, not_a_string, position_of

logger = logging.getLogger(__name__)

#: problems listed per file; past it, one more line counts the rest
MAX_PROBLEMS = 100

#: pydantic's error types that say a value has the wrong shape, as the shape expected
_EXPECTED = {
    "dict_type": "a mapping",
    "mapping_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
    "string_type": "text",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "int_parsing": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
}
#: pydantic's error types whose message names what is allowed but not the value given
_SHOWS_INPUT = ("string_pattern_mismatch", "greater_than_equal", "less_than", "less_than_equal")

#: words for the part of a file a path is in (a rule's id, a test case), None for none
Context = Callable[[Path], str | None]
#: words for the value at a path, as a message names it (``'size'``, ``expect 1: 'rule'``)
Label = Callable[[Path], str]


def describe(value: Any) -> str:
    """A YAML value's kind, in the file's words (with the value when it is short)."""
    if isinstance(value, bool):
        return "true/false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str | int | float):
        return f"{'text' if isinstance(value, str) else 'a number'} {value!r:.40}"
    return type(value).__name__


def field_label(path: Path) -> str:
    """``('expect', 0, 'starts_at')`` as ``expect 1: 'starts_at'`` (list items from 1)."""
    parts: list[str] = []
    for i, p in enumerate(path):
        if isinstance(p, int):
            continue
        nxt = path[i + 1] if i + 1 < len(path) else None
        parts.append(f"{p} {nxt + 1}" if isinstance(nxt, int) else f"'{p}'")
    return ": ".join(parts)


def key_label(path: Path) -> str:
    """The key holding the value at ``path``: ``'size'``, or ``group_by 2`` for a list's item."""
    if not path:
        return ""
    return field_label(path[-2:] if isinstance(path[-1], int) else path[-1:])


def data_path(data: Any, loc: tuple[Any, ...]) -> Path:
    """The part of a pydantic error location that is a path in the file's data (without
    pydantic's ``[key]`` and validator steps), plus a missing key's name."""
    out: list[str | int] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and part != "[key]":
            out.append(part)  # a missing key
            break
        else:
            break
        out.append(part)
    return tuple(out)


def more_problems(unlisted: int) -> str:
    """The line that counts the problems past :data:`MAX_PROBLEMS`."""
    return f"{unlisted} more problem(s) in this file; only the first {MAX_PROBLEMS} are listed"


class Problems:
    """Every problem of one YAML document (``text``, loaded as ``data`` with ``positions``),
    each at the line and column of the value it is about; past :data:`MAX_PROBLEMS`, only
    counted. ``context`` names the part of the file a path is in, ``label`` the value at a
    path (see the module's docstring)."""

    def __init__(
        self, path: str, text: str, data: Any, positions: Positions, context: Context, label: Label
    ) -> None:
        self.path = path
        self.text = text
        self.data = data
        self.positions = positions
        self.context = context
        self.label = label
        self.found: list[RuleProblem] = []
        self.unlisted = 0

    @property
    def count(self) -> int:
        """How many problems were found, listed or not."""
        return len(self.found) + self.unlisted

    def add(self, loc: Path, message: str) -> None:
        """``message`` (which names what it is about) at the value at ``loc``."""
        if len(self.found) >= MAX_PROBLEMS:
            self.unlisted += 1
            return
        line, col = position_of(self.positions, loc)
        self.found.append(RuleProblem(self.path, line, col, self.context(loc), message))

    def add_at(self, loc: Path, message: str, *, named: int = 0) -> None:
        """``message`` about the value at ``loc``, after that value's label, less the last
        ``named`` steps of ``loc`` when ``message`` names them itself."""
        label = self.label(loc[: len(loc) - named])
        self.add(loc, f"{label}: {message}" if label else message)

    def add_pydantic(self, err: Mapping[str, Any], base: Path = ()) -> None:
        """One of pydantic's errors for the value at ``base`` (its location is relative to it)."""
        loc = data_path(self.data, (*base, *err["loc"]))
        kind = str(err.get("type", ""))
        value = err.get("input")
        if kind in ("extra_forbidden", "missing") and err["loc"]:
            what = "unknown key" if kind == "extra_forbidden" else "missing required key"
            self.add_at(loc, f"{what} '{err['loc'][-1]}'", named=1)
            return
        ctx = err.get("ctx") or {}
        if kind == "greater_than" and "gt" in ctx:  # the durations that must be above 0
            label = self.label(loc) or "the value"
            self.add(loc, f"{label} must be above {ctx['gt']} (got {value!r})")
            return
        if kind == "string_type" and loc:
            hint = not_a_string(self.text, self.positions, self.data, loc, value)
            if hint is not None:
                self.add_at(loc, hint)
                return
        if kind in _EXPECTED:
            self.add_at(loc, f"expected {_EXPECTED[kind]}, got {describe(value)}")
            return
        if kind == "too_short" and ctx.get("min_length") == 1:
            self.add_at(loc, "must not be empty")
            return
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if kind.startswith("literal_error") or kind in _SHOWS_INPUT:
            msg = f"{msg} (got {value!r})"
        self.add_at(loc, msg)

    def listed(self) -> list[RuleProblem]:
        """The problems listed, then, when there were more, the line that counts the others."""
        if not self.unlisted:
            return list(self.found)
        return [*self.found, RuleProblem(self.path, 1, 1, None, more_problems(self.unlisted))]

    def lines(self) -> list[str]:
        """:meth:`listed` as ``file:line:col: context: message`` (no context: left out)."""
        return [
            f"{p.path}:{p.line}:{p.col}: {p.rule_id + ': ' if p.rule_id else ''}{p.message}"
            for p in self.listed()
        ]
