"""What each role's logging says of its libraries (``app.runtime.settings.quiet_libraries``)."""

from __future__ import annotations

import logging

import pytest

from app.runtime.settings import quiet_libraries

AUTH = "Authenticated as %s via SCRAM-SHA-512"


def said(caplog: pytest.LogCaptureFixture, level: str) -> list[str]:
    quiet_libraries(level)
    conn = logging.getLogger("aiokafka.conn")
    with caplog.at_level(logging.DEBUG):
        for user in ("worker", "worker", "admin", "worker"):
            conn.info(AUTH, user)
        conn.warning("Sending username and password in the clear")
        conn.warning("Sending username and password in the clear")
        logging.getLogger("httpx").info("HTTP Request: POST https://hooks.example/T0/B0/s3cr3t")
    return [f"{r.levelname} {r.getMessage()}" for r in caplog.records]


@pytest.mark.usefixtures("library_logging")
def test_aiokafkas_login_line_is_said_once_per_user_and_httpxs_request_line_not_at_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert said(caplog, "INFO") == [
        "INFO Authenticated as worker via SCRAM-SHA-512",
        "INFO Authenticated as admin via SCRAM-SHA-512",
        "WARNING Sending username and password in the clear",
        "WARNING Sending username and password in the clear",
    ]


@pytest.mark.usefixtures("library_logging")
def test_at_debug_every_line_is_said(caplog: pytest.LogCaptureFixture) -> None:
    lines = said(caplog, "DEBUG")
    assert len(lines) == 7
    assert lines[-1] == "INFO HTTP Request: POST https://hooks.example/T0/B0/s3cr3t"


@pytest.mark.usefixtures("library_logging")
def test_a_process_set_up_again_at_debug_says_every_line(caplog: pytest.LogCaptureFixture) -> None:
    quiet_libraries("INFO")
    assert len(said(caplog, "DEBUG")) == 7
