"""Device registry and watchlists: validation of CSV/YAML files, and tables on the real broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from app import topics
from app.runtime.settings import Settings
from ingest.model import IngestArgError
from ingest.registry.load import load_rows
from ingest.registry.model import TABLES
from ingest.registry.publish import load_table, read_table
from tests.kafka_helpers import consume

DEVICES = TABLES["devices"]
CSV = """device_id,site,owner,lat,lon,depot_lat,depot_lon,geofence_km,max_temp,battery_min,deleted
sensor-001,site-1,plant-ops,48.1,11.5,,,,30.5,,
vehicle-01,depot,logistics,,,48.2,11.6,5,,20,
old-device,,,,,,,,,,true
"""


def test_csv_rows_become_records_with_thresholds_and_tombstones(tmp_path: Path) -> None:
    path = tmp_path / "devices.csv"
    path.write_text(CSV)
    records = load_rows(path, DEVICES)
    assert [(r.key, r.line) for r in records] == [("sensor-001", 2), ("vehicle-01", 3), ("old-device", 4)]
    assert orjson.loads(records[0].value or b"") == {
        "device_id": "sensor-001", "site": "site-1", "owner": "plant-ops", "lat": 48.1, "lon": 11.5,
        "max_temp": 30.5,
    }  # fmt: skip
    assert orjson.loads(records[1].value or b"")["battery_min"] == 20.0
    assert records[2].value is None


def test_every_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text(
        "devices:\n"
        "  - device_id: a\n"
        "    lat: 95\n"
        "    lon: 1\n"
        "  - device_id: b\n"
        "    depot_lat: 48\n"
        "  - device_id: c\n"
        "    colour: red\n"
        "  - device_id: d\n"
        "    max_temp: hot\n"
        "  - device_id: a\n"
    )
    with pytest.raises(IngestArgError) as err:
        load_rows(path, DEVICES)
    lines = str(err.value).splitlines()
    assert lines == [
        f"{path}:3:10: column 'lat' must be within -90..90 (degrees), got float 95.0",
        f"{path}:5:5: column 'depot_lon' is missing: 'depot_lat' and 'depot_lon' go together, "
        "give both or neither",
        f"{path}:8:13: unknown column 'colour'; expected one of: " + ", ".join(DEVICES.schema.file_columns()),
        f"{path}:10:15: column 'max_temp' must be a number, got 'hot'",
        f"{path}:11:16: device_id 'a' is already on line 2; a table file lists each key once",
    ]


def test_watchlists_are_keyed_by_symbol(tmp_path: Path) -> None:
    path = tmp_path / "watch.yaml"
    path.write_text(
        "- symbol: AAPL\n  list: tech\n  max_trade_amount: 1000000\n- symbol: IBM\n  deleted: yes\n"
    )
    records = load_rows(path, TABLES["watchlists"])
    assert [r.key for r in records] == ["AAPL", "IBM"]
    assert orjson.loads(records[0].value or b"") == {
        "symbol": "AAPL",
        "list": "tech",
        "max_trade_amount": 1e6,
    }
    assert records[1].value is None


def test_every_published_row_is_one_the_core_table_schema_accepts(tmp_path: Path) -> None:
    from app.tables import Tables

    path = tmp_path / "devices.csv"
    path.write_text(CSV)
    tables = Tables()
    for record in load_rows(path, DEVICES):
        tables.apply("devices", record.key, record.value)
    assert tables.keys("devices") == ["sensor-001", "vehicle-01"]
    vehicle = {"device_id": "vehicle-01", "site": "depot", "owner": "logistics", "depot_lat": 48.2}
    vehicle.update({"depot_lon": 11.6, "geofence_km": 5.0, "battery_min": 20.0})
    assert tables.get("devices", "vehicle-01") == vehicle


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_load_delete_and_prune_on_the_compacted_topic(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "devices.csv"
    path.write_text(CSV)
    first = asyncio.run(load_table(settings, DEVICES, load_rows(path, DEVICES), deletes=["ghost"]))
    assert (first.upserted, first.deleted, first.failed) == (2, 2, 0)
    assert set(asyncio.run(read_table(settings, topics.DEVICES_TABLE))) == {"sensor-001", "vehicle-01"}

    path.write_text("device_id,site\nvehicle-01,depot-2\nsensor-002,site-1\n")
    second = asyncio.run(load_table(settings, DEVICES, load_rows(path, DEVICES), prune=True))
    assert (second.upserted, second.deleted) == (2, 1)
    table = asyncio.run(read_table(settings, topics.DEVICES_TABLE))
    assert table == {
        "vehicle-01": {"device_id": "vehicle-01", "site": "depot-2"},
        "sensor-002": {"device_id": "sensor-002", "site": "site-1"},
    }
    records = consume(settings.bootstrap_servers, topics.DEVICES_TABLE, min_count=7)
    tombstones = [r.key for r in records if r.value is None]
    assert tombstones == [b"old-device", b"ghost", b"sensor-001"]
