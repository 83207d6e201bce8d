"""How both SQLite stores (the alert store and the dispatcher's file) open and write a file.

- One writer process per file: :func:`open_writer` creates the folder and opens the file
  in WAL mode with ``synchronous=FULL`` and autocommit off (``isolation_level=None``), so
  only :func:`transaction` decides what is committed.
- Readers in other processes: :func:`open_reader` opens an existing file read-only
  (``mode=ro`` and ``query_only``) and raises FileNotFoundError, naming the file, when
  there is none yet: a reader never creates a store.
- Every connection waits up to 5 s for another process's lock (``busy_timeout``).
- :func:`transaction` is one ``BEGIN IMMEDIATE`` transaction, committed when its block
  ends and rolled back when the block raises anything (then the exception propagates).
- :func:`create_schema` runs a script of ``;``-separated statements in one transaction
  (``executescript`` would commit outside it).

A connection belongs to the thread that opened it.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: how long a statement waits for another process's lock before SQLite raises "locked"
BUSY_TIMEOUT_MS = 5000


def open_writer(path: Path) -> sqlite3.Connection:
    """The writing connection to ``path`` (created with its folder when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    return conn


def open_reader(path: Path, what: str) -> sqlite3.Connection:
    """A read-only connection to the existing file ``path``; FileNotFoundError
    ``"<what> <path> does not exist yet"`` when there is none."""
    if not path.exists():
        msg = f"{what} {path} does not exist yet"
        raise FileNotFoundError(msg)
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    conn.execute("PRAGMA query_only=ON")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction around the block: committed at its end, rolled
    back (and the exception re-raised) when it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def create_schema(conn: sqlite3.Connection, schema: str) -> None:
    """Run each ``;``-separated statement of ``schema`` in one transaction."""
    with transaction(conn):
        for stmt in filter(str.strip, schema.split(";")):
            conn.execute(stmt)


#: values per ``IN (...)`` list: well under SQLite's limit of bound parameters
IN_CHUNK = 500


def select_in(conn: sqlite3.Connection, sql: str, values: Iterable[Any]) -> list[Any]:
    """The rows of ``sql`` (a SELECT ending in ``IN``, to which the placeholders are added)
    for every value of ``values``, queried a chunk of :data:`IN_CHUNK` values at a time."""
    items = list(values)
    rows: list[Any] = []
    for i in range(0, len(items), IN_CHUNK):
        chunk = items[i : i + IN_CHUNK]
        rows += conn.execute(f"{sql} ({','.join('?' * len(chunk))})", chunk).fetchall()
    return rows
