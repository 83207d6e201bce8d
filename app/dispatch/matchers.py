"""Label matchers as Alertmanager writes them: ``name="value"``, ``!=``, ``=~`` and ``!~``.

A matcher is parsed once (at config load or on a command) into a frozen
:class:`Matcher`; regexes are compiled then and anchored at both ends, as in
Alertmanager (``=~"crit.*"`` matches ``critical`` but not ``subcritical``).
A label that is absent matches as the empty string, so ``team!="ops"`` matches
an alert without a ``team`` label and ``team=""`` matches only such alerts.

Accepted forms: ``name=value``, ``name="quoted value"`` (JSON string escapes),
with optional spaces around the operator. Anything else raises ValueError
naming the expected form.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

logger = logging.getLogger(__name__)

Op = Literal["=", "!=", "=~", "!~"]
_FORM = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(".*"|[^"]*?)\s*$', re.DOTALL)
_EXPECTED = (
    'expected a matcher such as severity="critical", team!=ops, device_id=~"pump-.*" or env!~"dev|test"'
)


@dataclass(frozen=True)
class Matcher:
    """One label condition. ``regex`` is the compiled, anchored pattern for ``=~``/``!~``."""

    name: str
    op: Op
    value: str
    regex: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when ``labels`` satisfy this matcher (a missing label is ``""``)."""
        got = labels.get(self.name, "")
        if self.op == "=":
            return got == self.value
        if self.op == "!=":
            return got != self.value
        assert self.regex is not None  # noqa: S101 - set by parse_matcher for regex ops
        found = self.regex.fullmatch(got) is not None
        return found if self.op == "=~" else not found

    def __str__(self) -> str:
        return f"{self.name}{self.op}{orjson.dumps(self.value).decode()}"


def parse_matcher(text: str) -> Matcher:
    """Parse one matcher; ValueError with the expected form on bad input or a bad regex."""
    if not isinstance(text, str):
        msg = f"{_EXPECTED}, got {text!r}"
        raise ValueError(msg)
    m = _FORM.match(text)
    if not m:
        msg = f"{_EXPECTED}, got {text!r}"
        raise ValueError(msg)
    name, op, raw = m.group(1), m.group(2), m.group(3)
    value = raw
    if raw.startswith('"'):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            msg = f"bad quoted value in matcher {text!r}: use JSON string escapes"
            raise ValueError(msg) from None
        if not isinstance(value, str):
            msg = f"{_EXPECTED}, got {text!r}"
            raise ValueError(msg)
    regex = None
    if op in ("=~", "!~"):
        try:
            regex = re.compile(f"(?:{value})", re.DOTALL)
        except re.error as exc:
            msg = f"bad regex in matcher {text!r}: {exc}"
            raise ValueError(msg) from None
        why = backtracking_risk(value)
        if why:
            msg = f"regex in matcher {text!r} refused: {why}"
            raise ValueError(msg)
    return Matcher(name, op, value, regex)  # type: ignore[arg-type]


#: Longest regex a matcher may hold.
MAX_REGEX_CHARS = 1000


def backtracking_risk(pattern: str) -> str:
    """Why ``pattern`` could make Python's backtracking matcher run for exponential time on
    a label value, or "" when it cannot in the ways checked: a repeat inside a repeat
    (``(a+)+``, ``(\\w+\\s?)*``), the shape of every classic catastrophic regex, a back
    reference, or more than :data:`MAX_REGEX_CHARS` characters. A silence or a route is
    evaluated on every alert, so one such pattern would stall the dispatcher."""
    if len(pattern) > MAX_REGEX_CHARS:
        return f"longer than {MAX_REGEX_CHARS} characters"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import sre_constants
        import sre_parse

    repeats = {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT}
    refs = {sre_constants.GROUPREF, sre_constants.GROUPREF_EXISTS}

    def walk(items: Any, inside_repeat: bool) -> str:
        for item in items:
            if isinstance(item, sre_parse.SubPattern):
                found = walk(item.data, inside_repeat)
            elif isinstance(item, tuple) and item and item[0] in repeats:
                _lo, hi, body = item[1]
                if inside_repeat and hi > 1:
                    return "a repeat inside a repeat (e.g. (a+)+) can backtrack exponentially"
                found = walk([body], inside_repeat or hi > 1)
            elif isinstance(item, tuple) and item and item[0] in refs:
                return "back references are not allowed"
            elif isinstance(item, tuple | list):
                found = walk(item, inside_repeat)
            else:
                found = ""
            if found:
                return found
        return ""

    return walk([sre_parse.parse(pattern)], False)


def parse_matchers(texts: Iterable[str]) -> tuple[Matcher, ...]:
    return tuple(parse_matcher(t) for t in texts)


def matches_all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    """True when every matcher matches (so an empty list matches everything)."""
    return all(m.matches(labels) for m in matchers)


def format_matchers(matchers: Iterable[Matcher]) -> str:
    """``{a="1",b=~"x.*"}``, the spelling used in route and group keys."""
    return "{" + ",".join(str(m) for m in matchers) + "}"


def format_labels(labels: Mapping[str, str]) -> str:
    """``{a="1",b="2"}`` with sorted names, as Alertmanager spells a label set."""
    return "{" + ",".join(f"{k}={orjson.dumps(labels[k]).decode()}" for k in sorted(labels)) + "}"
