"""Interactive queries: each rule worker serves its partitions' live rule state over HTTP.

``APP_STATE_PORT`` (0 or unset: off) and ``APP_STATE_ADDR`` (default 127.0.0.1: loopback
only) say where; ``APP_STATE_TOKEN``, when set, must come as ``Authorization: Bearer
<token>`` on every request (and is passed on when a request is forwarded). The API and
its JSON forms are in docs/interactive-queries.md:

- ``GET /state/rules/{rule}?offset=0&limit=100``: the rule's groups, every worker's, sorted
  by key, one page;
- ``GET /state/rules/{rule}/groups/{key}``: one group (``key``: its ``group_by`` values in
  order, joined with ``|``), in the form :func:`agents.state_view.describe` gives.

Any worker answers any key. The owning partition comes from the worker's own placement
(:func:`app.rules.evaluator.partition_for` of the group's key, as the events are keyed);
the owning member from the group's assignment: each worker's ``canonical_url`` is set to
this server's URL, and Faust's partition assignor hands every member the map of each
member's URL to its table (changelog) partitions in the assignment's userdata. A request
for another worker's key is forwarded there once (``X-State-Forwarded``), and the answer
says which worker answered (``answered_by``). While the group rebalances, a table is
being restored, or the owner cannot be reached, the answer is 503 with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import ClientError, ClientSession, ClientTimeout, web

from agents.state_view import describe
from app.placement import partition_for
from app.rules.state import stamp
from app.rules.statekey import SEPARATOR, StateKey, group_text

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 2
FORWARD_TIMEOUT_S = 3.0
MAX_PAGE = 1000
KEY_SEPARATOR = "|"
FORWARDED = "X-State-Forwarded"


@dataclass(frozen=True)
class StateConfig:
    addr: str
    port: int
    token: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StateConfig:
        env = os.environ if env is None else env
        return cls(env.get("APP_STATE_ADDR") or "127.0.0.1", int(env.get("APP_STATE_PORT") or 0),
                   env.get("APP_STATE_TOKEN", ""))  # fmt: skip

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "") else self.addr  # noqa: S104 - reachable form
        return f"http://{host}:{self.port}"


class Unavailable(Exception):
    """The state cannot be read now (rebalance, restore, owner unreachable): answer 503."""


@dataclass(frozen=True)
class Located:
    rule: Any  # CompiledRule
    stream: Any  # Stream
    store: Any  # TableStore
    changelog: str


class StateServer:
    """The HTTP server over one worker's :class:`agents.wiring.Runtime` (``rt``)."""

    def __init__(self, app: Any, rt: Any, config: StateConfig) -> None:
        self.app = app
        self.rt = rt
        self.config = config
        self.me = config.url
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None

    # -- reading the runtime ----------------------------------------------------------------

    def locate(self, rule_id: str) -> Located | None:
        for source, streams in self.rt.engine.streams.items():
            for s in streams:
                rule = s.evaluator.by_id.get(rule_id)
                if rule is not None:
                    store = self.rt.stores[source if s.fields is None else f"{source}.regroup"]
                    return Located(rule, s, store, store.topic)
        return None

    def busy(self) -> str:
        """Why the state cannot be read here now ("" when it can)."""
        if getattr(self.app, "rebalancing", False):
            return "the group is rebalancing"
        if getattr(self.app, "in_recovery", False):
            return "the worker is restoring its tables"
        return ""

    def owner(self, changelog: str, partition: int) -> str | None:
        """The URL of the member that holds ``changelog``'s ``partition`` (None: unknown)."""
        try:
            table_map = self.app.assignor.table_metadata(changelog)
        except Exception:  # no assignment yet
            return None
        for url, topics in table_map.items():
            if partition in topics.get(changelog, ()):
                return str(url).rstrip("/")
        return None

    def view(self, loc: Located, key: str, record: Any) -> dict[str, Any]:
        rule = loc.rule
        logic = loc.stream.evaluator.logics.get(rule.id)
        window = rule.rule.window
        steps = tuple(s.name for s in rule.rule.sequence)
        body = describe(
            rule.rule.kind, record, window_ms=(window.size or window.gap) if window is not None else None,
            results=getattr(logic, "results", None), step_names=steps,
        )  # fmt: skip
        group = list(StateKey.parse(key).group)
        return {
            "rule": rule.id,
            "key": KEY_SEPARATOR.join(group),
            "group": dict(zip(rule.rule.group_by, group, strict=False)),
            **body,
        }

    def local_group(self, loc: Located, group: list[str]) -> dict[str, Any] | None:
        key = StateKey(loc.rule.id, tuple(group)).encode()
        record = loc.store.live.get(key)
        if record is None or (
            isinstance(record, Mapping) and record.get("version") != stamp(loc.rule.version)
        ):
            return None
        return self.view(loc, key, record)

    def local_groups(self, loc: Located) -> list[dict[str, Any]]:
        prefix = loc.rule.id + SEPARATOR
        out = []
        for key, record in list(loc.store.live.items()):
            if (key == loc.rule.id or key.startswith(prefix)) and (
                not isinstance(record, Mapping) or record.get("version") == stamp(loc.rule.version)
            ):
                out.append(self.view(loc, key, record))
        return out

    # -- HTTP -----------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        if not self.config.token:
            return True
        got = request.headers.get("Authorization", "")
        return hmac.compare_digest(got, f"Bearer {self.config.token}")

    def _json(self, body: dict[str, Any], status: int = 200, retry: bool = False) -> web.Response:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if retry else None
        return web.Response(body=orjson.dumps(body), status=status, content_type="application/json",
                            headers=headers)  # fmt: skip

    async def _forward(self, url: str, request: web.Request) -> web.Response:
        if request.headers.get(FORWARDED):
            msg = "the assignment is changing (a forwarded request reached a non-owner)"
            raise Unavailable(msg)
        if self._session is None:
            self._session = ClientSession(timeout=ClientTimeout(total=FORWARD_TIMEOUT_S))
        headers = {FORWARDED: self.me}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        try:
            async with self._session.get(url + request.rel_url.path_qs, headers=headers) as resp:
                raw = await resp.read()
                out = web.Response(body=raw, status=resp.status, content_type="application/json")
                if "Retry-After" in resp.headers:
                    out.headers["Retry-After"] = resp.headers["Retry-After"]
                return out
        except (ClientError, TimeoutError) as exc:
            msg = f"the owner {url} did not answer ({exc!r})"
            raise Unavailable(msg) from None

    async def group(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._json({"error": "missing or wrong bearer token"}, 401)
        rule_id = request.match_info["rule"]
        group = urllib.parse.unquote(request.match_info["key"]).split(KEY_SEPARATOR)
        loc = self.locate(rule_id)
        if loc is None:
            return self._json({"error": f"no rule {rule_id!r} is loaded"}, 404)
        if not loc.rule.rule.group_by:
            group = []
        partition = partition_for(group_text(group).encode(), self.rt.settings.partitions)
        try:
            if why := self.busy():
                raise Unavailable(why)
            owner = self.owner(loc.changelog, partition)
            if owner is None:
                msg = f"no member holds partition {partition} yet"
                raise Unavailable(msg)
            if owner != self.me:
                return await self._forward(owner, request)
            body = self.local_group(loc, group)
        except Unavailable as exc:
            return self._json({"error": str(exc), "answered_by": self.me}, 503, retry=True)
        if body is None:
            return self._json({"error": "no state for this group", "rule": rule_id,
                               "key": KEY_SEPARATOR.join(group), "partition": partition,
                               "answered_by": self.me}, 404)  # fmt: skip
        return self._json({**body, "answered_by": self.me})

    async def rule(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._json({"error": "missing or wrong bearer token"}, 401)
        rule_id = request.match_info["rule"]
        loc = self.locate(rule_id)
        if loc is None:
            return self._json({"error": f"no rule {rule_id!r} is loaded"}, 404)
        try:
            offset = max(0, int(request.query.get("offset", "0")))
            limit = min(MAX_PAGE, max(1, int(request.query.get("limit", "100"))))
        except ValueError:
            return self._json({"error": "offset and limit must be integers"}, 400)
        if why := self.busy():
            return self._json({"error": why, "answered_by": self.me}, 503, retry=True)
        groups = self.local_groups(loc)
        workers = [self.me]
        if request.query.get("local") != "1":
            try:
                table_map = self.app.assignor.table_metadata(loc.changelog)
            except Exception:
                table_map = {}
            for url in sorted({str(u).rstrip("/") for u in table_map} - {self.me}):
                peer = await self._peer_groups(url, rule_id)
                if peer is None:
                    return self._json({"error": f"worker {url} did not answer", "answered_by": self.me}, 503,
                                      retry=True)  # fmt: skip
                groups += peer
                workers.append(url)
        groups.sort(key=lambda g: g["key"])
        page = [{k: g[k] for k in ("key", "status", "partition")} for g in groups[offset : offset + limit]]
        return self._json({"rule": rule_id, "kind": loc.rule.rule.kind, "total": len(groups),
                           "offset": offset, "limit": limit, "groups": page, "workers": workers,
                           "answered_by": self.me})  # fmt: skip

    async def _peer_groups(self, url: str, rule_id: str) -> list[dict[str, Any]] | None:
        if self._session is None:
            self._session = ClientSession(timeout=ClientTimeout(total=FORWARD_TIMEOUT_S))
        headers = {FORWARDED: self.me}
        if self.config.token:
            headers["Authorization"] = f"Bearer {self.config.token}"
        path = f"/state/rules/{urllib.parse.quote(rule_id, safe='')}?local=1&limit={MAX_PAGE}&all=1"
        try:
            async with self._session.get(url + path, headers=headers) as resp:
                if resp.status != 200:
                    return None
                body = orjson.loads(await resp.read())
                return list(body.get("all_groups", body.get("groups", [])))
        except (ClientError, TimeoutError, ValueError):
            return None

    async def start(self) -> None:
        web_app = web.Application()
        web_app.router.add_get("/state/rules/{rule}", self._rule_or_all)
        web_app.router.add_get("/state/rules/{rule}/groups/{key}", self.group)
        self._runner = web.AppRunner(web_app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.addr, self.config.port)
        await site.start()
        logger.info("interactive queries on %s/state/rules/RULE", self.me)

    async def _rule_or_all(self, request: web.Request) -> web.Response:
        """``local=1&all=1`` (a peer's fan-out): every local group, unpaged."""
        if request.query.get("local") == "1" and request.query.get("all") == "1":
            if not self._authorized(request):
                return self._json({"error": "missing or wrong bearer token"}, 401)
            loc = self.locate(request.match_info["rule"])
            if loc is None:
                return self._json({"error": "no such rule"}, 404)
            if why := self.busy():
                return self._json({"error": why}, 503, retry=True)
            return self._json({"all_groups": self.local_groups(loc), "answered_by": self.me})
        return await self.rule(request)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()


def attach(app: Any, rt: Any) -> StateServer | None:
    """Serve ``rt``'s state from ``app`` when ``APP_STATE_PORT`` is set: the one hook
    :func:`agents.wiring.build_app` calls. Sets the app's ``canonical_url`` to this server's
    URL, which the partition assignor shares with the group."""
    config = StateConfig.from_env()
    if config.port <= 0:
        return None
    server = StateServer(app, rt, config)
    app.conf.canonical_url = config.url

    @app.task
    async def _serve_state() -> None:
        await server.start()
        try:
            await asyncio.Event().wait()  # until the worker stops (the task is cancelled)
        finally:
            await server.stop()

    return server
