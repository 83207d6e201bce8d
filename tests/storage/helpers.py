"""Helpers of the tests that read the alert store: run the store-sync role until the store
holds what a test waits for."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from contextlib import closing

from app.roles import store_sync
from app.runtime.settings import Settings


def store_answers(settings: Settings, query: str) -> bool:
    """Whether the alert store's file exists and ``query`` (a SQL count) is non-zero on it,
    read-only (the file the store writes, opened as :class:`AlertStore` ``readonly=True`` does)."""
    if not settings.store_path.exists():
        return False
    uri = f"{settings.store_path.resolve().as_uri()}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as conn:
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA busy_timeout=5000")
        return bool(conn.execute(query).fetchone()[0])


def sync_until(settings_env: dict[str, str], done: str) -> None:
    """Run store-sync until the store's ``done`` query (a SQL count) is non-zero."""
    settings = Settings.from_env(settings_env)

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(store_sync.run(settings, stop, poll_ms=100))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if store_answers(settings, done):
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(asyncio.wait_for(run(), 40))
