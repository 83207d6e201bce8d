"""The console's users file: scrypt hashes, verification, the CLI and the first user."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from app.console.users import ensure_first_user, hash_password, load_users, save_user, verify
from app.errors import ConfigError
from app.runtime.settings import PROJECT_ROOT


def test_a_saved_user_verifies_with_its_password_only(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    save_user(path, hash_password("ann", "s3cret-enough"))
    save_user(path, hash_password("bob", "another-one"))
    users = load_users(path)
    assert verify(users, "ann", "s3cret-enough") and verify(users, "bob", "another-one")
    assert not verify(users, "ann", "another-one") and not verify(users, "carl", "s3cret-enough")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "s3cret-enough" not in text and '"kdf": "scrypt"' in text


def test_the_same_password_gets_a_different_salt_and_hash(tmp_path: Path) -> None:
    a, b = hash_password("ann", "s3cret-enough"), hash_password("ann", "s3cret-enough")
    assert a.salt != b.salt and a.digest != b.digest


@pytest.mark.parametrize(
    ("name", "password"), [("", "long enough"), ("a b", "long enough"), ("ann", "short")]
)
def test_bad_names_and_short_passwords_are_refused(name: str, password: str) -> None:
    with pytest.raises(ValueError, match=r"user name|at least"):
        hash_password(name, password)


def test_a_malformed_users_file_names_the_file_and_user(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_bytes(orjson.dumps({"users": {"ann": {"kdf": "scrypt"}}}))
    with pytest.raises(ConfigError, match=r"users.json: user 'ann'"):
        load_users(path)
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a users file"):
        load_users(path)


def test_first_user_is_made_once_with_its_password_in_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "console-users.json"
    note = ensure_first_user(path)
    assert note is not None and stat.S_IMODE(note.stat().st_mode) == 0o600
    password = note.read_text().split("password: ")[1].strip()
    assert verify(load_users(path), "admin", password)
    assert ensure_first_user(path) is None  # kept: not replaced on the next run


def test_users_add_cli_reads_the_password_from_stdin(tmp_path: Path) -> None:
    env = {"APP_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "APP_NATIVE": "0"}
    out = subprocess.run(
        [sys.executable, "-m", "app", "users", "add", "ann", "--password-stdin"],
        input="long enough pw\n", cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert verify(load_users(tmp_path / "console-users.json"), "ann", "long enough pw")
    bad = subprocess.run(
        [sys.executable, "-m", "app", "users", "add", "ann", "--password-stdin"],
        input="short\n", cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "at least 8" in bad.stderr
