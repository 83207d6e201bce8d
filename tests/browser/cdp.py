"""Drive headless Chromium over the DevTools protocol: load a page, wait for text, screenshot.

Used to check what an operator actually sees on the Streamlit dashboard
(Streamlit renders over a websocket after load, so `chromium --screenshot`
alone captures an empty skeleton). Chromium comes from Debian's package.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import websockets

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


def visit(
    url: str, wait_for: str | tuple[str, ...], timeout_s: float = 30.0, screenshot: Path | None = None
) -> str:
    """Open ``url`` in headless Chromium (:func:`browser`), wait until ``wait_for`` (each of
    them) is in the page's text content (or ``timeout_s``), optionally save a PNG, and return
    that text. The text content, not the rendered text: a data grid draws its cells on a
    canvas and keeps them in the DOM for screen readers only."""
    wanted = (wait_for,) if isinstance(wait_for, str) else wait_for

    def content() -> str:
        return str(tab.eval("document.body ? document.body.textContent : ''"))

    with browser() as tab:
        tab.open(url)
        deadline = time.monotonic() + timeout_s
        text = content()
        while not all(w in text for w in wanted) and time.monotonic() < deadline:
            time.sleep(0.5)
            text = content()
        if screenshot is not None:
            time.sleep(1.0)  # let the last rerun paint
            screenshot.write_bytes(tab.png())
        return text


def stop_group(proc: subprocess.Popen[bytes]) -> None:
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


class Tab:
    """One headless Chromium tab driven over CDP, synchronously (its own event loop): open a
    URL, wait for text, type into a labelled input, click a button by its text, choose an
    option of a labelled select, take a screenshot. Made by :func:`browser`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, page: Page) -> None:
        self.loop = loop
        self.page = page

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def eval(self, expression: str) -> Any:
        res = self._run(self.page.call("Runtime.evaluate", expression=expression, returnByValue=True))
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression[:80]}: {res['exceptionDetails']}")
        return res.get("result", {}).get("value")

    def open(self, url: str) -> None:
        self._run(self.page.call("Page.navigate", url=url))

    def text(self) -> str:
        return str(self.eval("document.body ? document.body.innerText : ''"))

    def wait_for(self, predicate_js: str, what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.eval(predicate_js):
                return
            time.sleep(0.3)
        raise AssertionError(
            f"timed out after {timeout_s:.0f} s waiting for {what}; page:\n{self.text()[:3000]}"
        )

    def wait_text(self, text: str, timeout_s: float = 60.0) -> None:
        self.wait_for(
            f"document.body && document.body.innerText.includes({json.dumps(text)})", repr(text), timeout_s
        )

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Until Streamlit's 'Running...' status widget is gone (a rerun finished)."""
        time.sleep(0.4)
        self.wait_for(
            "!document.querySelector('[data-testid=\"stStatusWidget\"]')", "the rerun to finish", timeout_s
        )

    def _key(self, key: str, code: str, vk: int) -> None:
        for kind in ("keyDown", "keyUp"):
            self._run(
                self.page.call(
                    "Input.dispatchKeyEvent", type=kind, key=key, code=code, windowsVirtualKeyCode=vk,
                    nativeVirtualKeyCode=vk,
                )
            )  # fmt: skip

    def type_into(self, label: str, text: str, enter: bool = True) -> None:
        """Focus the input whose aria-label is ``label``, replace its text, press Enter."""
        sel = json.dumps(f'input[aria-label="{label}"], textarea[aria-label="{label}"]')
        self.wait_for(f"!!document.querySelector({sel})", f"the input {label!r}")
        self.eval(f"(() => {{ const e = document.querySelector({sel}); e.focus(); e.select(); }})()")
        self._run(self.page.call("Input.insertText", text=text))
        if enter:
            self._key("Enter", "Enter", 13)

    def click_button(self, label: str) -> None:
        js = (
            "(() => { const b = [...document.querySelectorAll('button')].find("
            f"b => b.innerText.trim() === {json.dumps(label)} && !b.disabled);"
            " if (b) { b.click(); return true; } return false; })()"
        )
        self.wait_for(js, f"an enabled button {label!r}")

    def _wait_still(self, element_js: str, timeout_s: float = 10.0) -> None:
        """Until ``element_js``'s position is the same on two looks 50 ms apart (a scroll ended)."""
        where = f"(() => {{ const r = {element_js}.getBoundingClientRect(); return [r.left, r.top]; }})()"
        deadline = time.monotonic() + timeout_s
        last = self.eval(where)
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.eval(where)
            if now == last:
                return
            last = now
        raise AssertionError(f"{element_js[:80]} kept moving for {timeout_s:.0f} s")

    def choose(self, label: str, option: str, timeout_s: float = 60.0) -> None:
        """Pick ``option`` (its visible text starts with it) in the select labelled ``label``.

        The select is scrolled into view first and focused without scrolling: focusing an
        input near the bottom of the window scrolls Streamlit's main container, and a scroll
        that lands after the dropdown opened closes it (the typed text stays, the options
        are gone). A dropdown that still closes (a rerun) is opened and typed into again."""
        find = (
            "[...document.querySelectorAll('[data-testid=\"stSelectbox\"]')].find(s => "
            f"s.querySelector('label') && s.querySelector('label').innerText.trim() === {json.dumps(label)})"
        )
        self.wait_for(f"!!({find})", f"the select {label!r}", timeout_s)
        pick = (
            "(() => { const o = [...document.querySelectorAll('[role=\"option\"]')].find("
            f"o => o.innerText.trim().startsWith({json.dumps(option)})); if (o) {{ o.click(); return true; }}"
            " return false; })()"
        )
        what = f"the option {option!r} of {label!r}"
        deadline = time.monotonic() + timeout_s
        while True:
            self.eval(f"{find}.scrollIntoView({{block: 'center'}})")
            self._wait_still(find)
            self.eval(
                f"(() => {{ const i = {find}.querySelector('input'); i.focus({{preventScroll: true}});"
                " i.click(); i.select(); })()"
            )
            self._run(self.page.call("Input.insertText", text=option))
            try:
                self.wait_for(pick, what, max(0.5, min(5.0, deadline - time.monotonic())))
                return
            except AssertionError:
                if time.monotonic() >= deadline:
                    raise

    def png(self, clip: dict[str, float] | None = None) -> bytes:
        """A PNG of the viewport, or of ``clip`` (x, y, width, height in CSS pixels, scale)."""
        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            params["clip"] = clip
        data = self._run(self.page.call("Page.captureScreenshot", **params))
        return base64.b64decode(data["data"])

    def screenshot(self, path: Path, width: int = 1280) -> None:
        """A PNG of the page from its top, as high as its content or the window, scaled to
        ``width`` pixels wide.

        Streamlit's page does not scroll: its main container does, inside a window-high body,
        so a capture of the page held the window at wherever the last interaction had scrolled
        that container (the README's pictures showed the bottoms of pages). The container is
        scrolled to its top first; a window made taller for the picture re-laid the page out
        and caught the sidebar sliding back in, so a tall picture wants a tall ``browser``."""
        main = "document.querySelector('[data-testid=\"stMain\"], section.main')"
        blocks = "m.querySelector('[data-testid=\"stMainBlockContainer\"], .block-container')"
        content = self.eval(
            f"(() => {{ const m = {main}; if (!m) return 0; m.scrollTop = 0; const b = {blocks};"
            " return b ? b.getBoundingClientRect().bottom + 16 : m.scrollHeight; })()"
        )
        view = self.eval("({width: window.innerWidth, height: window.innerHeight})")
        height = min(int(view["height"]), max(1, int(content or view["height"])))
        time.sleep(0.5)  # the scroll's repaint
        scale = min(1.0, width / max(1, int(view["width"])))
        clip = {"x": 0, "y": 0, "width": int(view["width"]), "height": height, "scale": scale}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.png(clip=clip))


#: how long Chromium may take to offer its page: its first start on a fresh clone, beside the
#: slow tests' brokers and JVMs, missed 20 s once (a clean-clone gate of 2026-12-02)
START_S = 90


def _page_url(proc: subprocess.Popen[bytes], profile: Path, log: Path) -> str:
    """The DevTools websocket URL of Chromium's page, once it offers one; Chromium picks its
    own free port (``--remote-debugging-port=0``) and writes it to ``DevToolsActivePort`` in
    its profile, so no port chosen here can be taken meanwhile. A Chromium that exits, or has
    no page within :data:`START_S`, fails the test with its own log's end."""

    def failed(why: str) -> RuntimeError:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        return RuntimeError(f"chromium {why}; its log ends:\n{tail}")

    deadline = time.monotonic() + START_S
    port, opened = None, False
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise failed(f"exited with {proc.returncode} before offering its page")
        active = profile / "DevToolsActivePort"
        # its port, then its browser target's path: with both lines there, the port is whole
        if port is None and active.exists() and len(lines := active.read_text().splitlines()) >= 2:
            port = int(lines[0])
        if port is not None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as resp:
                    pages = [t for t in json.loads(resp.read()) if t.get("type") == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
                if not opened:  # its first tab not there (yet): ask for one
                    blank = f"http://127.0.0.1:{port}/json/new?about:blank"
                    tab = urllib.request.Request(blank, method="PUT")
                    with contextlib.suppress(OSError), urllib.request.urlopen(tab, timeout=2):
                        opened = True
            except (OSError, ValueError):
                pass  # not answering yet
        time.sleep(0.2)
    raise failed(f"offered no page within {START_S} s (DevTools port {port})")


@contextlib.contextmanager
def browser(width: int = 1400, height: int = 1000) -> Iterator[Tab]:
    """Headless Chromium with one tab; every process it started is gone afterwards."""
    exe = chromium_path()
    if exe is None:
        msg = "chromium is not installed"
        raise RuntimeError(msg)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as home:
        profile, log = Path(home) / "profile", Path(home) / "chromium.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [exe, *CHROMIUM_FLAGS, "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
                 f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            )  # fmt: skip
        loop = asyncio.new_event_loop()
        try:
            ws_url = _page_url(proc, profile, log)
            ws = loop.run_until_complete(websockets.connect(ws_url, max_size=50_000_000))
            page = Page(ws)
            loop.run_until_complete(page.call("Page.enable"))
            try:
                yield Tab(loop, page)
            finally:
                loop.run_until_complete(ws.close())
        finally:
            loop.close()
            stop_group(proc)
