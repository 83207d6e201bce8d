"""A real aiohttp server on a free 127.0.0.1 port that answers from a script
and records every request, for notifier tests. No mocks: the notifier talks HTTP."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from aiohttp import web

from app.alerts import Alert

SECRET = "whsec_dGVzdC1zZWNyZXQtZm9yLXRoZS1ub3RpZmllci10ZXN0cw=="


def make_alert(n: int = 1, status: str = "firing", rule_id: str = "cpu_hot", **labels: str) -> Alert:
    """A deterministic alert; ``n`` varies the labels and so the ids."""
    ended = status == "resolved"
    return Alert.build(
        rule_id=rule_id,
        rule_version="3",
        status=status,
        severity="critical",
        labels={"device_id": f"dev-{n}", **labels},
        annotations={"summary": f"device dev-{n} is hot"},
        starts_at="2024-05-01T10:00:00Z",
        ends_at="2024-05-01T10:05:00Z" if ended else None,
        source="sensors",
        event_ts="2024-05-01T10:05:00Z" if ended else "2024-05-01T10:00:00Z",
        values={"temp_c": 91.5 + n},
    )


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class ScriptedServer:
    """Answers POSTs with ``script`` in order (then ``default``); records requests.

    A script entry is ``(status, headers)`` or ``(status, headers, delay_s)``.
    """

    script: list[tuple[int, dict[str, str]] | tuple[int, dict[str, str], float]] = field(default_factory=list)
    default: int = 204
    ssl_context: ssl.SSLContext | None = None
    seen: list[Seen] = field(default_factory=list)
    on_request: Callable[[Seen], None] | None = None
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}/webhook"

    def posts(self, path: str = "/webhook") -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    async def _handle(self, request: web.Request) -> web.Response:
        seen = Seen(request.path, dict(request.headers), await request.read())
        self.seen.append(seen)
        if self.on_request:
            self.on_request(seen)
        if request.path != "/webhook":
            return web.Response(status=204)
        step = self.script.pop(0) if self.script else (self.default, {})
        if len(step) == 3:
            await asyncio.sleep(step[2])
        return web.Response(status=step[0], headers=step[1], text="" if step[0] == 204 else "nope")

    async def __aenter__(self) -> ScriptedServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner:
            await self._runner.cleanup()
