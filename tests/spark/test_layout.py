"""The checkpoint's record of its state layout (``jobs.engine.state_buckets``): a query always
hashes the keyed path's state into as many buckets as its checkpoint was written with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import ConfigError
from app.runtime.settings import Settings
from jobs.engine import checkpoint_dir, layout_path, state_buckets
from jobs.state import LEGACY_STATE_BUCKETS, STATE_BUCKETS


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.from_env({"APP_DATA_DIR": str(tmp_path)})


def test_a_new_checkpoint_gets_the_current_count_and_records_it(settings: Settings) -> None:
    assert state_buckets(settings) == STATE_BUCKETS
    assert json.loads(layout_path(settings).read_text()) == {"state_buckets": STATE_BUCKETS}
    assert state_buckets(settings) == STATE_BUCKETS  # read back


def test_a_checkpoint_from_before_the_record_keeps_its_64_buckets(settings: Settings) -> None:
    offsets = checkpoint_dir(settings) / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text("v1\n")  # Spark's offset log: the checkpoint has run
    assert STATE_BUCKETS != LEGACY_STATE_BUCKETS
    assert state_buckets(settings) == LEGACY_STATE_BUCKETS == 64
    assert json.loads(layout_path(settings).read_text()) == {"state_buckets": 64}


def test_a_recorded_count_is_kept_whatever_the_current_one(settings: Settings) -> None:
    layout_path(settings).parent.mkdir(parents=True)
    layout_path(settings).write_text('{"state_buckets": 16}')
    assert state_buckets(settings) == 16


@pytest.mark.parametrize(
    ("text", "says"),
    [("{not json", "not a checkpoint layout"), ('{"other": 1}', "not a checkpoint layout"),
     ('{"state_buckets": 0}', "positive integer"), ('{"state_buckets": "8"}', "positive integer"),
     ('{"state_buckets": true}', "positive integer")],
)  # fmt: skip
def test_a_broken_record_is_refused_with_the_file_named(settings: Settings, text: str, says: str) -> None:
    path = layout_path(settings)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ConfigError, match=says) as err:
        state_buckets(settings)
    assert str(path) in str(err.value)
