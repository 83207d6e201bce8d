"""``python -m app rules check DIR``: a directory with no rule file is an error (exit 2) that
names it, and the files it skipped for an upper-case extension, never "0 rule(s) in 0
file(s): all valid"."""

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


def test_a_directory_of_upper_case_extensions_names_the_files_it_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r.YAML").write_text(RULE)
    (tmp_path / "s.YML").write_text(RULE)
    (tmp_path / "r.yaml.bak").write_text(RULE)
    assert main(["rules", "check", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: no rule files found in {tmp_path} (rule files end in .yaml or .yml, in lower case; "
        f"not read: {tmp_path / 'r.YAML'}, {tmp_path / 's.YML'})\n"
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
