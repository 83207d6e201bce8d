"""`python -m ingest registry` files with bad input: refused with the file, line and column,
nothing published (the loader is all or nothing)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from app.tables import table_file_rows
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
    assert problems == [
        f"{path}:1:29: column 'max_temp' must be a finite number, got float inf "
        "(as in events, NaN and infinities are refused)"
    ]


@pytest.mark.parametrize("cell", ["NaN", "1e999"])
def test_a_non_finite_csv_number_is_named_as_such(tmp_path: Path, cell: str) -> None:
    path, problems = _problems(tmp_path, f"device_id,max_temp\nm1,{cell}\n")
    assert problems == [
        f"{path}:2: column 'max_temp' must be a finite number, got '{cell}' "
        "(as in events, NaN and infinities are refused)"
    ]


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


#: rows with one problem each, as a CSV file: ``ingest registry`` and a backtest's ``--table``
#: (and the console's map) name it in the same words, at the same line
CSV_PROBLEMS = {
    "off the globe": (
        "device_id,lat,lon\nm1,999,10\n",
        "2: column 'lat' must be within -90..90 (degrees), got float 999.0",
    ),
    "not a number": ("device_id,max_temp\nm1,hot\n", "2: column 'max_temp' must be a number, got 'hot'"),
    "no key": ("device_id,site\n,lab\n", "2: column 'device_id' (the key) is missing or empty"),
    "deleted": ("device_id,deleted\nm1,maybe\n", "2: column 'deleted' must be true or false, got 'maybe'"),
    "repeated key": (
        "device_id,site\nm1,a\nm1,b\n",
        "3: device_id 'm1' is already on line 2; a table file lists each key once",
    ),
}


@pytest.mark.parametrize("case", CSV_PROBLEMS)
def test_the_loader_and_a_table_file_name_a_csv_problem_alike(tmp_path: Path, case: str) -> None:
    text, expected = CSV_PROBLEMS[case]
    path, problems = _problems(tmp_path, text)
    assert problems == [f"{path}:{expected}"]
    assert table_file_rows("devices", path)[1] == problems


#: typed YAML values, in the same words and at the same place (the value's line and column)
YAML_PROBLEMS = {
    "a string column": ("- {device_id: m1, site: 5}", "1:25", "column 'site' must be a string, got int 5"),
    "a number column": (
        "- {device_id: m1, max_temp: true}",
        "1:29",
        "column 'max_temp' must be a number, got bool true",
    ),
    "the key": ("- {device_id: 7}", "1:15", "column 'device_id' must be a string, got int 7"),
    "an unknown column": (
        "- {device_id: m1, colour: red}",
        "1:27",
        "unknown column 'colour'; expected one of: " + ", ".join(DEVICES.schema.file_columns()),
    ),
    "not a mapping": ("- m1", "1:3", "a row must be a mapping of column: value, got str"),
}


@pytest.mark.parametrize("case", YAML_PROBLEMS)
def test_the_loader_and_a_table_file_name_a_yaml_problem_alike(tmp_path: Path, case: str) -> None:
    text, place, expected = YAML_PROBLEMS[case]
    path, problems = _problems(tmp_path, text + "\n", "devices.yaml")
    assert problems == [f"{path}:{place}: {expected}"]
    assert table_file_rows("devices", path)[1] == problems


def test_a_mistyped_value_is_listed_with_the_rows_other_problems(tmp_path: Path) -> None:
    """The loader checked the types after its own checks, and only when they found nothing."""
    path, problems = _problems(tmp_path, "- {device_id: m1, site: 5, lat: 999, lon: 1}\n", "devices.yaml")
    assert problems == [
        f"{path}:1:25: column 'site' must be a string, got int 5",
        f"{path}:1:33: column 'lat' must be within -90..90 (degrees), got float 999.0",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "device_id,lat\nm1,48.1\n",
            "column 'lon' is missing: 'lat' and 'lon' go together, give both or neither",
        ),
        ("device_id,geofence_km\nm1,0\n", "column 'geofence_km' must be above 0 (km), got float 0.0"),
        (f"device_id,site\n{'k' * 257},lab\n", "column 'device_id' (the key) is longer than 256 characters"),
    ],
)
def test_a_row_the_loader_refuses_is_refused_by_a_table_file_too(
    tmp_path: Path, text: str, expected: str
) -> None:
    """One file serves ``ingest registry`` and a backtest's ``--table`` (and the console's map):
    a row the loader would not publish is not in the backtest's table either (a backtest read
    a lone ``lat``, a zero geofence or an over-long key the live worker never had)."""
    path, problems = _problems(tmp_path, text)
    assert problems == [f"{path}:2: {expected}"]
    assert table_file_rows("devices", path) == ([], problems)


def test_a_yaml_file_gives_a_backtest_the_rows_the_loader_publishes(tmp_path: Path) -> None:
    """Names and text are stripped and blank text is NULL in both readers: a backtest read
    ``' lab '`` and ``''`` as written, and a key ``' m1 '`` that no event's ``m1`` ever joined."""
    path = tmp_path / "devices.yaml"
    path.write_text("- {' device_id': ' m1 ', site: ' lab ', model: '', deleted: ' no '}\n")
    (record,) = load_rows(path, TABLES["devices"])
    published = orjson.loads(record.value or b"")
    assert published == {"device_id": "m1", "site": "lab"}
    assert table_file_rows("devices", path) == ([published], [])


@pytest.mark.parametrize("wrapper", ["rows", "devices"])
def test_a_yaml_file_wrapped_either_way_serves_the_loader_and_a_backtest(
    tmp_path: Path, wrapper: str
) -> None:
    """One file serves ``ingest registry`` and ``backtest --table``: the loader took only
    ``devices:``, a backtest only ``rows:``, and each refused the other's."""
    path = tmp_path / "devices.yaml"
    path.write_text(f"{wrapper}:\n  - device_id: m1\n    site: lab\n")
    (record,) = load_rows(path, TABLES["devices"])
    assert (record.key, record.line) == ("m1", 2)
    assert table_file_rows("devices", path) == ([{"device_id": "m1", "site": "lab"}], [])


def test_a_key_given_twice_is_named_even_when_its_first_row_is_invalid(tmp_path: Path) -> None:
    """Else fixing the first row's value brought a new error, the repeated key, on the next run."""
    path = tmp_path / "devices.csv"
    path.write_text("device_id,max_temp\nm1,hot\nm1,50\n")
    expected = [
        f"{path}:2: column 'max_temp' must be a number, got 'hot'",
        f"{path}:3: device_id 'm1' is already on line 2; a table file lists each key once",
    ]
    assert _problems(tmp_path, path.read_text())[1] == expected
    assert table_file_rows("devices", path) == ([], expected)
