"""``python -m app backtest`` on bad arguments and damaged input: an ``--out`` that would destroy
an input or cannot be written, a reversed ``--from``/``--to``, a ``--partitions`` below 1 and a
corrupt ``.gz`` are refused with one line naming them (exit 2), never a traceback or a silent
"0 events"; late events and the invalid lines past the first 50 are counted in the summary."""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from app.backtest import TimeRange
from app.cli.main import main

RULE = """
rules:
  - id: hot
    source: sensors
    where: temperature > 50
    group_by: [device_id]
"""

#: a tumbling window of one minute and no allowed lateness: the third event (00:01:30) comes
#: after the clock passed 00:03, so its window has closed: it is late
WINDOW = """
rules:
  - id: w
    source: sensors
    window: {type: tumbling, size: 1m}
    aggregate: {n: count(*)}
    having: n >= 1
    group_by: [device_id]
"""
LATE = [
    {"device_id": "m1", "ts": "2024-01-01T00:00:00Z", "temperature": 10},
    {"device_id": "m1", "ts": "2024-01-01T00:03:00Z", "temperature": 96},
    {"device_id": "m1", "ts": "2024-01-01T00:01:30Z", "temperature": 97},
    {"device_id": "m1", "ts": "2024-01-01T00:04:30Z", "temperature": 97},
]


def _jsonl(rows: list[dict[str, object]]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def _events(n: int = 12) -> bytes:
    return _jsonl(
        [{"device_id": "m1", "ts": f"2024-01-01T00:{m:02d}:00Z", "temperature": 90 + m} for m in range(n)]
    )


def _files(tmp_path: Path, rule: str = RULE, events: bytes | None = None) -> tuple[Path, Path]:
    rules = tmp_path / "r.yaml"
    rules.write_text(rule)
    path = tmp_path / "events.jsonl"
    path.write_bytes(_events() if events is None else events)
    return rules, path


def _backtest(rules: Path, path: Path, *extra: str) -> int:
    return main(["backtest", "--rules", str(rules), "--input", str(path), *extra])


def _same(path: Path) -> Path:
    return path


def _symlink(path: Path) -> Path:
    link = path.with_name("link.jsonl")
    link.symlink_to(path)
    return link


def _hardlink(path: Path) -> Path:
    link = path.with_name("hard.jsonl")
    os.link(path, link)
    return link


@pytest.mark.parametrize("engine", ["faust", "spark"])
@pytest.mark.parametrize("alias", [_same, _symlink, _hardlink], ids=["same-path", "symlink", "hard-link"])
def test_an_out_that_is_the_input_is_refused_and_the_input_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], alias: Callable[[Path], Path], engine: str
) -> None:
    rules, path = _files(tmp_path)
    before = path.read_bytes()
    out = alias(path)
    assert _backtest(rules, path, "--out", str(out), "--engine", engine) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: --out {out} is the same file as --input {path}: writing it would destroy the input; "
        "give --out another file\n"
    )
    assert path.read_bytes() == before


@pytest.mark.parametrize("which", ["rules", "table"])
def test_an_out_that_is_a_rule_file_or_a_table_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    rules, path = _files(tmp_path)
    table = tmp_path / "devices.csv"
    table.write_text("device_id,site\nm1,a\n")
    target = {"rules": rules, "table": table}[which]
    before = target.read_bytes()
    code = _backtest(rules, path, "--table", f"devices={table}", "--out", str(target))
    assert code == 2
    assert f"error: --out {target} is the same file as --{which} {target}" in capsys.readouterr().err
    assert target.read_bytes() == before


@pytest.mark.parametrize(
    ("out", "says"),
    [("missing/out.jsonl", "no such directory {tmp}/missing"), (".", "a directory")],
    ids=["missing-directory", "a-directory"],
)
def test_an_out_it_cannot_write_is_a_usage_error_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, says: str
) -> None:
    rules, path = _files(tmp_path)
    target = tmp_path / out
    assert _backtest(rules, path, "--out", str(target)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {target}: {says.format(tmp=tmp_path)}")
    assert len(err.splitlines()) == 1  # one line, no traceback and no summary
    assert not (tmp_path / "missing").exists()


def test_from_not_before_to_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules, path = _files(tmp_path)
    later, earlier = "2025-01-01T00:00:00Z", "2024-01-01T00:00:00Z"
    assert _backtest(rules, path, "--from", later, "--to", earlier) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --from {later} is not before --to {earlier}")
    with pytest.raises(ValueError, match="is not before --to"):
        TimeRange.of(later, later)  # [t, t) holds no time either


@pytest.mark.parametrize("given", ["0", "-2", "two"])
def test_partitions_below_one_are_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: str
) -> None:
    rules, path = _files(tmp_path)
    with pytest.raises(SystemExit) as exited:
        _backtest(rules, path, f"--partitions={given}")
    assert exited.value.code == 2
    assert "argument --partitions: " in capsys.readouterr().err


def test_a_gz_corrupt_inside_its_stream_gives_the_summary_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """50 bytes zeroed at offset 200 of the deflate stream: zlib's "invalid distance too far
    back" (or another zlib.error), which used to escape as a traceback with exit 1."""
    packed = bytearray(gzip.compress(_events(600)))
    packed[200:250] = bytes(50)
    rules, _ = _files(tmp_path)
    path = tmp_path / "corrupt.jsonl.gz"
    path.write_bytes(bytes(packed))
    assert _backtest(rules, path, "--out", str(tmp_path / "out.jsonl")) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-2].startswith("backtest: ") and " events, " in err[-2]
    assert err[-1].startswith(f"error: --input {path}: unreadable after line ")
    assert "decompressing data" in err[-1]


def test_late_events_are_counted_in_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules, path = _files(tmp_path, WINDOW, _jsonl(LATE))
    assert _backtest(rules, path, "--statuses", "all", "--out", str(tmp_path / "out.jsonl")) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "backtest: 1 late event not used by a rule (past its allowed_lateness, or older than "
        "its group's newest; once per rule: docs/rules.md)",
        "backtest: 4 events, 3 alert transitions, 0 invalid lines skipped",
    ]


def test_no_late_line_when_no_event_is_late(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules, path = _files(tmp_path, WINDOW, _jsonl(sorted(LATE, key=lambda r: str(r["ts"]))))
    assert _backtest(rules, path, "--out", str(tmp_path / "out.jsonl")) == 0
    assert capsys.readouterr().err == "backtest: 4 events, 3 alert transitions, 0 invalid lines skipped\n"


def test_the_invalid_lines_past_the_first_50_are_counted_in_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = [{"device_id": "m1", "ts": f"2024-01-01T00:00:{s % 60:02d}Z", "temprature": 1} for s in range(120)]
    rules, path = _files(tmp_path, events=_jsonl(bad))
    assert _backtest(rules, path, "--out", str(tmp_path / "out.jsonl")) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1] for line in err[:50]] == [str(n) for n in range(1, 51)]
    assert err[50:] == [
        "backtest: ... and 70 more not shown (the first 50 are named above)",
        "backtest: 0 events, 0 alert transitions, 120 invalid lines skipped",
    ]
