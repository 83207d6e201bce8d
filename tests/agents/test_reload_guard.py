"""Hot reload never ends the worker on a rule file (issue 23): a rejected set of files
keeps the last good rules, is not parsed again until it changes, and any exception from
loading is a rejection. The reload step alone, on files in a temp dir: no broker."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agents import runtime
from app.rules import loader
from app.rules.loader import RuleSet, load_rules

GOOD = "rules:\n  - id: r\n    source: logs\n    where: status = 1\n"
DEEP = "rules:\n  - id: r\n    source: logs\n    where: '" + "(" * 2000 + "status = 1" + ")" * 2000 + "'\n"


class Reloads:
    """The reload step over ``rules_dir``, counting the loads and recording the swaps."""

    def __init__(self, rules_dir: Path, monkeypatch: pytest.MonkeyPatch, load: Any = load_rules) -> None:
        self.loads = 0
        self.broker_down = False
        self.swapped: list[RuleSet] = []
        self.settings = SimpleNamespace(
            rules_dir=rules_dir, bootstrap_servers="", partitions=1, replication_factor=1
        )
        self.rt = SimpleNamespace(ruleset=load_rules([rules_dir]), rejected=None, swap=self.swap)

        def counted(paths: Any) -> RuleSet:
            self.loads += 1
            return load(paths)

        async def no_topics(*_args: Any, **_kw: Any) -> None:
            if self.broker_down:
                raise ConnectionError("the broker is gone")

        monkeypatch.setattr(loader, "load_rules", counted)  # what check_rule_files calls
        monkeypatch.setattr(runtime, "ensure_topics", no_topics)

    def swap(self, ruleset: RuleSet) -> None:
        self.swapped.append(ruleset)
        self.rt.ruleset = ruleset

    def tick(self) -> None:
        asyncio.run(runtime.maybe_reload(self.settings, self.rt))  # type: ignore[arg-type]


def test_a_bad_edit_keeps_the_rules_and_is_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rules = tmp_path / "r.yaml"
    rules.write_text(GOOD)
    reloads = Reloads(tmp_path, monkeypatch)
    good = reloads.rt.ruleset
    rules.write_text(DEEP)  # raised RecursionError out of the reload, which ended the worker
    with caplog.at_level(logging.ERROR, logger="agents.runtime"):
        for _ in range(3):
            reloads.tick()
    assert reloads.rt.ruleset is good and reloads.swapped == []
    assert reloads.loads == 1  # the unchanged bad file is not parsed on every tick
    rejected = [r.getMessage() for r in caplog.records]
    assert len(rejected) == 1 and f"{rules}:4:12: r: expression nests more than 20 levels" in rejected[0]
    rules.write_text(GOOD.replace("status = 1", "status = 2"))
    reloads.tick()
    assert reloads.loads == 2 and len(reloads.swapped) == 1
    # the same bad edit made again is parsed and logged again, once
    rules.write_text(DEEP)
    with caplog.at_level(logging.ERROR, logger="agents.runtime"):
        reloads.tick()
        reloads.tick()
    assert reloads.loads == 3 and len(caplog.records) == 2


def test_any_exception_from_loading_is_a_rejection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rules = tmp_path / "r.yaml"
    rules.write_text(GOOD)

    def broken(_paths: Any) -> RuleSet:
        raise RuntimeError("a loader bug")

    reloads = Reloads(tmp_path, monkeypatch, load=broken)
    good = reloads.rt.ruleset
    rules.write_text(GOOD.replace("status = 1", "status = 2"))
    with caplog.at_level(logging.ERROR, logger="agents.runtime"):
        reloads.tick()
        reloads.tick()
    assert reloads.rt.ruleset is good and reloads.loads == 1
    assert ["rule files could not be loaded, keeping the last good rules"] == [
        r.getMessage() for r in caplog.records
    ]
    assert "a loader bug" in caplog.text


def test_topics_that_cannot_be_created_postpone_the_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rules = tmp_path / "r.yaml"
    rules.write_text(GOOD)
    reloads = Reloads(tmp_path, monkeypatch)
    good = reloads.rt.ruleset
    rules.write_text(GOOD.replace("status = 1", "status = 2"))
    reloads.broker_down = True  # raised out of the reload, which ended the worker
    with caplog.at_level(logging.WARNING, logger="agents.runtime"):
        reloads.tick()
    assert reloads.rt.ruleset is good and "reload postponed" in caplog.text
    reloads.broker_down = False  # the files were fine: the next tick applies them
    reloads.tick()
    assert reloads.loads == 2 and len(reloads.swapped) == 1


def test_a_worker_starting_with_a_bad_file_keeps_the_valid_ones_and_does_not_parse_the_set_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a_good.yaml").write_text(GOOD)
    (tmp_path / "b_deep.yaml").write_text(DEEP.replace("id: r", "id: deep"))
    settings = SimpleNamespace(rules_dir=tmp_path)
    with caplog.at_level(logging.ERROR, logger="agents.runtime"):
        ruleset, rejected = runtime.initial_rules(settings)  # type: ignore[arg-type]
    assert [r.id for r in ruleset.rules] == ["r"]
    assert rejected is not None and set(rejected) == {
        str(tmp_path / "a_good.yaml"),
        str(tmp_path / "b_deep.yaml"),
    }
    assert "b_deep.yaml" in caplog.text and "starting with the valid files only" in caplog.text


def test_valid_files_that_clash_start_with_no_rules_rather_than_no_worker(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yaml").write_text(GOOD)  # the same rule id twice: each file alone is valid
    ruleset, rejected = runtime.initial_rules(SimpleNamespace(rules_dir=tmp_path))  # type: ignore[arg-type]
    assert ruleset.rules == () and rejected is not None


def test_a_valid_directory_starts_with_every_rule_and_nothing_rejected(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    ruleset, rejected = runtime.initial_rules(SimpleNamespace(rules_dir=tmp_path))  # type: ignore[arg-type]
    assert [r.id for r in ruleset.rules] == ["r"] and rejected is None
