"""``backtest --from/--to``: the events in the range, and the invalid lines the range places
there (:class:`app.backtest.TimeRange`), counted and named; the others are outside it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from app.backtest import TimeRange
from app.cli.main import main
from app.errors import IngestDecodeError

RULE = """
rules:
  - id: hot
    source: sensors
    where: temperature > 30
    group_by: [device_id]
"""


def test_the_range_counts_the_invalid_lines_it_places_in_it_and_no_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE)
    lines = [
        {"device_id": "d", "ts": "2024-01-01T00:30:00Z", "temperature": 40.0},  # before the range
        {"device_id": "d", "ts": "2024-01-01T01:30:00Z", "temperature": 40.0},
        {"device_id": "e", "ts": "2024-01-01T00:30:00Z", "temperature": "hot"},  # line 3: before it
        {"device_id": "e", "ts": "2024-01-01T01:45:00Z", "temperature": "hot"},  # line 4: in it
        {"device_id": "e", "ts": "2024-01-01T01:50:00", "temperature": 1.0},  # line 5: no time it reads
    ]
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines) + b"{broken\n")  # line 6: no time
    out = tmp_path / "out.jsonl"
    argv = ["backtest", "--rules", str(rules), "--input", str(events), "--out", str(out)]
    code = main([*argv, "--from", "2024-01-01T01:00:00Z", "--to", "2024-01-01T02:00:00Z"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "1 events, 1 alert transitions, 3 invalid lines skipped" in err
    named = sorted(line.split(":")[1] for line in err.splitlines() if line.startswith(str(events)))
    assert named == ["4", "5", "6"]


def test_a_time_range_is_half_open_and_a_record_with_no_time_is_in_every_one() -> None:
    within = TimeRange.of("2024-01-01T01:00:00Z", "2024-01-01T02:00:00Z")
    assert [within.holds(t) for t in (within.lo, within.hi, within.hi - 1, within.lo - 1, None)] == [
        True, False, True, False, True,
    ]  # fmt: skip
    assert TimeRange().holds(0)
    with pytest.raises(IngestDecodeError, match="--to"):
        TimeRange.of(None, "tomorrow")
