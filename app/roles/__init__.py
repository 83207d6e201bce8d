"""The long-running roles a process runs alone (``python -m app ROLE``), listed in :data:`ROLES`.

Each role module has ``async def run(settings, stop, **options) -> None`` and returns once
``stop`` is set and it has shut down (:func:`app.runtime.role.run_role` runs one with
signals and metrics). The table is the one place a role is registered: the command line
builds its sub-commands from it. Loading a role's module (and its Kafka client) happens
only when that role runs. The whole system's processes, these roles among them, are laid
out in :mod:`app.runtime.system`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.runtime.role import RoleFn

logger = logging.getLogger(__name__)


def _dispatch() -> RoleFn:
    from app.roles import dispatch

    return dispatch.run


def _store_sync() -> RoleFn:
    from app.roles import store_sync

    return store_sync.run


def _receiver() -> RoleFn:
    from app.roles import receiver

    return receiver.run


@dataclass(frozen=True)
class RoleEntry:
    """A role: its command name, help line, how to load its ``run``, and whether it needs
    Kafka (it then starts once the cluster answers)."""

    name: str
    help: str
    load: Callable[[], RoleFn]
    kafka: bool = True
    aliases: tuple[str, ...] = ()
    #: the role's keyword options, from the settings
    options: Callable[[Any], dict[str, Any]] = field(default=lambda _settings: {})


ROLES: tuple[RoleEntry, ...] = (
    RoleEntry(
        "dispatch",
        "run the alert dispatcher (routing, grouping, silences, outbox delivery)",
        _dispatch,
        aliases=("deliver",),
    ),
    RoleEntry(
        "store-sync", "run the alert-store sync role (alerts, commands, notifications -> SQLite)", _store_sync
    ),
    RoleEntry(
        "receiver",
        "run the demo webhook receiver (verifies signatures)",
        _receiver,
        kafka=False,
        options=lambda settings: {"port": settings.receiver_port},
    ),
)
