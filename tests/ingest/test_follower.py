"""The file follower on real files: rotation, truncation, resume. The clock is injected."""

from __future__ import annotations

import os
from pathlib import Path

from ingest.tail.follower import Follower, Line
from ingest.tail.state import Position, load_state, save_state


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _lines(n0: int, n1: int) -> str:
    return "".join(f"line {i} {'x' * 40}\n" for i in range(n0, n1))


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def _drain(follower: Follower, clock: Clock, polls: int = 20) -> list[Line]:
    """Poll until quiet, advancing the clock past the rotate wait."""
    out: list[Line] = []
    for _ in range(polls):
        out += follower.poll()
        clock.now += 1.0
    return out


def _numbers(lines: list[Line]) -> list[int]:
    return [int(line.raw.split()[1]) for line in lines]


def test_reads_complete_lines_and_holds_a_partial_one(tmp_path: Path) -> None:
    log, clock = tmp_path / "app.log", Clock()
    log.write_text(_lines(0, 3) + "line 3 par")
    f = Follower(str(log), clock=clock)
    f.resume(None)
    lines = _drain(f, clock)
    assert _numbers(lines) == [0, 1, 2]
    assert lines[-1].pos.offset == len(_lines(0, 3))
    _append(log, "tial\n")
    assert [line.raw for line in f.poll()] == [b"line 3 partial"]
    f.close()


def test_rotation_by_rename_finishes_the_old_file_first(tmp_path: Path) -> None:
    log, clock = tmp_path / "app.log", Clock()
    log.write_text(_lines(0, 5))
    f = Follower(str(log), rotate_wait_s=0.5, clock=clock)
    f.resume(None)
    got = _drain(f, clock)
    _append(log, _lines(5, 8) + "line 8 unterminated")
    os.rename(log, tmp_path / "app.log.1")
    log.write_text(_lines(9, 12))
    got += _drain(f, clock)
    assert _numbers(got) == list(range(12))
    assert f.rotations == 1
    f.close()


def test_copytruncate_recovers_lines_from_the_copy(tmp_path: Path) -> None:
    log, clock = tmp_path / "app.log", Clock()
    log.write_text(_lines(0, 5))
    f = Follower(str(log), clock=clock)
    f.resume(None)
    got = _drain(f, clock)
    _append(log, _lines(5, 7))  # written, not yet read, when logrotate copies and truncates
    (tmp_path / "app.log.1").write_bytes(log.read_bytes())
    log.write_text("")
    _append(log, _lines(7, 9))
    got += _drain(f, clock)
    assert _numbers(got) == list(range(9))
    assert f.truncations == 1
    f.close()


def test_truncation_and_rewrite_larger_is_detected_by_the_first_bytes(tmp_path: Path) -> None:
    log, clock = tmp_path / "app.log", Clock()
    log.write_text(_lines(0, 2))
    f = Follower(str(log), clock=clock)
    f.resume(None)
    got = _drain(f, clock)
    with open(log, "w") as w:  # same inode, new content longer than what was read
        w.write(_lines(100, 110))
    got += _drain(f, clock)
    assert _numbers(got) == [0, 1, *range(100, 110)]
    f.close()


def test_resume_from_a_saved_position(tmp_path: Path) -> None:
    log, clock, state = tmp_path / "app.log", Clock(), tmp_path / "state.json"
    log.write_text(_lines(0, 4))
    f = Follower(str(log), clock=clock)
    f.resume(None)
    got = _drain(f, clock)
    save_state(state, str(log), got[1].pos, 0)
    f.close()
    saved = load_state(state)
    assert saved == got[1].pos
    again = Follower(str(log), clock=clock)
    again.resume(saved)
    assert _numbers(_drain(again, clock)) == [2, 3]
    again.close()


def test_rotated_while_stopped_is_found_by_inode(tmp_path: Path) -> None:
    log, clock = tmp_path / "app.log", Clock()
    log.write_text(_lines(0, 3))
    f = Follower(str(log), clock=clock)
    f.resume(None)
    saved: Position = _drain(f, clock)[-1].pos
    f.close()
    _append(log, _lines(3, 5))
    os.rename(log, tmp_path / "app.log.1")
    os.rename(tmp_path / "app.log.1", tmp_path / "app.log.2")  # rotated twice
    log.write_text(_lines(5, 7))
    again = Follower(str(log), clock=clock)
    again.resume(saved)
    assert _numbers(_drain(again, clock)) == [3, 4, 5, 6]
    again.close()


def test_a_deleted_rotated_file_means_starting_the_new_one(tmp_path: Path) -> None:
    log, clock = tmp_path / "app.log", Clock()
    log.write_text(_lines(0, 3))
    f = Follower(str(log), clock=clock)
    f.resume(None)
    saved = _drain(f, clock)[-1].pos
    f.close()
    log.unlink()
    log.write_text(_lines(3, 4))
    again = Follower(str(log), clock=clock)
    again.resume(saved)
    assert _numbers(_drain(again, clock)) == [3]
    again.close()


def test_start_at_end_and_a_file_that_appears_later(tmp_path: Path) -> None:
    log, clock = tmp_path / "app.log", Clock()
    log.write_text(_lines(0, 3))
    f = Follower(str(log), start_at="end", clock=clock)
    f.resume(None)
    _append(log, _lines(3, 4))
    assert _numbers(_drain(f, clock)) == [3]
    f.close()
    later = tmp_path / "later.log"
    g = Follower(str(later), clock=clock)
    g.resume(None)
    assert g.poll() == []
    later.write_text(_lines(0, 2))
    assert _numbers(_drain(g, clock)) == [0, 1]
    g.close()


def test_copytruncate_while_stopped_finishes_the_copy_from_the_saved_offset(tmp_path: Path) -> None:
    log, clock = tmp_path / "app.log", Clock()
    log.write_text(_lines(0, 3))
    f = Follower(str(log), clock=clock)
    f.resume(None)
    saved = _drain(f, clock)[-1].pos
    f.close()
    _append(log, _lines(3, 6))
    (tmp_path / "app.log-20240101").write_bytes(log.read_bytes())  # the copy
    with open(log, "w") as w:  # truncated in place, same inode, then new lines
        w.write(_lines(6, 7))
    again = Follower(str(log), clock=clock)
    again.resume(saved)
    assert _numbers(_drain(again, clock)) == [3, 4, 5, 6]
    again.close()
