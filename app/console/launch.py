"""What ``python -m app run`` does for the console: the roles file, the worker's state port,
and a first user.

:func:`prepare` runs after the roles are built and before they start. It gives the worker
an ``APP_STATE_PORT`` (its interactive-query server, :mod:`agents.state_server`), writes
``APP_DATA_DIR/roles.json`` (each role's ``/metrics`` URL, and the worker's state URL) for
the console's health and state pages, and creates the users file with a user ``admin`` when
there is none (:func:`app.console.users.ensure_first_user`). It returns the lines to print
with the other URLs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.console.health import read_roles, write_roles_file
from app.console.users import admin_password_path, ensure_first_user, users_path
from app.kafka.broker import claim_port, free_port

logger = logging.getLogger(__name__)


def state_port(data_dir: Path, given: str | None) -> str:
    """The worker's state port: ``given`` (the operator's ``APP_STATE_PORT``), else the last
    run's (``roles.json``) while it is free, else a free one.

    The port is in the worker's ``canonical_url``, which Faust's assignor writes into the
    group's assignment, and under ``make run`` the worker is a static member of its group
    (``app.runtime.system.worker_member_id``). A static member that joins again before its
    session ends is handed its last assignment, with no rebalance; Faust's assignor then
    asserts that the assignment's URL is its own, and on a new port that assertion killed
    the consumer's group routine: the worker of a second ``make run`` started and never
    read a record (docs/worker.md, "Static membership")."""
    if given:
        return given
    last = next((str(e.get("state") or "") for e in read_roles(data_dir) if e.get("name") == "worker"), "")
    _, _, tail = last.rpartition(":")
    if tail.isdigit() and claim_port(int(tail)):
        return tail
    return str(free_port())


def prepare(data_dir: Path, roles: list[Any]) -> list[str]:
    """See the module docstring. ``roles``: :class:`app.runtime.supervisor.Role` objects."""
    entries: list[dict[str, Any]] = []
    for r in roles:
        entry: dict[str, Any] = {
            "name": r.name,
            "metrics": f"http://127.0.0.1:{r.env['APP_METRICS_PORT']}/metrics" if r.metrics else None,
            "one_shot": bool(r.one_shot),
        }
        if r.name == "worker":
            port = r.env["APP_STATE_PORT"] = state_port(data_dir, r.env.get("APP_STATE_PORT"))
            entry["state"] = f"http://127.0.0.1:{port}"
        entries.append(entry)
    write_roles_file(data_dir, entries)
    lines = []
    path = users_path(data_dir=data_dir)
    note = ensure_first_user(path)
    if note is not None:
        lines.append(f"  console     sign in as admin: the password is in {note} (users: {path})")
    elif any(r.name == "dashboard" for r in roles):
        first = admin_password_path(path)  # a resumed run: the first run's banner is gone
        where = (
            f"admin's first password is in {first}"
            if first.exists()
            else "add one: python -m app users add NAME"
        )
        lines.append(f"  console     sign in with a user of {path} ({where})")
    worker = next((e for e in entries if "state" in e), None)
    if worker is not None:
        lines.append(f"  state       {worker['state']}/state/rules/RULE (interactive queries)")
    return lines
