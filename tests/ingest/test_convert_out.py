"""``python -m ingest convert ... --out FILE``: an output that is the input (the same path, a
symbolic or a hard link) is refused before anything is opened for writing, and the input
kept; an output in a missing directory or onto a directory is one line naming ``--out``.
Each is a usage error, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from ingest.cli import main

NAB = "timestamp,value\n2024-01-01 00:00:00,71.5\n2024-01-01 00:05:00,72.0\n"
ACCESS = (
    '203.0.113.9 - - [01/Jan/2024:00:00:00 +0000] "GET / HTTP/1.1" 200 512 "-" "curl/8"\n'
    '203.0.113.9 - - [01/Jan/2024:00:00:01 +0000] "GET /a HTTP/1.1" 404 0 "-" "curl/8"\n'
)


def _convert(kind: str, path: Path, out: Path) -> int:
    options = ["--device", "d1", "--field", "temperature"] if kind == "nab" else ["--host", "h1"]
    return main(["convert", kind, str(path), *options, "--out", str(out)])


def _input(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / ("nab.csv" if kind == "nab" else "access.log")
    path.write_text(NAB if kind == "nab" else ACCESS)
    return path


@pytest.mark.parametrize("kind", ["nab", "apache"])
@pytest.mark.parametrize("alias", ["same-path", "symlink", "hard-link"])
def test_an_out_that_is_the_input_is_refused_and_the_input_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, alias: str
) -> None:
    path = _input(tmp_path, kind)
    before = path.read_bytes()
    out = path if alias == "same-path" else tmp_path / "out.jsonl"
    if alias == "symlink":
        out.symlink_to(path)
    elif alias == "hard-link":
        os.link(path, out)
    assert _convert(kind, path, out) == 2
    assert capsys.readouterr().err == (
        f"error: --out {out} is the same file as the input {path}: writing it would destroy the "
        "input; give --out another file\n"
    )
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("out", "says"),
    [("missing/x.jsonl", "no such directory {tmp}/missing"), (".", "a directory")],
    ids=["missing-directory", "a-directory"],
)
def test_an_out_it_cannot_write_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, says: str
) -> None:
    path = _input(tmp_path, "nab")
    target = tmp_path / out
    assert _convert("nab", path, target) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {target}: {says.format(tmp=tmp_path)}")
    assert len(err.splitlines()) == 1


def test_a_new_out_is_written_as_before(tmp_path: Path) -> None:
    path = _input(tmp_path, "nab")
    out = tmp_path / "nab.jsonl"
    assert _convert("nab", path, out) == 0
    assert [orjson.loads(line) for line in out.read_bytes().splitlines()] == [
        {"device_id": "d1", "ts": "2024-01-01T00:00:00.000Z", "temperature": 71.5},
        {"device_id": "d1", "ts": "2024-01-01T00:05:00.000Z", "temperature": 72.0},
    ]
