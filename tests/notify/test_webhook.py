"""WebhookNotifier against a real aiohttp server on 127.0.0.1: signing, outcomes, retries."""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import subprocess
from pathlib import Path

import orjson
import pytest
from standardwebhooks import Webhook

from app.errors import ConfigError, NotifierError
from app.notify import RetryPolicy, SSRFBlockedError, WebhookNotifier
from tests.notify.servers import SECRET, ScriptedServer, make_alert

LOOPBACK = ("127.0.0.1",)


def fast_policy(sleeps: list[float] | None = None) -> RetryPolicy:
    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)

    return RetryPolicy(base_s=0.01, cap_s=0.05, max_attempts=5, sleep=sleep)


def deliver(server: ScriptedServer, policy: RetryPolicy | None = None, **kw: object) -> WebhookNotifier:
    """Send one alert through ``server`` (optionally under ``policy``); return the notifier."""

    async def main() -> WebhookNotifier:
        async with server:
            url = str(kw.pop("url", server.url)).format(port=server.port)
            options = {"timeout": 2.0, "allow_private": LOOPBACK, **kw}
            async with WebhookNotifier(url, SECRET, **options) as notifier:  # type: ignore[arg-type]
                alerts = [make_alert(1), make_alert(2)]
                if policy is None:
                    await notifier.send(alerts)
                else:
                    await policy.run(lambda: notifier.send(alerts))
                return notifier

    return asyncio.run(asyncio.wait_for(main(), 20))


def test_request_is_signed_per_standard_webhooks_and_carries_v4_body() -> None:
    server = ScriptedServer()
    deliver(server, headers={"X-Team": "ops"})
    (req,) = server.posts()
    payload = Webhook(SECRET).verify(req.body, req.headers)
    assert payload["version"] == "4"
    assert [a["alert_id"] for a in payload["alerts"]] == [make_alert(1).alert_id, make_alert(2).alert_id]
    assert req.headers["X-Team"] == "ops"
    assert req.headers["Host"] == f"127.0.0.1:{server.port}"
    with pytest.raises(Exception, match="signature"):
        Webhook("whsec_" + "b3RoZXItc2VjcmV0LW90aGVyLXNlY3JldA==").verify(req.body, req.headers)


def test_503_twice_then_204_delivers_once_with_the_same_webhook_id() -> None:
    server = ScriptedServer(script=[(503, {}), (503, {})])
    sleeps: list[float] = []
    deliver(server, fast_policy(sleeps))
    posts = server.posts()
    assert len(posts) == 3 and len(sleeps) == 2
    assert len({p.headers["webhook-id"] for p in posts}) == 1
    assert len({p.body for p in posts}) == 1
    for p in posts:
        Webhook(SECRET).verify(p.body, p.headers)


def test_429_retry_after_is_honoured() -> None:
    server = ScriptedServer(script=[(429, {"Retry-After": "7"})])
    sleeps: list[float] = []
    deliver(server, fast_policy(sleeps))
    assert sleeps == [7.0]
    assert len(server.posts()) == 2


def test_400_is_not_retried() -> None:
    server = ScriptedServer(script=[(400, {})])
    with pytest.raises(NotifierError, match="answered 400: nope") as info:
        deliver(server, fast_policy())
    assert not info.value.retryable
    assert len(server.posts()) == 1


def test_410_disables_the_receiver(caplog: pytest.LogCaptureFixture) -> None:
    server = ScriptedServer(script=[(410, {})])

    async def main() -> None:
        async with server:
            async with WebhookNotifier(server.url, SECRET, allow_private=LOOPBACK) as notifier:
                with pytest.raises(NotifierError) as first:
                    await notifier.send([make_alert(1)])
                assert not first.value.retryable and notifier.disabled
                with pytest.raises(NotifierError, match="disabled"):
                    await notifier.send([make_alert(2)])

    with caplog.at_level(logging.ERROR, logger="app.notify.webhook"):
        asyncio.run(asyncio.wait_for(main(), 10))
    assert len(server.posts()) == 1
    assert any("410" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


def test_redirect_is_not_followed() -> None:
    server = ScriptedServer()
    server.script.append((302, {"Location": "/elsewhere?token=s3cr3t"}))
    with pytest.raises(NotifierError, match="not followed") as info:
        deliver(server, fast_policy())
    assert not info.value.retryable
    assert "s3cr3t" not in str(info.value)
    assert [s.path for s in server.seen] == ["/webhook"]


def test_timeout_and_refused_connection_are_retryable() -> None:
    server = ScriptedServer(script=[(204, {}, 3.0)])
    with pytest.raises(NotifierError, match="timed out") as info:
        deliver(server, timeout=0.3)
    assert info.value.retryable

    async def refused() -> None:
        async with ScriptedServer() as gone:
            url = gone.url
        async with WebhookNotifier(url, SECRET, allow_private=LOOPBACK) as notifier:
            await notifier.send([make_alert(1)])

    with pytest.raises(NotifierError, match="connection failed") as info:
        asyncio.run(asyncio.wait_for(refused(), 10))
    assert info.value.retryable


def test_loopback_is_refused_unless_allow_listed_and_nothing_is_sent() -> None:
    server = ScriptedServer()
    with pytest.raises(SSRFBlockedError):
        deliver(server, allow_private=())
    assert server.seen == []


def test_url_credentials_query_and_secret_never_appear_in_errors() -> None:
    server = ScriptedServer(script=[(500, {})])
    with pytest.raises(NotifierError) as info:
        deliver(server, url="http://bob:pa55word@127.0.0.1:{port}/webhook?token=t0ken")
    text = str(info.value)
    assert "pa55word" not in text and "t0ken" not in text and SECRET not in text
    assert "***@127.0.0.1" in text


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https_to_a_pinned_ip_keeps_sni_and_certificate_check(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
         "-out", str(cert), "-subj", "/CN=hooks.example.test",
         "-addext", "subjectAltName=DNS:hooks.example.test"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    snis: list[str | None] = []
    server_ctx.sni_callback = lambda sock, name, ctx: snis.append(name)  # type: ignore[assignment,func-returns-value]
    client_ctx = ssl.create_default_context(cafile=str(cert))

    async def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"] if host == "hooks.example.test" else []

    async def main(url_host: str) -> ScriptedServer:
        async with ScriptedServer(ssl_context=server_ctx) as server:
            url = f"https://{url_host}:{server.port}/webhook"
            async with WebhookNotifier(
                url, SECRET, 5.0, allow_private=LOOPBACK, resolver=resolver, verify=client_ctx
            ) as notifier:
                await notifier.send([make_alert(1)])
        return server

    server = asyncio.run(asyncio.wait_for(main("hooks.example.test"), 20))
    assert snis == ["hooks.example.test"]
    assert server.posts()[0].headers["Host"] == f"hooks.example.test:{server.port}"
    with pytest.raises(NotifierError, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
        asyncio.run(asyncio.wait_for(main("127.0.0.1"), 20))


def test_body_is_compact_json() -> None:
    server = ScriptedServer()
    deliver(server)
    assert orjson.loads(server.posts()[0].body)["receiver"] == "webhook"


@pytest.mark.parametrize("url", ["ftp://example.com/x", "http:///nohost", "not a url"])
def test_unusable_url_or_secret_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="http:// or https://"):
        WebhookNotifier(url, SECRET)
    with pytest.raises(ConfigError, match="secret"):
        WebhookNotifier("https://example.com/x", "")
