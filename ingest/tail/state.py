"""The tailer's persisted position: which file, how far, written atomically.

A file is identified by ``(dev, inode)`` plus a fingerprint of its first
bytes (:data:`HEAD_BYTES` at most: ``head_len`` and their SHA-256), so a file
deleted and re-created with a recycled inode, or truncated and rewritten, is
not mistaken for the one we were reading. ``offset`` is the byte just after
the last line whose event the broker acknowledged.

The state file is one JSON object (``version`` 1)::

    {"version": 1, "path": "/var/log/app/access.log", "dev": 2049, "inode": 1837201,
     "offset": 53211, "head_len": 128, "head_sha256": "9f2c...", "updated_at": "2026-11-21T10:00:00.000Z"}

:func:`save_state` writes a temporary file in the same directory, fsyncs it
and renames it over the old one, so a crash leaves either the old or the new
state, never a torn one. A state file that cannot be read is an error (the
operator decides), not a silent restart from zero.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from app.errors import ConfigError
from app.events import format_ts
from app.runtime.statefile import read_json, write_json

logger = logging.getLogger(__name__)

HEAD_BYTES = 128
VERSION = 1


class TailStateError(ConfigError):
    """The state file exists but is not a state this version can use."""


@dataclass(frozen=True, slots=True)
class FileId:
    """Identity of one file: device, inode and the fingerprint of its head."""

    dev: int
    inode: int
    head_len: int
    head_sha256: str

    def same_file(self, st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino) == (self.dev, self.inode)


@dataclass(frozen=True, slots=True)
class Position:
    """A byte offset in an identified file: just after a line ending."""

    file: FileId
    offset: int


def fingerprint(fd: int, length: int = HEAD_BYTES) -> tuple[int, str]:
    """``(head_len, sha256 hex)`` of the first ``length`` bytes of an open file."""
    head = os.pread(fd, length, 0)
    return len(head), hashlib.sha256(head).hexdigest()


def head_matches(fd: int, file: FileId) -> bool:
    """True when the open file starts with the bytes ``file`` was fingerprinted on."""
    if file.head_len == 0:
        return True
    return fingerprint(fd, file.head_len) == (file.head_len, file.head_sha256)


def load_state(path: Path) -> Position | None:
    """The saved position, or None when there is no state file yet."""
    data = read_json(path, "the tail state", "fix or delete it to start over", TailStateError)
    if data is None:
        return None
    try:
        if data["version"] != VERSION:
            msg = f"{path}: state version {data['version']!r}, expected {VERSION}"
            raise TailStateError(msg)
        file = FileId(int(data["dev"]), int(data["inode"]), int(data["head_len"]), str(data["head_sha256"]))
        return Position(file, int(data["offset"]))
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"{path}: the tail state lacks or mistypes {exc}; fix or delete it to start over"
        raise TailStateError(msg) from None


def save_state(path: Path, log_path: str, pos: Position, now_ms: int) -> None:
    """Atomically replace ``path`` with ``pos`` (temp file, fsync, rename, fsync dir)."""
    record = {"version": VERSION, "path": log_path, **asdict(pos.file), "offset": pos.offset}
    record["updated_at"] = format_ts(now_ms)
    write_json(path, record)
