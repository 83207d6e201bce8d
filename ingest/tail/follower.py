"""Follow one log file by polling: lines with positions, across rotation and truncation.

:class:`Follower` is synchronous and does no waiting: :meth:`Follower.poll`
returns the complete lines written since the last call (possibly none), each
with the :class:`~ingest.tail.state.Position` just after it. The caller sleeps
between polls. No inotify: it works the same on every file system.

While running it handles:

- **rotation by rename** (``access.log`` -> ``access.log.1``, new
  ``access.log``): the old file is read to its end, and once it has been quiet
  for ``rotate_wait_s`` (a writer may still append before it reopens), its last
  unterminated line is released and the new file is read from byte 0;
- **truncation** (``copytruncate``): the size drops below the read offset or
  the first bytes change. Lines written after our last read but before the
  copy are recovered from the copy (a file in the same directory with the same
  first bytes), then the file is read again from byte 0.

:meth:`Follower.resume` continues from a saved position. When the file at the
path is no longer the saved one (rotated while stopped), the saved file is
looked up in the same directory by inode (rename) or by its first bytes
(copytruncate copy), read from the saved offset to its end, and then the
current file from byte 0. If it cannot be found (deleted, compressed), a
warning says so and the lines after the saved offset are lost.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ingest.tail.state import HEAD_BYTES, FileId, Position, fingerprint, head_matches

logger = logging.getLogger(__name__)

StartAt = Literal["beginning", "end"]


@dataclass(frozen=True, slots=True)
class Line:
    """One line without its ending, where it starts, and the position after it."""

    raw: bytes
    path: str
    start: int
    pos: Position


@dataclass
class _Open:
    path: str
    fd: int
    file: FileId
    offset: int  # bytes read so far, unterminated tail included
    line_offset: int  # just after the last complete line
    partial: bytearray = field(default_factory=bytearray)


class Follower:
    """Reads ``path``; see the module docstring. Not thread-safe; :meth:`close` when done."""

    def __init__(
        self,
        path: str,
        *,
        start_at: StartAt = "beginning",
        rotate_wait_s: float = 1.0,
        chunk_bytes: int = 256 * 1024,
        max_line_bytes: int = 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = os.path.abspath(path)
        self._dir = os.path.dirname(self.path)
        self._stem = os.path.basename(self.path).split(".")[0]
        self._start_at, self._rotate_wait_s = start_at, rotate_wait_s
        self._chunk, self._max_line = chunk_bytes, max_line_bytes
        self._clock = clock
        self._cur: _Open | None = None
        self._backlog: list[_Open] = []
        self._rotation_seen: float | None = None
        self.rotations = self.truncations = 0

    def resume(self, saved: Position | None) -> None:
        """Open the file(s) to read, from ``saved`` or from ``start_at`` without one."""
        if saved is None:
            self._cur = self._open(self.path, at_end=self._start_at == "end")
            return
        st = _stat(self.path)
        if st is not None and saved.file.same_file(st):
            cur = self._open(self.path, at_end=False)
            if cur is not None and head_matches(cur.fd, saved.file) and st.st_size >= saved.offset:
                cur.offset = cur.line_offset = saved.offset
                self._cur = cur
                return
            self._recover(saved, "was truncated or rewritten while stopped")
            self._cur = cur
            return
        self._recover(saved, "was rotated while stopped")
        self._cur = self._open(self.path, at_end=False)

    def poll(self) -> list[Line]:
        """The complete lines available now, in order (empty when there are none)."""
        if self._backlog:
            old = self._backlog[0]
            lines = self._read(old)
            if not lines:
                lines = self._finish(old)
                self._backlog.pop(0)
            return lines
        if self._cur is None:
            self._cur = self._open(self.path, at_end=False)
            if self._cur is None:
                return []
        cur = self._cur
        if self._truncated(cur):
            return []
        lines = self._read(cur)
        if lines:
            self._rotation_seen = None
            return lines
        st = _stat(self.path)
        if st is not None and cur.file.same_file(st):
            return []
        now = self._clock()
        if self._rotation_seen is None:
            self._rotation_seen = now
        if now - self._rotation_seen < self._rotate_wait_s:
            return []
        self._rotation_seen = None
        self.rotations += 1
        logger.info("%s was rotated; finished the old file, now reading the new one", self.path)
        lines = self._finish(cur)
        self._cur = self._open(self.path, at_end=False) if st is not None else None
        return lines

    def close(self) -> None:
        for f in [*self._backlog, *([self._cur] if self._cur else [])]:
            os.close(f.fd)
        self._backlog, self._cur = [], None

    def _open(self, path: str, *, at_end: bool) -> _Open | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        st = os.fstat(fd)
        offset = st.st_size if at_end else 0
        return _Open(path, fd, FileId(st.st_dev, st.st_ino, *fingerprint(fd)), offset, offset)

    def _recover(self, saved: Position, why: str) -> None:
        """Queue the saved file, found again in the directory, from the saved offset."""
        found = self._find(saved.file, saved.offset, exclude=self.path)
        if found is None:
            logger.warning(
                "%s %s and the file of the saved position (inode %d) is gone: "
                "lines written to it after byte %d were not read",
                self.path, why, saved.file.inode, saved.offset,
            )  # fmt: skip
            return
        found.offset = found.line_offset = saved.offset
        logger.info("%s %s: finishing %s from byte %d first", self.path, why, found.path, saved.offset)
        self._backlog.append(found)

    def _find(self, file: FileId, min_size: int, exclude: str) -> _Open | None:
        """A file of this directory that is ``file`` (same inode, else same first
        bytes: a copy) and holds at least ``min_size`` bytes."""
        candidates: list[tuple[int, str]] = []
        with os.scandir(self._dir) as entries:
            for entry in entries:
                if entry.path == exclude or not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
                if st.st_size < min_size:
                    continue
                if file.same_file(st):
                    candidates.insert(0, (0, entry.path))
                elif entry.name.startswith(self._stem):
                    candidates.append((1, entry.path))
        for _rank, path in sorted(candidates):
            opened = self._open(path, at_end=False)
            if opened is not None and head_matches(opened.fd, file):
                return opened
            if opened is not None:
                os.close(opened.fd)
        return None

    def _truncated(self, cur: _Open) -> bool:
        """Detect truncation of the current file; when so, recover and restart at 0."""
        size = os.fstat(cur.fd).st_size
        if size >= cur.offset and head_matches(cur.fd, cur.file):
            if cur.file.head_len < HEAD_BYTES and size > cur.file.head_len:
                cur.file = FileId(cur.file.dev, cur.file.inode, *fingerprint(cur.fd))
            return False
        self.truncations += 1
        copy = self._find(cur.file, cur.line_offset, exclude=self.path)
        if copy is not None:
            copy.offset = copy.line_offset = cur.line_offset
            self._backlog.append(copy)
        logger.info(
            "%s was truncated at byte %d; %s, then reading it from byte 0",
            self.path, cur.line_offset, f"finishing the copy {copy.path}" if copy else "no copy found",
        )  # fmt: skip
        cur.offset = cur.line_offset = 0
        cur.partial.clear()
        cur.file = FileId(cur.file.dev, cur.file.inode, *fingerprint(cur.fd))
        return True

    def _read(self, f: _Open) -> list[Line]:
        data = os.pread(f.fd, self._chunk, f.offset)
        if not data:
            return []
        f.offset += len(data)
        if f.file.head_len < HEAD_BYTES and f.line_offset < HEAD_BYTES:
            f.file = FileId(f.file.dev, f.file.inode, *fingerprint(f.fd))
        pieces = (bytes(f.partial) + data).split(b"\n")
        f.partial = bytearray(pieces.pop())
        lines = []
        for piece in pieces:
            end = f.line_offset + len(piece) + 1
            lines.append(Line(piece.removesuffix(b"\r"), f.path, f.line_offset, Position(f.file, end)))
            f.line_offset = end
        if len(f.partial) > self._max_line:
            lines.extend(self._finish_partial(f))
        return lines

    def _finish_partial(self, f: _Open) -> list[Line]:
        if not f.partial:
            return []
        end = f.line_offset + len(f.partial)
        line = Line(bytes(f.partial).removesuffix(b"\r"), f.path, f.line_offset, Position(f.file, end))
        f.line_offset = end
        f.partial.clear()
        return [line]

    def _finish(self, f: _Open) -> list[Line]:
        lines = self._finish_partial(f)
        os.close(f.fd)
        return lines


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
