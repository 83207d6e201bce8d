"""The backtest's ``--input``: plain JSON lines, ``.gz`` or ``.bz2`` (which Spark's text reader
decompresses too), and a clear error, exit 2, for a file it cannot read, never a traceback."""

from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import orjson
import pytest

from app.cli.main import main
from tests.rules.helpers import HOT, sensor

TEMPS = [("d1", 80.0), ("d2", 105.0), ("d1", 101.0), ("d2", 96.0), ("d1", 70.0)] * 40


def _files(tmp_path: Path) -> tuple[Path, bytes]:
    rules = tmp_path / "r.yaml"
    rules.write_text("rules:\n" + HOT)
    events = [sensor(minute, temp, device) for minute, (device, temp) in enumerate(TEMPS)]
    return rules, b"".join(orjson.dumps(e.fields) + b"\n" for _, e in events) + b"{broken\n"


def _run(rules: Path, path: Path, out: Path) -> int:
    return main(["backtest", "--rules", str(rules), "--input", str(path), "--out", str(out)])


def test_gz_and_bz2_input_give_the_plain_files_lines_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules, data = _files(tmp_path)
    outputs = {}
    for name, packed in [
        ("e.jsonl", data),
        ("e.jsonl.gz", gzip.compress(data)),
        ("e.jsonl.bz2", bz2.compress(data)),
    ]:
        path = tmp_path / name
        path.write_bytes(packed)
        assert _run(rules, path, tmp_path / f"{name}.out") == 0
        err = capsys.readouterr().err
        summary = err.splitlines()[-1]
        assert f"{path}:201: not valid JSON" in err
        outputs[name] = ((tmp_path / f"{name}.out").read_text(), summary)
    assert len(outputs["e.jsonl"][0].splitlines()) == 160
    assert outputs["e.jsonl"][1] == "backtest: 200 events, 160 alert transitions, 1 invalid lines skipped"
    assert outputs["e.jsonl.gz"] == outputs["e.jsonl.bz2"] == outputs["e.jsonl"]


def test_a_damaged_gz_keeps_the_lines_before_the_damage_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules, data = _files(tmp_path)
    packed = gzip.compress(data)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(packed[: len(packed) // 2])
    assert _run(rules, path, tmp_path / "out.jsonl") == 2
    err = capsys.readouterr().err
    assert f"error: --input {path}: unreadable after line " in err
    assert "Compressed file ended before the end-of-stream marker was reached" in err
    written = (tmp_path / "out.jsonl").read_text().splitlines()
    assert 0 < len(written) < 160  # what was read before the damage, and said so
    assert err.splitlines()[-2].startswith("backtest: ")


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("missing.jsonl", "no such file"),
        ("adir", "a directory, not a file of JSON lines"),
        ("e.jsonl.zst", "compressed as .zst; a backtest reads JSON lines, plain, .gz or .bz2"),
    ],
)
def test_an_input_it_cannot_read_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, says: str
) -> None:
    rules, data = _files(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "e.jsonl.zst").write_bytes(data)
    out = tmp_path / "out.jsonl"
    assert _run(rules, tmp_path / name, out) == 2
    assert capsys.readouterr().err == f"error: --input {tmp_path / name}: {says}\n"
    assert not out.exists()
