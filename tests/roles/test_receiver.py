"""The demo receiver role on a real port, fed by the real notifier."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.errors import NotifierError
from app.notify import WebhookNotifier
from app.roles import receiver
from app.runtime.settings import Settings
from tests.conftest import make_settings
from tests.notify.servers import make_alert

OTHER_SECRET = "whsec_b3RoZXItc2VjcmV0LW90aGVyLXNlY3JldA=="


def with_receiver(
    settings: Settings,
    body: Callable[[str, WebhookNotifier], Awaitable[None]],
    caplog: pytest.LogCaptureFixture,
    **options: Any,
) -> dict[str, Any]:
    """Run the receiver role, call ``body(url, notifier)``, stop the role; return /stats."""

    async def main() -> dict[str, Any]:
        stop = asyncio.Event()
        task = asyncio.create_task(receiver.run(settings, stop, **options))
        url = await _listening_url(caplog)
        async with WebhookNotifier(
            url, settings.webhook_secret.get_secret_value(), 5.0, allow_private=["127.0.0.1"]
        ) as n:
            await body(url, n)
        async with httpx.AsyncClient() as client:
            assert (await client.get(url.replace("/webhook", "/healthz"))).text == "ok"
            stats = (await client.get(url.replace("/webhook", "/stats"))).json()
        stop.set()
        await asyncio.wait_for(task, 5)
        return stats

    with caplog.at_level(logging.INFO, logger="app.roles.receiver"):
        return asyncio.run(asyncio.wait_for(main(), 30))


async def _listening_url(caplog: pytest.LogCaptureFixture) -> str:
    for _ in range(200):
        for rec in caplog.records:
            m = re.fullmatch(r"receiver listening on (http://127\.0\.0\.1:\d+/webhook)", rec.getMessage())
            if m:
                return m.group(1)
        await asyncio.sleep(0.02)
    msg = "the receiver never logged its URL"
    raise AssertionError(msg)


@pytest.fixture
def cfg(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, APP_RECEIVER_PORT="0")


def test_signed_alerts_are_counted_logged_and_deduplicated(
    cfg: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    alerts = [make_alert(1), make_alert(2), make_alert(1, "resolved")]

    async def body(url: str, n: WebhookNotifier) -> None:
        await n.send(alerts[:2])
        await n.send(alerts[:2])  # same webhook-id: dropped
        await n.send(alerts[2:])

    stats = with_receiver(cfg, body, caplog)
    assert stats["received"] == 3
    assert stats["duplicates"] == 1
    assert stats["alerts"] == 3 == stats["unique_alerts"]
    assert [r["alert_id"] for r in stats["recent"]] == [a.alert_id for a in alerts]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("alert ")]
    labels = '{"device_id":"dev-1","alertname":"cpu_hot","severity":"critical"}'
    assert lines[0] == f"alert {alerts[0].alert_id} firing cpu_hot {labels}"


def test_bad_signature_is_refused_with_401(cfg: Settings, caplog: pytest.LogCaptureFixture) -> None:
    async def body(url: str, n: WebhookNotifier) -> None:
        async with WebhookNotifier(url, OTHER_SECRET, allow_private=["127.0.0.1"]) as wrong:
            with pytest.raises(NotifierError, match="401") as info:
                await wrong.send([make_alert(1)])
            assert not info.value.retryable
        async with httpx.AsyncClient() as client:
            resp = await client.post(url, content=b"{}", headers={"webhook-id": "x"})
            assert resp.status_code == 401

    stats = with_receiver(cfg, body, caplog)
    assert (stats["bad_signature"], stats["alerts"]) == (2, 0)


def test_fail_first_answers_503_then_accepts(cfg: Settings, caplog: pytest.LogCaptureFixture) -> None:
    async def body(url: str, n: WebhookNotifier) -> None:
        for _ in range(2):
            with pytest.raises(NotifierError, match="503") as info:
                await n.send([make_alert(1)])
            assert info.value.retryable
        await n.send([make_alert(1)])

    stats = with_receiver(cfg, body, caplog, fail_first=2)
    assert (stats["received"], stats["failed_on_purpose"], stats["alerts"]) == (3, 2, 1)


def test_port_option_overrides_settings(cfg: Settings, caplog: pytest.LogCaptureFixture) -> None:
    from app.kafka.broker import free_port

    port = free_port()

    async def body(url: str, n: WebhookNotifier) -> None:
        assert url == f"http://127.0.0.1:{port}/webhook"

    with_receiver(cfg, body, caplog, port=port)
