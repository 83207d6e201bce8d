"""The rule worker's static member id (``APP_WORKER_INSTANCE_ID``): what the setting takes, and
the one ``make run`` gives its worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import ConfigError
from app.runtime.settings import Settings
from app.runtime.system import RunOptions, build_roles
from tests.conftest import make_settings


def member(settings: Settings) -> str:
    roles = build_roles(settings, "127.0.0.1:9", RunOptions(dashboard=False, auth=False), None)
    return next(r for r in roles if r.name == "worker").env["APP_WORKER_INSTANCE_ID"]


def test_unset_is_dynamic_membership_and_a_set_id_is_kept() -> None:
    assert Settings.from_env({}).worker_instance_id == ""
    kept = Settings.from_env({"APP_WORKER_INSTANCE_ID": " pod-3.rules_a "})
    assert kept.worker_instance_id == "pod-3.rules_a"


@pytest.mark.parametrize("bad", ["worker 1", "w/1", "ä", "x" * 250])
def test_an_id_a_group_member_or_a_log_line_cannot_carry_is_refused_by_name(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"APP_WORKER_INSTANCE_ID=.*expected letters, digits"):
        Settings.from_env({"APP_WORKER_INSTANCE_ID": bad})


def test_make_run_gives_its_worker_one_id_per_system_and_the_operators_wins(tmp_path: Path) -> None:
    """A restarted worker takes its predecessor's place in the group: the id is the same at
    every start of one data directory, another for another system, valid as the setting is."""
    one, other = make_settings(tmp_path / "one"), make_settings(tmp_path / "other")
    assert member(one) == member(make_settings(tmp_path / "one")) != member(other)
    assert Settings.from_env({"APP_WORKER_INSTANCE_ID": member(one)}).worker_instance_id == member(one)
    assert member(make_settings(tmp_path / "one", APP_WORKER_INSTANCE_ID="pod-3")) == "pod-3"
