"""Signed webhook delivery of alert batches (Standard Webhooks, Alertmanager v4 body).

:class:`WebhookNotifier` makes exactly one HTTP attempt per :meth:`send` and
classifies the outcome; the retry policy (:mod:`app.notify.retry`) decides
whether to try again. Outcomes:

- 2xx: delivered;
- 429, 5xx, timeouts and connection errors: ``NotifierError(retryable=True)``,
  with ``retry_after`` from a ``Retry-After`` header (seconds or HTTP date);
- 410 Gone: the notifier marks itself disabled, logs at ERROR and raises a
  non-retryable error; every later :meth:`send` fails at once;
- 3xx (never followed) and other 4xx: ``NotifierError(retryable=False)``.

Every request goes to the IP checked by the SSRF guard, and carries
``webhook-id`` (stable for the same alerts), ``webhook-timestamp`` (this
attempt) and ``webhook-signature`` (``v1,`` HMAC-SHA256). The client ignores
proxy environment variables, which would defeat the pinning. Logs and errors
show the URL redacted and never the secret.

:meth:`send` builds the body from alerts; :meth:`deliver` sends a body and
message id fixed earlier (the durable outbox stores both, so a redelivery
after a crash is byte-identical under the same ``webhook-id``). With
``secret=None`` requests are not signed (the Alertmanager API push).

Lifecycle: create (ConfigError for a URL that is not http(s) with a host, or
a secret that is not base64), ``await send(...)``/``deliver(...)`` any number
of times from one event loop, then ``await aclose()`` (or use ``async with``).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType

import httpx
from standardwebhooks import Webhook
from standardwebhooks.webhooks import EmptyWebhookSecretError

from app.alerts import Alert
from app.errors import ConfigError, NotifierError
from app.notify.payload import build_payload, encode, webhook_id
from app.notify.redact import redact_url, scrub, url_secrets
from app.notify.retry import parse_retry_after
from app.notify.ssrf import Resolver, SSRFGuard

logger = logging.getLogger(__name__)

USER_AGENT = "streamalert-webhook/0.1"
_ERROR_BODY_BYTES = 300


def _utcnow() -> datetime:
    return datetime.now(tz=UTC)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a webhook URL (not http(s) with a host), or None."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return f"{redact_url(url)} is not a valid URL"
    if parsed.scheme not in ("http", "https") or not parsed.host:
        scheme = (
            f" (scheme {parsed.scheme!r})" if parsed.scheme and parsed.scheme not in ("http", "https") else ""
        )
        return f"{redact_url(url)} must be http:// or https:// with a host{scheme}"
    return None


def secret_problem(secret: str) -> str | None:
    """Why ``secret`` cannot sign Standard Webhooks, or None."""
    try:
        Webhook(secret)
    except (EmptyWebhookSecretError, ValueError):  # binascii.Error is a ValueError
        return "must be non-empty base64, optionally prefixed with whsec_"
    return None


class WebhookNotifier:
    """Sends alert batches to one webhook URL. Not thread-safe; one event loop."""

    def __init__(
        self,
        url: str,
        secret: str | None,
        timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        allow_private: Iterable[str] = (),
        *,
        receiver: str = "webhook",
        external_url: str = "",
        resolver: Resolver | None = None,
        verify: ssl.SSLContext | bool = True,
        now: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._url = url
        self.safe_url = redact_url(url)
        problem = url_problem(url)
        if problem is not None:
            msg = f"webhook URL {problem}"
            raise ConfigError(msg)
        self._signer: Webhook | None = None
        if secret is not None:
            problem = secret_problem(secret)
            if problem is not None:
                msg = f"webhook secret {problem}"
                raise ConfigError(msg)
            self._signer = Webhook(secret)
        self._secrets = [*url_secrets(url), secret or "", *(headers or {}).values()]
        self._headers = dict(headers or {})
        self._timeout = timeout
        self._receiver = receiver
        self._external_url = external_url
        try:
            self._guard = SSRFGuard(allow_private, resolver)
        except ValueError as exc:  # an allow-list entry that does not parse
            raise ConfigError(str(exc)) from None
        self._now = now
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
            trust_env=False,
            verify=verify,
        )
        self.disabled = False

    async def __aenter__(self) -> WebhookNotifier:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close pooled connections. Idempotent."""
        await self._client.aclose()

    async def send(self, alerts: Sequence[Alert]) -> None:
        """Deliver ``alerts`` as one signed request; see the module docstring
        for which failures raise which :class:`NotifierError`. No-op when empty."""
        if not alerts:
            return
        body = encode(build_payload(alerts, receiver=self._receiver, external_url=self._external_url))
        await self.deliver(webhook_id(alerts), body)

    async def deliver(self, msg_id: str, body: bytes, key: str = "") -> None:
        """POST ``body`` (JSON) once under ``msg_id``; same outcomes as :meth:`send`.
        ``key`` is accepted for the Notifier protocol and unused."""
        if self.disabled:
            msg = f"webhook {self.safe_url} is disabled after 410 Gone; fix the URL and restart"
            raise NotifierError(msg, retryable=False)
        target = await self._guard.pin(self._url)
        stamp = self._now().replace(microsecond=0)
        headers = {
            **self._headers,
            "Host": target.host_header,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(stamp.timestamp())),
        }
        if self._signer is not None:
            headers["webhook-signature"] = self._signer.sign(msg_id, stamp, body.decode())
        try:
            async with self._client.stream(
                "POST",
                target.url,
                content=body,
                headers=headers,
                extensions=target.extensions(),
                follow_redirects=False,
            ) as response:
                if response.is_success:
                    logger.debug("webhook %s: %s for %s", self.safe_url, response.status_code, msg_id)
                    return
                detail = await self._snippet(response)
                self._raise_for(response, detail)
        except httpx.TimeoutException:
            msg = f"webhook {self.safe_url} timed out after {self._timeout:g}s"
            raise NotifierError(msg, retryable=True) from None
        except httpx.TransportError as exc:
            reason = scrub(str(exc), self._secrets) or "no detail"
            msg = f"webhook {self.safe_url} connection failed: {type(exc).__name__}: {reason}"
            raise NotifierError(msg, retryable=True) from None

    def _raise_for(self, response: httpx.Response, detail: str) -> None:
        code = response.status_code
        what = f"webhook {self.safe_url} answered {code}{detail}"
        if code == 410:
            self.disabled = True
            logger.error(
                "WEBHOOK RECEIVER GONE: %s answered 410; delivery to it is disabled until restart",
                self.safe_url,
            )
            raise NotifierError(what, retryable=False)
        if code == 429 or code >= 500:
            retry_after = parse_retry_after(response.headers.get("Retry-After"), self._now())
            raise NotifierError(what, retryable=True, retry_after=retry_after)
        if 300 <= code < 400:
            location = redact_url(response.headers.get("Location", ""))
            msg = f"{what}: redirect to {location} not followed; configure the final URL"
            raise NotifierError(msg, retryable=False)
        raise NotifierError(what, retryable=False)

    async def _snippet(self, response: httpx.Response) -> str:
        """Up to a few hundred bytes of an error body, scrubbed, for the error message."""
        chunk = b""
        try:
            async for part in response.aiter_bytes():
                chunk += part
                if len(chunk) >= _ERROR_BODY_BYTES:
                    break
        except httpx.HTTPError:
            return ""
        text = chunk[:_ERROR_BODY_BYTES].decode("utf-8", "replace").strip().replace("\n", " ")
        return f": {scrub(text, self._secrets)}" if text else ""
