"""The console as the browser tests run it: a real Streamlit server on a free loopback port,
started in a directory of the test's (where ``.streamlit/secrets.toml`` may configure OIDC),
stopped with every process it started; and the sidebar's page switch."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from app.kafka.broker import free_port
from app.runtime.settings import PROJECT_ROOT
from tests.browser.cdp import Tab, stop_group
from tests.procs import http_ok


@contextmanager
def run_console(cwd: Path, data: Path, bootstrap: str, port: int | None = None) -> Iterator[str]:
    """Streamlit serving the console on 127.0.0.1 (``port``, else a free one) from ``cwd``,
    over the data dir ``data`` and the broker ``bootstrap``; yields its URL."""
    port = port or free_port()
    env = {
        **os.environ,
        "APP_DATA_DIR": str(data),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "PYTHONPATH": str(PROJECT_ROOT),
    }
    env.pop("APP_STATE_URLS", None)
    log_path = cwd / "streamlit.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(PROJECT_ROOT / "dashboard" / "streamlit_app.py"),
             "--server.port", str(port), "--server.address", "127.0.0.1", "--server.headless", "true",
             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none",
             "--client.toolbarMode", "viewer"],  # as make run serves it: no "Deploy" button
            cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not http_ok(f"{url}/_stcore/health"):
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "streamlit did not become healthy in 60 s"
            time.sleep(0.3)
        yield url
    finally:
        stop_group(proc)


def go_to(tab: Tab, page: str) -> None:
    """Switch the console to ``page`` with the sidebar's radio."""
    tab.wait_for(
        "(() => { const l = [...document.querySelectorAll('[data-testid=\"stSidebar\"] label')]"
        f".find(l => l.innerText.trim() === {orjson.dumps(page).decode()});"
        " if (l) { l.click(); return true; } return false; })()",
        f"the sidebar's {page}",
    )
    tab.wait_idle()
