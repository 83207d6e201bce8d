"""Drive headless Chromium over the DevTools protocol: load a page, wait for text, screenshot.

Used to check what an operator actually sees on the Streamlit dashboard
(Streamlit renders over a websocket after load, so `chromium --screenshot`
alone captures an empty skeleton). Chromium comes from Debian's package.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websockets

from app.kafka.broker import free_port

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        await self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(await self.ws.recv())
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    async def text(self) -> str:
        res = await self.call("Runtime.evaluate", expression="document.body ? document.body.textContent : ''")
        return str(res.get("result", {}).get("value", ""))


async def _visit(url: str, wait_for: str, timeout_s: float, shot: Path | None, port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as resp:
        targets = json.loads(resp.read())
    ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
    async with websockets.connect(ws_url, max_size=50_000_000) as ws:
        page = Page(ws)
        await page.call("Page.enable")
        await page.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            text = await page.text()
            if wait_for in text:
                break
            await asyncio.sleep(0.5)
        if shot is not None:
            await asyncio.sleep(1.0)  # let the last rerun paint
            data = await page.call("Page.captureScreenshot", format="png")
            shot.write_bytes(base64.b64decode(data["data"]))
        return text


def visit(url: str, wait_for: str, timeout_s: float = 30.0, screenshot: Path | None = None) -> str:
    """Open ``url`` in headless Chromium, wait until ``wait_for`` is in the page text
    (or ``timeout_s``), optionally save a PNG, and return the page text."""
    exe = chromium_path()
    if exe is None:
        msg = "chromium is not installed"
        raise RuntimeError(msg)
    port = free_port()
    # the profile goes even if a Chromium helper wrote to it after the group was gone
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [exe, *CHROMIUM_FLAGS, f"--remote-debugging-port={port}", "--remote-debugging-address=127.0.0.1",
             f"--user-data-dir={profile}", "--window-size=1400,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.2)
            return asyncio.run(_visit(url, wait_for, timeout_s, screenshot, port))
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop Chromium and every helper it started (its own session), and wait until they are
    gone: a renderer still writing to the profile made the profile's removal fail."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                proc.wait(5)
                return
            time.sleep(0.05)
    proc.wait(5)
