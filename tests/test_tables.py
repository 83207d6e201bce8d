"""Registry table files for backtests and rule tests (app/tables.py): YAML goes through the
rule files' bounded reader, so a hostile file is refused with file:line:col, never expanded
or recursed into."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.tables import read_table_file


def _alias_bomb(levels: int) -> str:
    """Each level's list holds nine aliases of the one before: 9**levels rows once expanded."""
    lines = ['l0: &l0 {device_id: "d", site: "x"}']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    lines.append(f"rows: *l{levels}")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_at_its_first_anchor(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text(_alias_bomb(5))  # yaml.safe_load expanded it (59,049 rows) and failed without a place
    with pytest.raises(ValueError, match=rf"^{path}:1:\d+: anchor &l0: anchors and aliases are not allowed"):
        read_table_file("devices", path)


def test_deep_yaml_nesting_is_refused_with_its_position(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text("rows:\n  - " + "[" * 10_000 + "]" * 10_000 + "\n")  # a RecursionError before
    with pytest.raises(ValueError, match=rf"^{path}:2:\d+: mappings and lists nest deeper than 64 levels"):
        read_table_file("devices", path)


def test_a_row_that_is_not_a_mapping_is_named_by_its_line(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text("rows:\n  - {device_id: d1, site: a}\n  - just text\n")
    with pytest.raises(ValueError, match=rf"^{path}:3:5: a row must be a mapping"):
        read_table_file("devices", path)


def test_good_yaml_rows_still_load(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text("rows:\n  - {device_id: d1, site: a, max_temp: 80}\n  - {device_id: d2}\n")
    assert read_table_file("devices", path) == [
        {"device_id": "d1", "site": "a", "max_temp": 80},
        {"device_id": "d2"},
    ]
