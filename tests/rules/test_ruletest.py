"""Rule test files (`python -m app rules test`, app/rules/ruletest.py) read through the rule
files' bounded YAML reader: the shipped packs' tests pass, and a hostile file is a positioned
failure, not a stall."""

from __future__ import annotations

import time
from pathlib import Path

from app.rules.ruletest import run_tests
from app.runtime.settings import PROJECT_ROOT


def test_the_shipped_rule_tests_pass() -> None:
    report = run_tests([PROJECT_ROOT / "rules" / "tests"])
    assert report.results and report.failed == []


def test_an_alias_bomb_in_a_test_file_is_refused_at_its_position_at_once(tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.test.yaml"
    bomb.write_text("\n".join(levels) + "\ntests: []\n")
    began = time.monotonic()
    (result,) = run_tests([bomb]).results
    assert time.monotonic() - began < 5
    assert not result.ok and result.detail.startswith(f"{bomb}:1:") and "alias" in result.detail
