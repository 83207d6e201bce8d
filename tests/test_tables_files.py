"""Registry table files for backtests and rule tests (app/tables.py), bad input: each problem
names the file, the line and the column; a file that loads is a snapshot of valid rows."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from app.errors import IngestDecodeError
from app.events import SENSORS
from app.tables import DEVICES, Tables, read_table_file, refused_row


def _csv(tmp_path: Path, text: str | bytes, name: str = "devices.csv") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(ValueError) as err:
        read_table_file("devices", path)
    return str(err.value).splitlines()


@pytest.mark.parametrize("cell", ["NaN", "1e999", "-inf"])
def test_a_non_finite_number_is_refused_as_in_events(tmp_path: Path, cell: str) -> None:
    path = _csv(tmp_path, f"device_id,max_temp\nm0,50\nm1,{cell}\n")  # loaded as nan/inf: never fired
    assert _problems(path) == [
        f"{path}:3: column 'max_temp' must be a finite number, got '{cell}' "
        "(as in events, NaN and infinities are refused)"
    ]


def test_a_non_finite_yaml_number_is_refused_with_its_position(tmp_path: Path) -> None:
    path = _csv(tmp_path, "- {device_id: m1, max_temp: .inf}\n- {device_id: m2, max_temp: .nan}\n", "d.yaml")
    problems = _problems(path)
    assert [p.split(": column")[0] for p in problems] == [f"{path}:1:29", f"{path}:2:29"]
    assert all("'max_temp' must be a finite number" in p for p in problems)


def test_rows_given_in_code_with_nan_are_refused() -> None:
    with pytest.raises(IngestDecodeError, match="'max_temp' must be a finite number") as err:
        Tables().load_rows("devices", [{"device_id": "m1", "max_temp": math.nan}])
    assert err.value.field == "max_temp"


def test_coordinates_off_the_globe_name_the_file_line_and_column(tmp_path: Path) -> None:
    """``backtest --table`` loaded them, and a geofence rule read NULL for the device."""
    text = "device_id,lat,lon,depot_lat,depot_lon\nm1,90,-180,-90,180\nm2,999,10,,\nm3,1,2,90.0001,-181\n"
    path = _csv(tmp_path, text)
    assert _problems(path) == [
        f"{path}:3: column 'lat' must be within -90..90 (degrees), got float 999.0",
        f"{path}:4: column 'depot_lat' must be within -90..90 (degrees), got float 90.0001",
        f"{path}:4: column 'depot_lon' must be within -180..180 (degrees), got float -181.0",
    ]
    edges = _csv(tmp_path, "device_id,lat,lon,depot_lat,depot_lon\nm1,90,-180,-90,180\n", "edges.csv")
    assert read_table_file("devices", edges) == [
        {"device_id": "m1", "lat": 90.0, "lon": -180.0, "depot_lat": -90.0, "depot_lon": 180.0}
    ]


def test_a_yaml_coordinate_off_the_globe_names_its_position(tmp_path: Path) -> None:
    path = _csv(tmp_path, "- {device_id: m1, lat: 48.1, lon: 200}\n", "d.yaml")
    expected = f"{path}:1:35: column 'lon' must be within -180..180 (degrees), got float 200.0"
    assert _problems(path) == [expected]


def test_a_table_record_off_the_globe_is_refused_naming_the_column() -> None:
    """A ``tables.devices`` record, as the worker applies it: the row it had is kept."""
    tables = Tables()
    tables.apply("devices", "m1", b'{"device_id":"m1","lat":48.1,"lon":11.5}')
    with pytest.raises(IngestDecodeError) as err:
        tables.apply("devices", "m1", b'{"device_id":"m1","lat":-90.5,"lon":11.5}')
    assert err.value.reason == "column 'lat' must be within -90..90 (degrees), got float -90.5"
    assert err.value.field == "lat"
    assert tables.get("devices", "m1") == {"device_id": "m1", "lat": 48.1, "lon": 11.5}
    assert DEVICES.bounds["lat"] is DEVICES.bounds["depot_lat"] is dict(SENSORS.bounds)["lat"]


LONG = "x" * 257


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("m1", b'{"device_id":"m1","max_temp":"hot"}', "column 'max_temp' must be a number, got str \"hot\""),
        ("m1", b'{"device_id":"","site":"lab"}', "column 'device_id' (the key) must be a non-empty string"),
        ("m1", b'{"device_id":"m1","lat":48.1}',
         "column 'lon' is missing: 'lat' and 'lon' go together, give both or neither"),
        ("m1", b'{"device_id":"m1","geofence_km":0.0}',
         "column 'geofence_km' must be above 0 (km), got float 0.0"),
        (LONG, b'{"device_id":"' + LONG.encode() + b'"}',
         "column 'device_id' (the key) is longer than 256 characters"),
        ("m2", b'{"device_id":"m1","site":"lab"}',
         "the record's key 'm2' is not the row's column 'device_id' ('m1')"),
        ("m1", b'{"device_id":"m1","colour":"red"}', "unknown column 'colour' for table devices"),
    ],
)  # fmt: skip
def test_a_table_record_is_refused_as_the_loader_refuses_its_row(key: str, value: bytes, reason: str) -> None:
    """A row another producer wrote on ``tables.devices``, as the worker and the Spark engine
    apply it: refused in the loader's words (a lone coordinate, a fence of 0 km and a key over
    256 characters were taken, and the wrong types said "field"), or for a record key that is
    not the row's (its tombstone would leave the row in place). The row it had is kept."""
    tables = Tables()
    before = None if key == LONG else {"device_id": key, "site": "before"}
    if before is not None:
        tables.apply("devices", key, orjson.dumps(before))
    with pytest.raises(IngestDecodeError) as err:
        tables.apply("devices", key, value)
    assert err.value.reason == reason
    assert tables.get("devices", key) == before
    line = refused_row("tables.devices", 0, 7, err.value)
    kept = "the table keeps its earlier one"
    assert line == f"refused a row of tables.devices (partition 0, offset 7), {kept}: {reason}"
    assert "not a JSON row" in refused_row("tables.devices", 0, 8, ValueError("unexpected character"))


def test_a_repeated_key_names_both_lines(tmp_path: Path) -> None:
    path = _csv(tmp_path, "device_id,max_temp\nm1,50\nm2,60\nm1,99\n")  # the last row won silently
    assert _problems(path) == [
        f"{path}:4: device_id 'm1' is already on line 2; a table file lists each key once"
    ]


def test_a_repeated_key_in_yaml_names_both_lines(tmp_path: Path) -> None:
    path = _csv(tmp_path, "rows:\n  - {device_id: m1}\n  - {device_id: m1, site: b}\n", "d.yaml")
    assert _problems(path) == [
        f"{path}:3:17: device_id 'm1' is already on line 2; a table file lists each key once"
    ]


def test_a_repeated_column_is_named(tmp_path: Path) -> None:
    path = _csv(tmp_path, "device_id,max_temp,max_temp\nm1,50,99\n")  # the last one won silently
    assert _problems(path) == [f"{path}:1: column 'max_temp' appears twice in the header (columns 2 and 3)"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "the file is empty: expected a header naming the columns (e.g. device_id,site,owner)"),
        ("\n\n", "the file is empty: expected a header naming the columns (e.g. device_id,site,owner)"),
    ],
)
def test_an_empty_file_is_an_error(tmp_path: Path, text: str, expected: str) -> None:
    path = _csv(tmp_path, text)  # loaded as an empty table: every event skipped, silently
    assert _problems(path) == [f"{path}:1: {expected}"]


def test_a_header_without_rows_is_an_error(tmp_path: Path) -> None:
    path = _csv(tmp_path, "device_id,max_temp\n")
    assert _problems(path) == [
        f"{path}: no rows (a table file lists the table's rows; an empty table needs no file)"
    ]


def test_an_unknown_column_names_the_file_the_header_line_and_a_close_name(tmp_path: Path) -> None:
    path = _csv(tmp_path, "device_id,max_tmp\nm1,50\n")  # was "unknown column 'max_tmp' for table devices"
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:1: unknown column 'max_tmp' (column 2 of the header); did you mean")
    assert "'max_temp'? expected one of: device_id, site," in problem


def test_rows_with_too_few_or_too_many_fields_say_so(tmp_path: Path) -> None:
    path = _csv(tmp_path, "device_id,max_temp\nm1,50,extra\nm2\nm3,40\n")  # was "unknown column 'None'"
    assert _problems(path) == [
        f"{path}:2: line 2 has 3 fields, the header has 2: field 3 ('extra') has no column",
        f"{path}:3: line 3 has 1 field, the header has 2: no field for 'max_temp'",
    ]


@pytest.mark.parametrize(("sep", "what"), [(";", "';'"), ("\t", "tab")])
def test_a_file_with_another_separator_gets_a_hint(tmp_path: Path, sep: str, what: str) -> None:
    path = _csv(tmp_path, f"device_id{sep}max_temp\nm1{sep}50\n")  # was "field 'device_id' (the key) ..."
    (problem,) = _problems(path)
    header = repr(f"device_id{sep}max_temp")
    assert problem.startswith(f"{path}:1: the header is one column {header}")
    assert f"the file looks {what}-separated" in problem


def test_an_excel_export_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    path = _csv(tmp_path, "\ufeffdevice_id,max_temp\r\nm1,50\r\n,,\r\n".encode())
    assert read_table_file("devices", path) == [{"device_id": "m1", "max_temp": 50.0}]


def test_an_empty_key_names_its_line_and_column(tmp_path: Path) -> None:
    path = _csv(tmp_path, "device_id,max_temp\nm1,50\n,40\n")
    assert _problems(path) == [f"{path}:3: column 'device_id' (the key) is missing or empty"]


def test_every_problem_is_listed_and_nothing_is_loaded(tmp_path: Path) -> None:
    path = _csv(tmp_path, "device_id,max_temp,site\nm1,hot,a\nm2,NaN,b\nm3,1,c\nm3,2,d\n")
    assert [p.split(": ", 1)[0] for p in _problems(path)] == [f"{path}:2", f"{path}:3", f"{path}:5"]


def test_an_unknown_yaml_column_names_its_position(tmp_path: Path) -> None:
    path = _csv(tmp_path, "- device_id: m1\n  max_tmp: 50\n", "d.yaml")
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:2:12: unknown column 'max_tmp'; did you mean 'max_temp'?")


def test_good_rows_load_typed(tmp_path: Path) -> None:
    path = _csv(tmp_path, "device_id, site ,max_temp\nm1, lab ,50\nm2,,\n")
    assert read_table_file("devices", path) == [
        {"device_id": "m1", "site": "lab", "max_temp": 50.0},
        {"device_id": "m2"},
    ]
    assert DEVICES.validate({"device_id": "m1", "max_temp": 1.5}) == {"device_id": "m1", "max_temp": 1.5}


def test_the_registry_loaders_file_with_deleted_rows_loads_without_them(tmp_path: Path) -> None:
    path = _csv(tmp_path, "device_id,max_temp,deleted\nm1,50,\nold,,true\nm2,60,no\n")  # was refused
    assert read_table_file("devices", path) == [
        {"device_id": "m1", "max_temp": 50.0},
        {"device_id": "m2", "max_temp": 60.0},
    ]
    bad = _csv(tmp_path, "device_id,deleted\nm1,maybe\n", "bad.csv")
    assert _problems(bad) == [f"{bad}:2: column 'deleted' must be true or false, got 'maybe'"]
