"""Sign-in through OIDC (Streamlit's ``st.login``) in a real browser, against a real
authorization-code flow: a local OpenID provider (:mod:`tests.browser.oidc_provider`) signs
the user in, Streamlit exchanges the code, checks the RS256 ID token against the provider's
keys and the request's nonce, and the console then records that user as the actor of an ack.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import orjson
import pytest

from app.dispatch.commands import AckCommand, parse_command
from app.kafka.broker import KafkaBroker, free_port
from app.topics import COMMANDS
from tests.browser.cdp import browser, chromium_path
from tests.browser.console_server import go_to, run_console
from tests.browser.oidc_provider import oidc_provider
from tests.console_helpers import seed
from tests.kafka_helpers import consume_json

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed"),
]

ALICE = {"sub": "u-1842", "email": "alice@example.com", "name": "Alice Operator"}


def test_an_operator_signs_in_with_oidc_and_her_ack_is_recorded_as_hers(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    seed(data / "alerts.sqlite3")  # no users file: OIDC is the only way in
    port = free_port()
    with oidc_provider(ALICE) as idp:
        (tmp_path / ".streamlit").mkdir()
        (tmp_path / ".streamlit" / "secrets.toml").write_text(
            "[auth]\n"
            f'redirect_uri = "http://127.0.0.1:{port}/oauth2callback"\n'
            f'cookie_secret = "{secrets.token_hex(32)}"\n'
            f'client_id = "{idp.client_id}"\n'
            f'client_secret = "{idp.client_secret}"\n'
            f'server_metadata_url = "{idp.metadata_url}"\n'
        )
        with run_console(tmp_path, data, broker.bootstrap, port=port) as url, browser() as tab:
            tab.open(f"{url}/?page=alerts")
            tab.wait_text("alert(s) match")
            assert "signed in as" not in tab.text()
            tab.click_button("Sign in")  # to the provider and back, through the real code flow
            tab.wait_text(f"signed in as {ALICE['email']}", timeout_s=60)
            go_to(tab, "Alerts")
            tab.choose("open alert", "critical machine-overheat")
            tab.wait_text("Runbook")
            tab.type_into("ack comment", "mine", enter=False)
            tab.click_button("Ack")
            tab.wait_text(f"ack sent by {ALICE['email']}")
        assert idp.refused == [] and len(idp.issued) == 1, idp.refused

    commands = [parse_command(orjson.dumps(c)) for c in consume_json(broker.bootstrap, COMMANDS, min_count=1)]
    ack = next(c for c in commands if isinstance(c, AckCommand))
    assert (ack.by, ack.comment) == (ALICE["email"], "mine")
