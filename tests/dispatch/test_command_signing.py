"""Operator commands are signed (app/dispatch/commands.py) and production refuses demo secrets."""

from __future__ import annotations

import pytest

from app.dispatch.commands import AckCommand, parse_command, sign_command, verify_command
from app.errors import ConfigError
from app.runtime.settings import DEMO_COMMAND_SECRET, DEMO_WEBHOOK_SECRET, Settings


def ack(**kw: str) -> AckCommand:
    return AckCommand(fingerprint="fp1", at="2026-11-25T03:00:00Z", by="ann", **kw)


def test_a_signed_command_verifies_after_a_round_trip_through_the_topic() -> None:
    signed = sign_command(ack(comment="on it"), "k" * 32)
    assert signed.sig.startswith("v1,")
    assert verify_command(parse_command(signed.model_dump_json()), "k" * 32)


@pytest.mark.parametrize("change", [{"by": "mallory"}, {"comment": "other"}, {"fingerprint": "fp2"}])
def test_any_changed_field_breaks_the_signature(change: dict[str, str]) -> None:
    signed = sign_command(ack(), "k" * 32)
    assert not verify_command(signed.model_copy(update=change), "k" * 32)


def test_unsigned_and_other_key_commands_do_not_verify() -> None:
    assert not verify_command(ack(), "k" * 32)
    assert not verify_command(sign_command(ack(), "x" * 32), "k" * 32)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "APP_WEBHOOK_SECRET"),
        ({"APP_WEBHOOK_SECRET": "whsec_" + "a" * 40}, "APP_COMMAND_SECRET"),
        ({"APP_WEBHOOK_SECRET": "whsec_" + "a" * 40, "APP_COMMAND_SECRET": "short"}, "APP_COMMAND_SECRET"),
        ({"APP_WEBHOOK_SECRET": DEMO_WEBHOOK_SECRET, "APP_COMMAND_SECRET": "c" * 32}, "APP_WEBHOOK_SECRET"),
    ],
)
def test_production_refuses_the_demo_secrets(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings.from_env({"APP_ENV": "production", **env})


def test_production_accepts_secrets_of_its_own_and_development_the_demo_ones() -> None:
    own = {"APP_WEBHOOK_SECRET": "whsec_" + "a" * 40, "APP_COMMAND_SECRET": "c" * 32}
    assert Settings.from_env({"APP_ENV": "production", **own}).env == "production"
    assert Settings.from_env({}).command_secret.get_secret_value() == DEMO_COMMAND_SECRET
