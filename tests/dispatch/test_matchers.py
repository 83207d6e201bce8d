"""Label matchers: the four operators, anchoring, absent labels, quoting and errors."""

from __future__ import annotations

import orjson
import pytest

from app.dispatch.matchers import format_labels, parse_matcher

LABELS = {"severity": "critical", "team": "plant-ops", "device_id": "pump-7"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('severity="critical"', True),
        ("severity=critical", True),
        ("severity = warning", False),
        ("team!=ops", True),
        ('team=~"plant.*"', True),
        ('team=~"ops"', False),  # anchored: no substring match
        ('device_id!~"pump-[0-9]+"', False),
        ('site=""', True),  # absent label is the empty string
        ("site!=x", True),
        ('summary="a \\"quoted\\" word"', False),
    ],
)
def test_operators_and_anchoring(text: str, expected: bool) -> None:
    assert parse_matcher(text).matches(LABELS) is expected


def test_round_trip_spelling() -> None:
    m = parse_matcher('team=~"plant|ops"')
    assert str(m) == 'team=~"plant|ops"'
    assert parse_matcher(str(m)) == m
    assert format_labels({"b": "2", "a": "1"}) == '{a="1",b="2"}'


@pytest.mark.parametrize(("text", "reason"), [("severity", "expected a matcher"), ("9x=1", "expected"),
                                              ('a=~"("', "bad regex")])  # fmt: skip
def test_bad_matchers_say_what_is_expected(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_matcher(text)


@pytest.mark.parametrize("pattern", ["(a+)+", r"(\w+\s?)*$", "((a|b)*c)*", r"(a)\1", "x" * 1001])
def test_regexes_that_could_backtrack_exponentially_are_refused_with_the_reason(pattern: str) -> None:
    with pytest.raises(ValueError, match="refused"):
        parse_matcher(f"device_id=~{orjson.dumps(pattern).decode()}")


def test_ordinary_regexes_are_still_accepted_and_match() -> None:
    assert parse_matcher('device_id=~"pump-.*"').matches({"device_id": "pump-7"})
    assert parse_matcher('x=~"(ab|cd){2,5}x?"').matches({"x": "abcd"})
    assert not parse_matcher('x!~"(?:foo)+bar"').matches({"x": "foofoobar"})
