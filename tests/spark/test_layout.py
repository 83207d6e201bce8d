"""The checkpoint's record of its state layout (``jobs.engine.state_layout``): a query always
hashes the keyed path's state into as many buckets as its checkpoint was written with, and
stores each state group's value with the checkpoint's codec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.errors import ConfigError
from app.runtime.settings import Settings
from jobs.engine import (
    MAX_SPLIT,
    SPLIT_ENV,
    StateLayout,
    checkpoint_dir,
    layout_path,
    placement_path,
    read_placement,
    state_layout,
    stream_split,
)
from jobs.state import (
    LEGACY_STATE_BUCKETS,
    LEGACY_STATE_CODEC,
    STATE_BUCKETS,
    STATE_CODEC,
    STATE_SCHEMAS,
    decode_states,
    encode_states,
)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.from_env({"APP_DATA_DIR": str(tmp_path)})


def test_a_new_checkpoint_gets_the_current_layout_and_records_it(settings: Settings) -> None:
    assert state_layout(settings) == StateLayout(STATE_BUCKETS, STATE_CODEC) == StateLayout(8, "zstd")
    record = {"state_buckets": 8, "state_codec": "zstd", "stream_split": 1}
    assert json.loads(layout_path(settings).read_text()) == record
    assert state_layout(settings) == StateLayout(STATE_BUCKETS, STATE_CODEC)  # read back


def test_a_checkpoint_from_before_the_record_keeps_its_64_buckets_and_json(settings: Settings) -> None:
    offsets = checkpoint_dir(settings) / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text("v1\n")  # Spark's offset log: the checkpoint has run
    assert (STATE_BUCKETS, STATE_CODEC) != (LEGACY_STATE_BUCKETS, LEGACY_STATE_CODEC)
    assert state_layout(settings, split=3) == StateLayout(64, "json", 1)  # nor was it split
    record = {"state_buckets": 64, "state_codec": "json", "stream_split": 1}
    assert json.loads(layout_path(settings).read_text()) == record


def test_a_record_without_a_codec_keeps_json_text(settings: Settings) -> None:
    # written between the two records: buckets recorded, the state still JSON text
    layout_path(settings).parent.mkdir(parents=True)
    layout_path(settings).write_text('{"state_buckets": 8}')
    assert state_layout(settings) == StateLayout(8, "json")


def test_a_recorded_layout_is_kept_whatever_the_current_one(settings: Settings) -> None:
    layout_path(settings).parent.mkdir(parents=True)
    layout_path(settings).write_text('{"state_buckets": 16, "state_codec": "json"}')
    assert state_layout(settings) == StateLayout(16, "json")
    assert state_layout(settings, split=4) == StateLayout(16, "json", 1)  # written before splits
    layout_path(settings).write_text('{"state_buckets": 8, "state_codec": "zstd", "stream_split": 3}')
    assert state_layout(settings, split=1) == StateLayout(8, "zstd", 3)


def test_a_new_checkpoint_records_the_configured_split(settings: Settings) -> None:
    assert state_layout(settings, split=4) == StateLayout(STATE_BUCKETS, STATE_CODEC, 4)
    assert json.loads(layout_path(settings).read_text())["stream_split"] == 4
    assert state_layout(settings, split=2).split == 4  # the checkpoint's, from then on


@pytest.mark.parametrize(("env", "split"), [({}, 1), ({SPLIT_ENV: "3"}, 3), ({SPLIT_ENV: " 16 "}, MAX_SPLIT)])
def test_the_split_is_the_settings_or_none(env: dict[str, str], split: int) -> None:
    assert stream_split(env) == split


@pytest.mark.parametrize("value", ["0", "17", "two", "1.5", "-1", "auto"])
def test_a_wrong_split_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match=f"{SPLIT_ENV}='{value}': expected a whole number from 1 to 16"):
        stream_split({SPLIT_ENV: value})


@pytest.mark.parametrize(
    ("text", "says"),
    [("{not json", "not a checkpoint layout"), ('{"other": 1}', "not a checkpoint layout"),
     ('{"state_buckets": 0}', "positive integer"), ('{"state_buckets": "8"}', "positive integer"),
     ('{"state_buckets": true}', "positive integer"), ("[8]", "not a checkpoint layout"),
     ('{"state_buckets": 8, "stream_split": 0}', "stream_split must be a positive integer"),
     ('{"state_buckets": 8, "state_codec": "lz4"}', "state_codec must be one of json, zstd")],
)  # fmt: skip
def test_a_broken_record_is_refused_with_the_file_named(settings: Settings, text: str, says: str) -> None:
    path = layout_path(settings)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ConfigError, match=says) as err:
        state_layout(settings)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("codec", sorted(STATE_SCHEMAS))
def test_each_codec_gives_back_the_states_and_one_value_for_the_same_states(codec: str) -> None:
    states: dict[str, Any] = {
        "k\x1fdev-1": {"b": [[1, [2.5, 2.5]]], "a": None, "due": 10},
        "\x00sensors\x000": {"c": 7},
    }
    same: dict[str, Any] = {
        "\x00sensors\x000": {"c": 7},
        "k\x1fdev-1": {"due": 10, "a": None, "b": [[1, [2.5, 2.5]]]},
    }
    stored = encode_states(states, codec)
    assert isinstance(stored, str if codec == "json" else bytes)
    assert decode_states(stored) == states
    assert decode_states(bytearray(stored) if isinstance(stored, bytes) else stored) == states
    assert encode_states(same, codec) == stored  # unchanged states are not stored again
    assert decode_states(encode_states({}, codec)) == {}


def test_the_compressed_value_is_a_fraction_of_the_text() -> None:
    # a sliding window's buffer, as the bench's windowed pack keeps it per device
    states = {
        f"spike\x1fdev-{d:05d}": {"buffer": [[1_700_000_000_000 + i * 1000, [70.0 + i % 7, 70.0 + i % 7]]
                                            for i in range(30)], "version": "2/af0c4c95a016"}
        for d in range(200)
    }  # fmt: skip
    assert len(encode_states(states, "zstd")) * 4 < len(encode_states(states, "json"))


def test_the_rule_placement_record_reads_back_and_a_broken_one_names_its_file(settings: Settings) -> None:
    """The checkpoint's record of where each rule's state lives (``jobs.engine.read_placement``):
    none before a query wrote one; what was written; a broken one refused, with the file named
    and what deleting it does."""
    assert read_placement(settings) == {}
    path = placement_path(settings)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"rules": {"hot@abc": "keyed", "w@def": "stream"}}))
    assert read_placement(settings) == {"hot@abc": "keyed", "w@def": "stream"}
    for text in ("{not json", '{"rules": ["hot"]}', '{"rules": {"hot@abc": "elsewhere"}}', "[1]"):
        path.write_text(text)
        with pytest.raises(ConfigError, match="not a rule placement") as err:
            read_placement(settings)
        assert str(path) in str(err.value) and "delete the file" in str(err.value)
