"""The ``--out FILE`` of a command that reads files: checked before anything is opened for writing.

``open(out, "w")`` truncates at once, so an output that is one of the command's inputs
(the same path, a symbolic link to it or a hard link of it) used to be emptied before it was
read: the run then reported "0 events" and exited 0 with the input gone. An output in a
missing directory, or a directory, used to end the run in a Python traceback.
:func:`check_output` refuses all three with one line naming ``--out`` and the path, which
both command lines print as a usage error (exit 2). Nothing is created or changed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from app.errors import ConfigError

logger = logging.getLogger(__name__)


class OutputPathError(ConfigError):
    """``--out`` names a path the command must not or cannot write: the message says which and why."""


def check_output(out: str | os.PathLike[str], inputs: Iterable[tuple[str, str | os.PathLike[str]]]) -> None:
    """Raise :class:`OutputPathError` when ``out`` is a directory, is in a directory that does
    not exist, or is the same file as one of ``inputs`` (``(option, path)`` pairs: the option
    or argument that named the input, and its path). The same file is the same device and inode
    (:func:`os.path.samefile`), so a symbolic or a hard link to an input counts; an input that
    does not exist is left to the command's own check."""
    path = Path(out)
    if path.is_dir():
        msg = f"--out {out}: a directory; give the path of a file to write"
        raise OutputPathError(msg)
    parent = path.parent
    if not parent.is_dir():
        msg = f"--out {out}: no such directory {parent}"
        raise OutputPathError(msg)
    if not path.exists():  # a new file (or a dangling link): it cannot be an input
        return
    for option, given in inputs:
        try:
            same = os.path.samefile(given, path)
        except OSError:  # the input is missing or unreadable: its own check says so
            continue
        if same:
            msg = (
                f"--out {out} is the same file as {option} {given}: writing it would destroy the "
                "input; give --out another file"
            )
            raise OutputPathError(msg)
