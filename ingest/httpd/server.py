"""``python -m ingest http``: an HTTP endpoint that publishes events once Kafka has them.

Routes:

- ``POST /v1/events/{source}`` (``sensors``, ``logs`` or ``finance``) with
  ``Content-Type: application/json`` (one event object) or
  ``application/x-ndjson`` (a batch: one object per line, blank lines ignored;
  ``application/jsonl`` is accepted too). Answers:

  - **202** ``{"accepted": n}`` only after the broker acknowledged all ``n``
    events (``acks=all``);
  - **400** ``{"accepted": 0, "rejected": k, "published": false, "errors":
    [{"line": 3, "field": "ts", "reason": "..."}], "detail": "..."}`` when any
    line is invalid. The batch is all or nothing: **none** of its events is
    published, so the client fixes the listed lines and resends the whole
    batch without creating duplicates. The invalid lines are also
    dead-lettered to ``dlq.events`` for operators. At most 100 errors are
    listed (``errors_truncated`` says when there were more);
  - **413** when the body exceeds ``max_body_bytes`` (10 MiB by default),
    **415** for another content type, **404** for an unknown source,
    **401** without the bearer token when one is configured;
  - **503** ``{"error": ..., "acknowledged": k, "total": n}`` with
    ``Retry-After`` when the broker did not acknowledge every event within
    ``ack_timeout_s`` or while shutting down. Some events may then be on the
    topic already, so a resend can duplicate them (at-least-once).

- ``GET /healthz``: 200 ``ok`` while serving, 503 while shutting down.

On ``stop`` the listener closes, requests in progress finish (their acks are
awaited), then every publisher flushes. One event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from app.errors import IngestDecodeError
from app.events import Event
from app.runtime.settings import Settings
from app.topics import SOURCE_TOPICS
from ingest.publisher import Publisher
from ingest.runtime import AdapterSummary

logger = logging.getLogger(__name__)

REQUESTS = Counter("ingest_http_requests_total", "HTTP ingest requests by answer", ["source", "code"])
NDJSON_TYPES = (
    "application/x-ndjson",
    "application/jsonl",
    "application/json-lines",
    "application/x-jsonlines",
)
MAX_ERRORS_LISTED = 100


@dataclass(frozen=True)
class HttpOptions:
    """Listener address and limits. ``token``: required bearer token (None: no auth)."""

    host: str = "127.0.0.1"
    port: int = 8088
    max_body_bytes: int = 10 * 1024 * 1024
    ack_timeout_s: float = 30.0
    token: str | None = None


class IngestEndpoint:
    """The aiohttp application over one publisher per source."""

    def __init__(self, publishers: Mapping[str, Publisher], opts: HttpOptions) -> None:
        self._publishers, self._opts = publishers, opts
        self.stopping = False
        self.requests = 0
        self.app = web.Application(client_max_size=opts.max_body_bytes)
        self.app.router.add_post("/v1/events/{source}", self.post_events)
        self.app.router.add_get("/healthz", self.healthz)

    async def healthz(self, _request: web.Request) -> web.Response:
        if self.stopping:
            return web.Response(status=503, text="stopping")
        return web.Response(text="ok")

    async def post_events(self, request: web.Request) -> web.Response:
        source = request.match_info["source"]
        response = await self._post(request, source)
        self.requests += 1
        REQUESTS.labels(source if source in self._publishers else "-", str(response.status)).inc()
        return response

    async def _post(self, request: web.Request, source: str) -> web.Response:
        if self._opts.token is not None and not self._authorised(request):
            return _error(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        pub = self._publishers.get(source)
        if pub is None:
            return _error(404, f"unknown source {source!r}; expected one of: {', '.join(self._publishers)}")
        if self.stopping:
            return _error(503, "shutting down; retry on another instance", headers={"Retry-After": "5"})
        ctype = request.content_type
        if ctype != "application/json" and ctype not in NDJSON_TYPES:
            return _error(415, "Content-Type must be application/json (one event) or application/x-ndjson")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body larger than {self._opts.max_body_bytes} bytes; split the batch")
        lines = [(1, body)] if ctype == "application/json" else _ndjson_lines(body)
        if not lines:
            return _error(400, "empty body: no events")
        events: list[Event] = []
        errors: list[dict[str, Any]] = []
        for number, raw in lines:
            try:
                events.append(pub.check(raw))
            except IngestDecodeError as exc:
                errors.append({"line": number, "field": exc.field, "reason": exc.reason, "raw": raw})
        if errors:
            return await self._reject(pub, errors)
        return await self._publish(pub, events)

    def _authorised(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "")
        expected = f"Bearer {self._opts.token}"
        return hmac.compare_digest(given.encode(), expected.encode())

    async def _reject(self, pub: Publisher, errors: list[dict[str, Any]]) -> web.Response:
        for e in errors:
            await pub.reject(f"http line {e['line']}: {e['reason']}", e.pop("raw"), field=e["field"])
        body: dict[str, Any] = {
            "accepted": 0,
            "rejected": len(errors),
            "published": False,
            "errors": errors[:MAX_ERRORS_LISTED],
            "detail": "the batch was rejected as a whole and nothing was published: "
            "fix the listed lines and resend the whole batch",
        }
        if len(errors) > MAX_ERRORS_LISTED:
            body["errors_truncated"] = True
        return web.json_response(body, status=400)

    async def _publish(self, pub: Publisher, events: list[Event]) -> web.Response:
        deliveries = [await pub.send(pub.accept(e)) for e in events]
        done, pending = await asyncio.wait(deliveries, timeout=self._opts.ack_timeout_s)
        acked = sum(1 for f in done if not f.cancelled() and f.exception() is None)
        if acked == len(events):
            return web.json_response({"accepted": acked}, status=202)
        logger.error(
            "%d of %d events not acknowledged (%d still pending)",
            len(events) - acked,
            len(events),
            len(pending),
        )
        body = {
            "error": "the broker did not acknowledge every event; some may be published, "
            "so a resend may duplicate them",
            "acknowledged": acked,
            "total": len(events),
        }
        return web.json_response(body, status=503, headers={"Retry-After": "5"})


def _ndjson_lines(body: bytes) -> list[tuple[int, bytes]]:
    return [(n, line) for n, line in enumerate(body.split(b"\n"), start=1) if line.strip()]


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


async def serve_http(
    settings: Settings,
    opts: HttpOptions,
    stop: asyncio.Event,
    sources: tuple[str, ...] = tuple(SOURCE_TOPICS),
    on_ready: Callable[[str], None] | None = None,
) -> AdapterSummary:
    """Serve until ``stop`` is set; ``on_ready`` gets the base URL once listening."""
    if opts.token is None and opts.host not in ("127.0.0.1", "::1", "localhost"):
        logger.warning("listening on %s without a bearer token: anyone who reaches it can publish", opts.host)
    async with contextlib.AsyncExitStack() as stack:
        publishers = {
            s: await stack.enter_async_context(Publisher(settings, SOURCE_TOPICS[s], s, "http"))
            for s in sources
        }
        endpoint = IngestEndpoint(publishers, opts)
        runner = web.AppRunner(endpoint.app, access_log=None, shutdown_timeout=opts.ack_timeout_s + 5)
        await runner.setup()
        site = web.TCPSite(runner, opts.host, opts.port)
        try:
            await site.start()
            host, port = runner.addresses[0][:2]
            url = f"http://{host}:{port}"
            logger.info("HTTP ingest on %s/v1/events/{%s}", url, ",".join(sources))
            if on_ready:
                on_ready(url)
            await stop.wait()
            endpoint.stopping = True
        finally:
            await runner.cleanup()
    return AdapterSummary(
        "http",
        ",".join(p.topic for p in publishers.values()),
        sum(p.produced for p in publishers.values()),
        sum(p.dead_lettered for p in publishers.values()),
        sum(p.failed for p in publishers.values()),
        {"requests": endpoint.requests},
    )
