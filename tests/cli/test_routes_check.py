"""`python -m app routes check` reports each mistake of the receivers once: an invalid receiver
is not also "'receivers': Tuple should have at least 1 item after validation, not 0"."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.main import main

ROUTE = "route:\n  receiver: default\n"


def _check(tmp_path: Path, receivers: str, capsys: pytest.CaptureFixture[str]) -> tuple[Path, list[str]]:
    path = tmp_path / "routes.yaml"
    path.write_text(receivers + ROUTE)
    assert main(["routes", "check", str(path)]) == 1
    return path, capsys.readouterr().out.splitlines()


def test_the_only_receiver_missing_its_secret_is_one_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    receivers = "receivers:\n  - name: default\n    type: webhook\n    url: http://example.com/hook\n"
    path, out = _check(tmp_path, receivers, capsys)
    assert out == [f"{path}:2:5: receivers 1: missing required key 'secret'"]


def test_every_receiver_invalid_lists_each_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    receivers = (
        "receivers:\n  - {name: default, type: webhook, url: http://x/y}\n  - {name: d2, type: smtp}\n"
    )
    path, out = _check(tmp_path, receivers, capsys)
    assert len(out) == 2, out
    assert out[0] == f"{path}:2:5: receivers 1: missing required key 'secret'"
    assert out[1].startswith(f"{path}:3:5: receivers 2: Input tag 'smtp' found using 'type'")


def test_an_empty_receivers_list_is_one_problem_that_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, out = _check(tmp_path, "receivers: []\n", capsys)
    assert out == [f"{path}:1:12: 'receivers': at least one receiver is needed, got an empty list"]


def test_an_inhibit_rule_with_a_bad_matcher_is_one_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    receivers = "receivers:\n  - {name: default, type: kafka}\n"
    inhibit = "inhibit_rules:\n  - source_matchers: ['x=~\"(\"']\n    target_matchers: ['a=b']\n"
    path = tmp_path / "routes.yaml"
    path.write_text(receivers + ROUTE + inhibit)
    assert main(["routes", "check", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1, out
    assert out[0].startswith(f"{path}:6:23: source_matchers 1: bad regex in matcher")
