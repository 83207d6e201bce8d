"""The ``receiver`` role: a demo webhook receiver that verifies and counts alerts.

Routes:

- ``POST /webhook``: verifies the Standard Webhooks signature with the
  configured secret (401 if it does not verify, 400 if the verified body is
  not a v4 payload), drops a message whose ``webhook-id`` it has seen
  already, logs ``alert <alert_id> <status> <rule_id> <labels>`` per alert
  and answers 204. With ``fail_first=N`` the first N requests get 503, so
  demos and tests can watch retries.
- ``GET /stats``: JSON ``received`` (POSTs), ``alerts`` (alerts accepted),
  ``unique_alerts`` (distinct alert ids), ``duplicates`` (messages dropped by
  webhook-id), ``bad_signature``, ``failed_on_purpose`` and ``recent`` (the
  last 50 alerts, oldest first).
- ``GET /healthz``: ``ok``.

State lives in memory in one event loop; the sets of seen message and alert
ids grow with the number of distinct alerts, which suits a demo, not a
production sink.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web
from standardwebhooks import Webhook
from standardwebhooks.webhooks import EmptyWebhookSecretError, WebhookVerificationError

from app.errors import ConfigError
from app.runtime.settings import Settings

logger = logging.getLogger(__name__)

RECENT_MAX = 50


class WebhookReceiver:
    """The receiver's state and aiohttp application. Lifecycle: :meth:`start`,
    then :meth:`close`; one event loop."""

    def __init__(self, secret: str, *, fail_first: int = 0) -> None:
        try:
            self._verifier = Webhook(secret)
        except (EmptyWebhookSecretError, ValueError):  # binascii.Error is a ValueError
            msg = "webhook secret must be non-empty base64, optionally prefixed with whsec_"
            raise ConfigError(msg) from None
        self._fail_left = fail_first
        self._seen_messages: set[str] = set()
        self._seen_alerts: set[str] = set()
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT_MAX)
        self._counts = {
            "received": 0,
            "alerts": 0,
            "duplicates": 0,
            "bad_signature": 0,
            "failed_on_purpose": 0,
        }
        self._runner: web.AppRunner | None = None
        self.app = web.Application()
        self.app.add_routes(
            [
                web.post("/webhook", self._webhook),
                web.get("/stats", self._stats),
                web.get("/healthz", self._healthz),
            ]
        )

    def stats(self) -> dict[str, Any]:
        """The counters served on ``GET /stats``."""
        return {**self._counts, "unique_alerts": len(self._seen_alerts), "recent": list(self._recent)}

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind and serve; return the webhook URL (with the real port when 0 was asked)."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        return f"http://{host}:{bound}/webhook"

    async def close(self) -> None:
        """Stop serving and release the port. Idempotent."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _webhook(self, request: web.Request) -> web.Response:
        self._counts["received"] += 1
        body = await request.read()
        if self._fail_left > 0:
            self._fail_left -= 1
            self._counts["failed_on_purpose"] += 1
            return web.Response(status=503, text="failing on purpose (fail_first)")
        try:
            text = body.decode()
        except UnicodeDecodeError:
            return web.Response(status=400, text="body is not UTF-8")
        try:
            self._verifier.verify(text, dict(request.headers), json_parse=False)
        except (WebhookVerificationError, ValueError):  # ValueError: malformed signature header
            self._counts["bad_signature"] += 1
            logger.warning("rejected a webhook with a bad signature from %s", request.remote)
            return web.Response(status=401, text="bad signature")
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return web.Response(status=400, text="body is not JSON")
        alerts = payload.get("alerts") if isinstance(payload, dict) else None
        if not isinstance(alerts, list) or not all(isinstance(a, dict) for a in alerts):
            return web.Response(status=400, text="expected an Alertmanager v4 payload with alerts[]")
        msg_id = request.headers["webhook-id"]
        if msg_id in self._seen_messages:
            self._counts["duplicates"] += 1
            return web.Response(status=204)
        self._seen_messages.add(msg_id)
        for alert in alerts:
            self._accept(alert)
        return web.Response(status=204)

    def _accept(self, alert: dict[str, Any]) -> None:
        alert_id = str(alert.get("alert_id") or alert.get("fingerprint") or "-")
        labels = alert.get("labels") or {}
        status, rule_id = alert.get("status", "-"), alert.get("rule_id", "-")
        logger.info("alert %s %s %s %s", alert_id, status, rule_id, orjson.dumps(labels).decode())
        self._counts["alerts"] += 1
        self._seen_alerts.add(alert_id)
        self._recent.append(
            {
                "alert_id": alert_id,
                "status": status,
                "rule_id": rule_id,
                "severity": alert.get("severity"),
                "labels": labels,
                "received_at": datetime.now(tz=UTC).isoformat(),
            }
        )

    async def _stats(self, _request: web.Request) -> web.Response:
        return web.json_response(self.stats(), dumps=lambda v: orjson.dumps(v).decode())

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")


async def run(
    settings: Settings,
    stop: asyncio.Event,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    fail_first: int = 0,
) -> None:
    """Serve the demo receiver until ``stop`` is set. ``port`` defaults to
    ``settings.receiver_port``; 0 picks a free port. Logs
    ``receiver listening on http://HOST:PORT/webhook`` once bound."""
    receiver = WebhookReceiver(settings.webhook_secret.get_secret_value(), fail_first=fail_first)
    url = await receiver.start(host, settings.receiver_port if port is None else port)
    logger.info("receiver listening on %s", url)
    try:
        await stop.wait()
    finally:
        await receiver.close()
        logger.info("receiver stopped: %s", {k: v for k, v in receiver.stats().items() if k != "recent"})
