"""NAB CSV converter on the real machine-temperature file and on crafted rows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from app.events import SENSORS
from ingest.adapters import nab_events
from ingest.model import ConvertError, IngestArgError
from tests.conftest import NAB_MACHINE_TEMP, require_dataset


def test_real_file_gives_every_row_in_file_order() -> None:
    path = require_dataset(NAB_MACHINE_TEMP)
    results = list(nab_events(str(path), device="machine-1", field="temperature"))

    assert len(results) == 22_695
    assert not [r for r in results if isinstance(r, ConvertError)]
    assert results[0] == {
        "device_id": "machine-1",
        "ts": "2013-12-02T21:15:00.000Z",
        "temperature": 73.96732207,
    }
    # file line 10151 is results[10149]: the 55-minute jump back is kept, not sorted away
    assert results[10148]["ts"] == "2014-01-07T02:55:00.000Z"
    assert results[10149]["ts"] == "2014-01-07T02:00:00.000Z"
    repeated = [ts for ts, n in Counter(r["ts"] for r in results).items() if n > 1]
    assert len(repeated) == 12


def test_every_real_event_validates_against_the_sensors_schema() -> None:
    path = require_dataset(NAB_MACHINE_TEMP)
    for record in nab_events(str(path), device="m", field="value"):
        assert not isinstance(record, ConvertError)
        event = SENSORS.validate(record)
        assert event.fields == record
        assert set(record) == {"device_id", "ts", "value"}


def test_a_kind_adds_the_reading_as_value_for_the_anomaly_pack(tmp_path: Path) -> None:
    csv = tmp_path / "m.csv"
    csv.write_text("timestamp,value\n2014-01-01 00:00:00,81.5\n")
    (record,) = nab_events(str(csv), device="m", field="temperature", kind="temperature")
    assert record == {
        "device_id": "m", "ts": "2014-01-01T00:00:00.000Z", "temperature": 81.5, "value": 81.5,
        "kind": "temperature",
    }  # fmt: skip
    assert SENSORS.validate(record).fields == record
    with pytest.raises(IngestArgError, match="--kind must name what the series measures"):
        nab_events(str(csv), device="m", field="temperature", kind=" ")


def test_bad_rows_yield_errors_with_line_numbers(tmp_path: Path) -> None:
    csv = tmp_path / "bad.csv"
    csv.write_text(
        "timestamp,value\n"
        "2014-01-01 00:00:00,1.5\n"
        "not-a-time,2\n"
        "2014-01-01 00:10:00,abc\n"
        "2014-01-01 00:15:00,nan\n"
        "2014-01-01 00:20:00\n"
        "\n"
        "2014-01-01 01:00:00+01:00,3\n"
    )
    results = list(nab_events(str(csv), device="d", field="temperature"))
    errors = [r for r in results if isinstance(r, ConvertError)]
    assert [(e.line, e.field) for e in errors] == [
        (3, "ts"),
        (4, "temperature"),
        (5, "temperature"),
        (6, None),
    ]
    assert errors[0].raw == b"not-a-time,2"
    events = [r for r in results if not isinstance(r, ConvertError)]
    assert [e["ts"] for e in events] == ["2014-01-01T00:00:00.000Z", "2014-01-01T00:00:00.000Z"]


def test_wrong_header_is_reported_on_line_one(tmp_path: Path) -> None:
    csv = tmp_path / "h.csv"
    csv.write_text("time,reading\n2014-01-01 00:00:00,1\n")
    results = list(nab_events(str(csv), device="d", field="value"))
    assert isinstance(results[0], ConvertError)
    assert results[0].line == 1
    assert "timestamp,value" in results[0].reason
    assert results[1] == {"device_id": "d", "ts": "2014-01-01T00:00:00.000Z", "value": 1.0}


@pytest.mark.parametrize("field", ["status", "device_id", "nope"])
def test_field_must_be_a_double_of_the_sensors_schema(field: str) -> None:
    with pytest.raises(IngestArgError, match="temperature"):
        nab_events("unused.csv", device="d", field=field)
