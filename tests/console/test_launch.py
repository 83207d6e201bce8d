"""What `python -m app run` prepares for the console: roles.json, the worker's state port, a first user."""

from __future__ import annotations

from pathlib import Path

from app.console.health import read_roles
from app.console.launch import prepare
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
