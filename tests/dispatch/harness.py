"""Integration harness: a real HTTP receiver in a background thread, routes files, and the
dispatch role in-process or as a subprocess (for kill -9). Nothing is mocked."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from standardwebhooks import Webhook

from app.alerts import Alert
from app.kafka.broker import KafkaBroker
from app.roles import dispatch as dispatch_role
from app.runtime.settings import Settings
from tests.conftest import make_settings
from tests.dispatch.helpers import SECRET
from tests.kafka_helpers import produce


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def msg_id(self) -> str:
        return self.headers["webhook-id"]

    def alert_ids(self) -> list[str]:
        body: Any = orjson.loads(self.body)
        items = body["alerts"] if isinstance(body, dict) else body
        return [a.get("alert_id", "") for a in items]


@dataclass
class Receiver:
    """Answers every POST with ``status`` after ``delay_s`` and records it (even when the
    client went away). Change ``status``/``delay_s`` at any time, from any thread."""

    status: int = 204
    delay_s: float = 0.0
    by_path: dict[str, int] = field(default_factory=dict)  # path -> status, overrides ``status``
    requests: list[Request] = field(default_factory=list)
    port: int = 0

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _handle(self, request: web.Request) -> web.Response:
        seen = Request(request.path, dict(request.headers), await request.read())
        self.requests.append(seen)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return web.Response(status=self.by_path.get(request.path, self.status), text="answer")

    def verified_ids(self, path: str = "/hook") -> dict[str, set[str]]:
        """alert id -> the webhook-ids it arrived under at ``path``; every signature must verify."""
        out: dict[str, set[str]] = {}
        for r in self.requests:
            if r.path != path:
                continue
            Webhook(SECRET).verify(r.body, r.headers)
            for aid in r.alert_ids():
                out.setdefault(aid, set()).add(r.msg_id)
        return out


@contextmanager
def http_receiver(**kw: Any) -> Iterator[Receiver]:
    """A real aiohttp server on a free 127.0.0.1 port, served from its own thread."""
    rx = Receiver(**kw)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner_box: list[web.AppRunner] = []

    async def start() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", rx._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        rx.port = runner.addresses[0][1]
        runner_box.append(runner)
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        ready.wait(10)
        yield rx
    finally:
        asyncio.run_coroutine_threadsafe(runner_box[0].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def write_routes(
    path: Path, url: str, *, extra_receivers: str = "", route: str = "", delivery: str = ""
) -> Path:
    path.write_text(
        f"""receivers:
  - {{name: ops, type: webhook, url: "{url}", secret: "{SECRET}", timeout: 5s}}
{extra_receivers}
route:
  receiver: ops
  group_by: ['...']
  group_wait: 100ms
  group_interval: 500ms
  repeat_interval: 1h
{route}
delivery:
  max_age: 1h
  retry_base: 100ms
  retry_cap: 500ms
{delivery}
"""
    )
    return path


def publish(bootstrap: str, topic: str, alerts: list[Alert]) -> None:
    produce(bootstrap, topic, [(a.fingerprint.encode(), a.to_json()) for a in alerts])


def run_role(
    settings: Settings, routes: Path, until: Callable[[], bool], timeout_s: float = 30, **kw: Any
) -> float:
    """Run the dispatch role until ``until()`` holds, then stop it; return the stop time in s."""

    async def main() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(dispatch_role.run(settings, stop, routes_file=routes, **kw))
        deadline = time.monotonic() + timeout_s
        while not until():
            assert not task.done(), task.exception()
            assert time.monotonic() < deadline, "condition not reached in time"
            await asyncio.sleep(0.05)
        started = time.monotonic()
        stop.set()
        await asyncio.wait_for(task, 15)
        return time.monotonic() - started

    return asyncio.run(asyncio.wait_for(main(), timeout_s + 30))


def role_settings(broker: KafkaBroker, tmp_path: Path) -> Settings:
    """The dispatch role on the test broker, allowed to post to the local receiver."""
    return make_settings(
        tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_WEBHOOK_ALLOW_PRIVATE="127.0.0.1"
    )


async def until(task: asyncio.Task[None], cond: Callable[[], bool], timeout_s: float = 20) -> None:
    """Wait for ``cond`` while the role ``task`` runs; fail if it ends or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert not task.done(), task.exception()
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)
