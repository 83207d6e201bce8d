"""Routes file hot reload: notice an edited file, load it, keep the last good one on errors.

:class:`RoutesWatcher` is polled by the dispatch role (at most every
``every_s`` seconds, on a monotonic clock). A changed file (by content hash,
so a touch alone does nothing) is loaded with
:func:`app.dispatch.config.load_routes`; if it is valid the new config is
returned, otherwise every problem is logged as ``file:line:col: message``
(once per bad version of the file) and the dispatcher keeps running the last
good config. A missing or unreadable file counts as a bad version.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from app.dispatch.config import RoutesConfigError, RoutesFile, load_routes

logger = logging.getLogger(__name__)


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


class RoutesWatcher:
    """Not thread-safe; one per dispatcher. ``problems`` holds the last rejection's lines."""

    def __init__(
        self,
        path: Path | str,
        current: RoutesFile,
        *,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.current = current
        self.every_s = every_s
        self.clock = clock
        self.problems: list[str] = []
        self._seen = _digest(self.path)
        self._checked_at = clock()

    def poll(self) -> RoutesFile | None:
        """The new config if the file changed and is valid since the last call, else None."""
        now = self.clock()
        if now - self._checked_at < self.every_s:
            return None
        self._checked_at = now
        digest = _digest(self.path)
        if digest == self._seen:
            return None
        self._seen = digest
        try:
            cfg = load_routes(self.path)
        except RoutesConfigError as exc:
            self.problems = list(exc.problems)
            logger.error(
                "routes file %s rejected, keeping the last good config:\n%s",
                self.path,
                "\n".join(exc.problems),
            )
            return None
        self.problems = []
        self.current = cfg
        return cfg
