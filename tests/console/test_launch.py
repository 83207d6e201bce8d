"""What `python -m app run` prepares for the console: roles.json, the worker's state port, a first user."""

from __future__ import annotations

import socket
from pathlib import Path

from app.console.health import read_roles
from app.console.launch import prepare, state_port
from app.console.users import load_users
from app.runtime.supervisor import Role


def test_roles_file_state_port_and_first_user(tmp_path: Path) -> None:
    roles = [
        Role("worker", ["x"], env={"APP_METRICS_PORT": "9001"}),
        Role("replay-logs", ["x"], env={"APP_METRICS_PORT": "9002"}, one_shot=True),
        Role("dashboard", ["x"], env={"APP_METRICS_PORT": "9003"}),
    ]
    lines = prepare(tmp_path, roles)
    port = roles[0].env["APP_STATE_PORT"]
    assert read_roles(tmp_path) == [
        {"name": "worker", "metrics": "http://127.0.0.1:9001/metrics", "one_shot": False,
         "state": f"http://127.0.0.1:{port}"},
        {"name": "replay-logs", "metrics": "http://127.0.0.1:9002/metrics", "one_shot": True},
        {"name": "dashboard", "metrics": "http://127.0.0.1:9003/metrics", "one_shot": False},
    ]  # fmt: skip
    assert "admin" in load_users(tmp_path / "console-users.json")
    assert any("console-admin-password.txt" in line for line in lines)
    again = prepare(tmp_path, roles)  # a second run keeps the users and says where they are
    note, users = tmp_path / "console-admin-password.txt", tmp_path / "console-users.json"
    assert f"  console     sign in with a user of {users} (admin's first password is in {note})" in again
    note.unlink()  # the operator removed it
    assert any(line.endswith("(add one: python -m app users add NAME)") for line in prepare(tmp_path, roles))


def test_a_second_run_gives_the_worker_the_state_port_of_the_first_while_it_is_free(tmp_path: Path) -> None:
    """The port is in the URL Faust's assignor shares with the group: a static member that
    comes back on another one before its session ends is handed its last assignment, whose
    URL Faust asserts is its own (a second ``make run``'s worker never read a record)."""

    def worker_port(given: dict[str, str] | None = None) -> str:
        roles = [Role("worker", ["x"], env={"APP_METRICS_PORT": "9001", **(given or {})})]
        prepare(tmp_path, roles)
        return roles[0].env["APP_STATE_PORT"]

    first = worker_port()
    assert worker_port() == first  # the run after it
    with socket.socket() as taken:  # the port is someone else's now: another one
        taken.bind(("127.0.0.1", int(first)))
        other = worker_port()
    assert other != first
    assert worker_port() == other
    assert worker_port({"APP_STATE_PORT": "9999"}) == "9999"  # the operator's, whatever the last was
    assert state_port(tmp_path, "9998") == "9998"
