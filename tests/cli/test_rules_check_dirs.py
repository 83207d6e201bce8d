"""``python -m app rules check DIR``: a directory with no rule file is an error (exit 2) that
names it, never "0 rule(s) in 0 file(s): all valid"; a rule file's extension is read in any
case (``x.YAML``, ``x.Yml``), where upper-case ones were skipped without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.main import main

RULE = """rules:
  - id: hot
    source: sensors
    where: temperature > 50
"""


def test_an_empty_directory_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("not a rule file\n")
    assert main(["rules", "check", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: no rule files found in {tmp_path} (rule files end in .yaml or .yml)\n"
    assert captured.out == ""


def test_rule_files_with_upper_case_extensions_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r.YAML").write_text(RULE)
    (tmp_path / "s.Yml").write_text(RULE.replace("id: hot", "id: cold"))
    (tmp_path / "r.yaml.bak").write_text(RULE.replace("id: hot", "id: old"))
    assert main(["rules", "check", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert [line.split(" (")[0] for line in captured.out.splitlines()] == [
        f"{tmp_path / 'r.YAML'}:2: hot: ok",
        f"{tmp_path / 's.Yml'}:2: cold: ok",
    ]
    assert captured.err == "2 rule(s) in 2 file(s): all valid\n"


def test_a_directory_of_rule_tests_alone_says_they_are_not_rule_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r.test.YAML").write_text("rule_files: [../r.yaml]\n")
    assert main(["rules", "check", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: no rule files found in {tmp_path} (rule files end in .yaml or .yml; "
        "rule tests (*.test.yaml, or in a tests folder) are not rule files)\n"
    )


def test_an_empty_directory_beside_a_valid_file_is_still_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(RULE)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["rules", "check", str(good), str(empty)]) == 2
    assert f"error: no rule files found in {empty}" in capsys.readouterr().err


def test_a_directory_with_rule_files_is_checked_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r.yml").write_text(RULE)
    assert main(["rules", "check", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{tmp_path / 'r.yml'}:2: hot: ok")
    assert captured.err == "1 rule(s) in 1 file(s): all valid\n"
