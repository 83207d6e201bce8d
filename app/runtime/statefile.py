"""Small JSON state files: the ingest commands' (a tailer's position, a run's progress) and
the Spark engine's (the sink's batch marker, a checkpoint's layout record).

:func:`write_json` replaces a file atomically and durably: a temporary file in the same
directory, fsync, rename over the old one, fsync of the directory. A crash leaves the old
or the new file, never a torn one; the temporary file is the writer's own (its name holds
the process id), so processes that write one file at once each replace it whole.
:func:`read_json` reads one back: None when there is no file, and an error naming the file
when it cannot be read or is not JSON (the operator decides; never a silent restart from
zero).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

logger = logging.getLogger(__name__)


def write_json(path: Path, record: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``record`` as one JSON line; see the module docstring."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(record) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json(path: Path, what: str, remedy: str, error: Callable[[str], Exception]) -> Any:
    """The JSON value in ``path``, or None when there is no file. When the file cannot be
    read or parsed: ``error("<path>: cannot read <what> (<why>); <remedy>")``."""
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as exc:
        msg = f"{path}: cannot read {what} ({exc}); {remedy}"
        raise error(msg) from None
