"""The console's client of the workers' interactive queries (:mod:`agents.state_server`).

Endpoints: ``APP_STATE_URLS`` (comma-separated base URLs), else the ``state`` URL of each
worker in ``APP_DATA_DIR/roles.json``. Any worker answers any key (it forwards to the
owner), so the first endpoint that answers is enough. ``APP_STATE_TOKEN``, when set, goes
in the ``Authorization: Bearer`` header. Never raises: an :class:`Answer` with ``error``
says why there is no state (no worker, a rebalance under way, a timeout).
"""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from app.console.health import read_roles

logger = logging.getLogger(__name__)

TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Answer:
    body: dict[str, Any] = field(default_factory=dict)
    worker: str = ""
    error: str = ""
    status: int = 0


def endpoints(env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    if env.get("APP_STATE_URLS"):
        return [u.strip().rstrip("/") for u in env["APP_STATE_URLS"].split(",") if u.strip()]
    data_dir = Path(env.get("APP_DATA_DIR") or ".data")
    return [r["state"].rstrip("/") for r in read_roles(data_dir) if r.get("state")]


def group_key(labels: Mapping[str, str], rule: Any) -> str:
    """A group's key as the worker spells it: its group-by values joined with ``|`` (in the
    rule's ``group_by`` order); "" for an ungrouped rule."""
    by = tuple(getattr(rule, "group_by", ()) or ())
    return "|".join(str(labels.get(k, "")) for k in by)


def get(base: str, path: str, token: str = "", timeout_s: float = TIMEOUT_S) -> Answer:
    req = urllib.request.Request(base + path)  # noqa: S310 - a configured http URL
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            body = orjson.loads(resp.read())
            return Answer(body, str(body.get("answered_by", base)), status=resp.status)
    except urllib.error.HTTPError as exc:
        try:
            detail = orjson.loads(exc.read()).get("error", "")
        except ValueError:
            detail = ""
        retry = exc.headers.get("Retry-After")
        more = f" (retry after {retry} s)" if retry else ""
        return Answer(error=f"{base} answered {exc.code}: {detail}{more}", status=exc.code)
    except (OSError, ValueError) as exc:
        return Answer(error=f"{base}: {exc}")


def query_state(rule: str, key: str | None, env: Mapping[str, str] | None = None) -> Answer:
    """``GET /state/rules/{rule}`` (key None) or ``/state/rules/{rule}/groups/{key}`` from the
    first worker that answers."""
    env = os.environ if env is None else env
    urls = endpoints(env)
    if not urls:
        return Answer(error="no worker state endpoint (APP_STATE_URLS, or the worker in roles.json)")
    path = f"/state/rules/{urllib.parse.quote(rule, safe='')}"
    if key is not None:
        path += f"/groups/{urllib.parse.quote(key, safe='')}"
    last = Answer(error="no answer")
    for base in urls:
        last = get(base, path, env.get("APP_STATE_TOKEN", ""))
        if not last.error or last.status in (404, 503):
            return last
    return last
