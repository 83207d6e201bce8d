"""The one state-key format: what the evaluator builds is what the worker and Spark parse."""

from __future__ import annotations

import pytest

from app.rules.statekey import SEPARATOR, StateKey, clock_key, group_text, is_clock_key


@pytest.mark.parametrize("group", [("m1",), ("10.0.0.1", "GET"), ("", "x"), ("a b", "é")])
def test_a_key_parses_back_to_its_rule_and_group(group: tuple[str, ...]) -> None:
    key = StateKey("hot", group)
    text = key.encode()
    assert text == "hot" + StateKey.suffix(group) == SEPARATOR.join(("hot", *group))
    assert StateKey.parse(text) == key
    assert StateKey.rule_of(text) == "hot"


def test_a_rule_without_group_by_has_its_id_as_key() -> None:
    assert StateKey("all").encode() == "all"
    assert StateKey.parse("all") == StateKey("all", ())


def test_clock_records_never_parse_as_a_rules_state() -> None:
    key = clock_key("logs.by.client_ip", 3)
    assert is_clock_key(key) and not is_clock_key(StateKey("hot", ("m1",)).encode())
    assert key.endswith(SEPARATOR + "3")


def test_group_text_joins_as_keys_do() -> None:
    assert group_text(("a", "b")) == StateKey.suffix(("a", "b"))[1:]
