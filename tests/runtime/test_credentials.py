"""make run's principals and passwords (app/runtime/credentials.py): kept per data dir,
private, reused; in each role's environment and nowhere on a command line; and the
operator's command line finds the running make run by itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.errors import ConfigError
from app.kafka.acls import ROLES
from app.kafka.auth import KafkaAuth
from app.runtime.credentials import (
    ADMIN,
    ROLE_PRINCIPALS,
    embedded_users,
    operator_settings,
    read_client_env,
    role_auth,
    role_kafka_env,
    users_path,
    write_client_env,
)
from app.runtime.system import RunOptions, build_roles
from tests.conftest import make_settings


def test_each_data_dir_gets_its_own_private_passwords_and_keeps_them(tmp_path: Path) -> None:
    first, other = embedded_users(tmp_path / "a"), embedded_users(tmp_path / "b")
    assert list(first) == [ADMIN, *ROLES]
    assert embedded_users(tmp_path / "a") == first  # the second make run authenticates with the same
    assert all(first[u] != other[u] for u in first) and len(set(first.values())) == len(first)
    assert all(len(p) >= 32 for p in first.values())
    assert users_path(tmp_path / "a").stat().st_mode & 0o777 == 0o600


def test_a_principal_added_later_gets_a_password_and_the_others_stay(tmp_path: Path) -> None:
    embedded_users(tmp_path)
    users_path(tmp_path).write_text(f'{{"{ADMIN}": "kept-admin", "worker": "kept-worker"}}')
    users = embedded_users(tmp_path)
    assert users[ADMIN] == "kept-admin" and users["worker"] == "kept-worker"
    assert set(users) == {ADMIN, *ROLES} and users_path(tmp_path).stat().st_mode & 0o777 == 0o600


def test_every_role_gets_its_own_principal_in_its_environment_and_never_on_its_command_line(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    users = embedded_users(settings.data_dir)
    roles = build_roles(settings, "127.0.0.1:9", RunOptions(dashboard=True), users)
    assert {r.name for r in roles} <= set(ROLE_PRINCIPALS)
    seen = {}
    for r in roles:
        principal = ROLE_PRINCIPALS[r.name]
        assert not any(p in arg for p in users.values() for arg in r.argv), r.name
        if principal is None:
            assert "KAFKA_SASL_PASSWORD" not in r.env, r.name
            continue
        auth = KafkaAuth.from_env(r.env)
        expected = ("SASL_PLAINTEXT", "SCRAM-SHA-512", principal)
        assert (auth.protocol, auth.mechanism, auth.username) == expected
        assert auth.password == users[principal]
        seen[r.name] = principal
    assert seen["worker"] == "worker" and seen["dispatch"] == "dispatch" and seen["dashboard"] == "console"
    assert seen["store-sync"] == "store" and seen["replay-sensors"] == "ingest"


def test_without_auth_the_roles_connect_plaintext_whatever_the_operators_shell_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path)
    roles = build_roles(settings, "127.0.0.1:9", RunOptions(dashboard=False, auth=False), None)
    worker = next(r for r in roles if r.name == "worker")
    # the supervisor starts from the operator's environment: make run's own values override it
    shell = {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SSL_CAFILE": "/nonexistent.pem"}
    assert KafkaAuth.from_env({**shell, **worker.env}) == KafkaAuth()


def test_a_role_without_a_principal_is_refused() -> None:
    with pytest.raises(ConfigError, match="no Kafka principal"):
        role_kafka_env("new-role", {})


def test_the_operators_command_line_finds_the_running_make_run(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    with pytest.raises(ConfigError, match="no `make run` is up on APP_DATA_DIR"):
        operator_settings(settings, env={})
    users = embedded_users(settings.data_dir)
    path = write_client_env(settings.data_dir, "127.0.0.1:4242", role_auth(users, "console"), "cmd 'secret\"")
    assert path.stat().st_mode & 0o777 == 0o600
    found = read_client_env(settings.data_dir)
    assert found is not None and found["APP_COMMAND_SECRET"] == "cmd 'secret\""  # shell-quoted
    local = operator_settings(settings, env={})
    assert local.bootstrap_servers == "127.0.0.1:4242"
    assert local.kafka_auth == role_auth(users, "console")
    assert local.command_secret.get_secret_value() == "cmd 'secret\""
    mine = operator_settings(settings, env={"APP_COMMAND_SECRET": "mine"})
    assert mine.command_secret.get_secret_value() == "mine"
    # KAFKA_BOOTSTRAP_SERVERS set: a cluster of the operator's, the file is not read
    remote = make_settings(tmp_path, KAFKA_BOOTSTRAP_SERVERS="kafka-1:9092")
    assert operator_settings(remote, env=dict(os.environ)) is remote
