"""The console's map reads the device registry file: the valid rows, each bad one logged by
file, line and column and left off the map (one bad row emptied the whole map before)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.console.fleet import load_registry
from app.tables import read_table_file, table_file_rows


def write(tmp_path: Path, *rows: str) -> Path:
    path = tmp_path / "fleet-devices.csv"
    path.write_text("device_id,kind,lat,lon\n" + "".join(r + "\n" for r in rows))
    return path


def test_one_bad_row_is_left_off_the_map_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, "v1,vehicle,48.1,11.5", "v2,vehicle,999,11.5", "v3,vehicle,48.2,11.6", "v1,x,1,1")
    caplog.set_level(logging.WARNING)
    rows = load_registry(path)
    assert [r["device_id"] for r in rows] == ["v1", "v3"]
    assert rows[0]["kind"] == "vehicle"  # a repeated key: the first row stands
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert f"{path}:3: column 'lat' must be within -90..90 (degrees), got float 999.0" in warned[0]
    assert f"{path}:5: device_id 'v1' is already on line 2" in warned[1]


def test_a_backtest_still_refuses_the_whole_file(tmp_path: Path) -> None:
    """A backtest's table is a snapshot: a bad row would change its alerts without a word."""
    path = write(tmp_path, "v1,vehicle,48.1,11.5", "v2,vehicle,999,11.5")
    with pytest.raises(ValueError, match=r"must be within -90\.\.90"):
        read_table_file("devices", path)
    assert table_file_rows("devices", path)[0] == [
        {"device_id": "v1", "kind": "vehicle", "lat": 48.1, "lon": 11.5}
    ]


def test_a_missing_or_unreadable_file_shows_no_fleet(tmp_path: Path) -> None:
    assert load_registry(tmp_path / "none.csv") == []
    bad = tmp_path / "fleet-devices.yaml"
    bad.write_text("just: [text")
    assert load_registry(bad) == []
