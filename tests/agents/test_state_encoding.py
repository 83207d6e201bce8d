"""How the worker writes a rule state to its changelog: JSON the table's codec reads back."""

from __future__ import annotations

import json

from faust.serializers import codecs

from agents.state_store import encode_state


def test_a_state_round_trips_through_the_tables_json_codec() -> None:
    state = {"group": ["6.6.6.6"], "buffer": [[1_700_000_000_000, [None, 2.5, "/x"]]], "through": None}
    blob = encode_state(state)
    assert codecs.loads("json", blob) == state


def test_an_integer_beyond_64_bits_is_written_not_refused() -> None:
    """orjson refuses integers beyond 64 bits; the commit must not fail on one."""
    state = {"a": [2**70, 0], "n": 1}
    blob = encode_state(state)
    assert json.loads(blob) == state
    assert codecs.loads("json", blob) == state
