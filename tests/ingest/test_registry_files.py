"""`python -m ingest registry` files with bad input: refused with the file, line and column,
nothing published (the loader is all or nothing)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from ingest.model import IngestArgError
from ingest.registry.load import load_rows
from ingest.registry.model import TABLES

DEVICES = TABLES["devices"]


def _problems(tmp_path: Path, text: str | bytes, name: str = "devices.csv") -> tuple[Path, list[str]]:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(IngestArgError) as err:
        load_rows(path, DEVICES)
    return path, str(err.value).splitlines()


def test_a_repeated_column_is_refused_at_the_header(tmp_path: Path) -> None:
    path, problems = _problems(tmp_path, "device_id,max_temp,max_temp\nm1,50,99\n")  # 99 won silently
    assert problems == [f"{path}:1: column 'max_temp' appears twice in the header (columns 2 and 3)"]


def test_a_short_row_is_refused_not_padded_with_nulls(tmp_path: Path) -> None:
    path, problems = _problems(tmp_path, "device_id,site,max_temp\nm1,lab,50\nm2\n")  # m2 loaded, no site
    assert problems == [f"{path}:3: line 3 has 1 field, the header has 3: no field for 'site', 'max_temp'"]


def test_a_semicolon_separated_file_gets_a_hint(tmp_path: Path) -> None:
    path, problems = _problems(tmp_path, "device_id;max_temp\nm1;50\n")
    assert len(problems) == 1
    assert problems[0].startswith(f"{path}:1: the header is one column 'device_id;max_temp': the file looks")
    assert "';'-separated" in problems[0]


@pytest.mark.parametrize("text", ["", "device_id,max_temp\n", "[]\n"])
def test_a_file_without_rows_is_refused(tmp_path: Path, text: str) -> None:
    # with --prune, a file without rows tombstoned every device on the topic
    name = "devices.yaml" if text.startswith("[") else "devices.csv"
    path, problems = _problems(tmp_path, text, name)
    assert len(problems) == 1
    assert problems[0].startswith(f"{path}:1: the file is empty" if not text else f"{path}: no rows")


def test_a_non_finite_yaml_number_is_refused(tmp_path: Path) -> None:
    path, problems = _problems(tmp_path, "- {device_id: m1, max_temp: .inf}\n", "devices.yaml")
    assert problems == [f"{path}:1: max_temp: expected a finite number, got inf"]


@pytest.mark.parametrize("cell", ["NaN", "1e999"])
def test_a_non_finite_csv_number_is_named_as_such(tmp_path: Path, cell: str) -> None:
    path, problems = _problems(tmp_path, f"device_id,max_temp\nm1,{cell}\n")
    assert problems == [f"{path}:2: max_temp: expected a finite number, got '{cell}'"]


def test_an_unknown_column_is_named_once_at_the_header(tmp_path: Path) -> None:
    path, problems = _problems(tmp_path, "device_id,max_tmp\nm1,50\nm2,60\n")
    assert len(problems) == 1
    assert problems[0].startswith(f"{path}:1: unknown column 'max_tmp' (column 2 of the header); did you")


def test_an_excel_export_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    path = tmp_path / "devices.csv"
    path.write_bytes("\ufeffdevice_id,max_temp,deleted\r\nm1,50,\r\nold,,true\r\n".encode())
    records = load_rows(path, DEVICES)
    assert [(r.key, r.line) for r in records] == [("m1", 2), ("old", 3)]
    assert orjson.loads(records[0].value or b"") == {"device_id": "m1", "max_temp": 50.0}
    assert records[1].value is None
