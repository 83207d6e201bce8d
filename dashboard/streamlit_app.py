"""The operator console: Overview, Alerts, Map, Rules, Silences (pages in :mod:`dashboard.views`).

Run with ``streamlit run dashboard/streamlit_app.py`` (``python -m app run`` starts it on
loopback). The page is chosen in the sidebar or by ``?page=overview|alerts|map|rules|silences``;
``?alert=RULE/FINGERPRINT`` opens an alert's detail. It reads the SQLite alert store at
``Settings.from_env().store_path`` read-only, refreshes the live parts every ``REFRESH_S``
seconds, and shows "no alerts yet" while the store is missing or empty. Who may view and
act: :mod:`dashboard.auth`. Actions publish the very commands the CLI publishes
(:mod:`app.cli.operator`), signed, with the signed-in user as ``by``. It never imports Faust or
Spark; Kafka's client loads only for the pipeline health sampler and when an action is sent.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # `streamlit run dashboard/streamlit_app.py` puts only dashboard/ first
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from app.errors import ConfigError  # noqa: E402
from app.runtime.settings import Settings  # noqa: E402
from dashboard import auth, views  # noqa: E402

logger = logging.getLogger(__name__)

REFRESH_S = 5
#: session-state keys: the last script run's and the last page draw's server-side time
REFRESH_MS = "refresh_ms"
PAGE_MS = "page_ms"
PAGES: dict[str, str] = {
    "overview": "Overview",
    "alerts": "Alerts",
    "map": "Map",
    "rules": "Rules",
    "silences": "Silences",
}


def _page_from_url() -> str:
    wanted = str(st.query_params.get("page", "overview")).lower()
    return PAGES.get(wanted, "Overview")


def _on_page_change() -> None:
    title = st.session_state["page"]
    st.query_params["page"] = next(k for k, v in PAGES.items() if v == title)
    st.session_state.pop("detail", None)
    st.query_params.pop("alert", None)


def main() -> None:
    started = time.perf_counter()
    st.set_page_config(page_title="streamalert console", layout="wide")
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        st.error(str(exc))
        return
    acc = auth.access()
    if acc.banner:
        (st.error if acc.banner.startswith("READ-ONLY") else st.warning)(acc.banner)
    user = auth.sidebar(acc)
    if not acc.loopback and user is None and not acc.read_only:
        st.title("streamalert console")
        st.info("this console is reachable beyond loopback: sign in (sidebar) to view it")
        return
    if "page" not in st.session_state:
        st.session_state["page"] = _page_from_url()
    with st.sidebar:
        page = st.radio("page", list(PAGES.values()), key="page", on_change=_on_page_change)
        live = st.toggle("live refresh", value=True, key="live", help=f"re-read every {REFRESH_S} s")
        st.caption(f"alert store {settings.store_path}")
    renderers: dict[str, Callable[[], None]] = {
        "Overview": lambda: views.overview(settings),
        "Alerts": lambda: views.alerts_page(settings, user),
        "Map": lambda: views.map_page(settings),
        "Rules": lambda: views.rules_page(settings),
        "Silences": lambda: views.silences_page(settings, user),
    }
    render = renderers[page]
    if live and page in ("Overview", "Rules"):
        st.fragment(run_every=REFRESH_S)(timed(render))()
    else:
        timed(render)()
    ms = (time.perf_counter() - started) * 1000
    st.session_state[REFRESH_MS] = ms
    logger.debug("console page %s drawn in %.0f ms", page, ms)


def timed(render: Callable[[], None]) -> Callable[[], None]:
    """``render`` that notes its duration under ``REFRESH_MS`` and shows it in the sidebar
    (a fragment's own reruns are timed too)."""

    def run() -> None:
        t = time.perf_counter()
        render()
        ms = (time.perf_counter() - t) * 1000
        st.session_state[PAGE_MS] = ms
        st.caption(f"refreshed in {ms:.0f} ms")

    return run


if __name__ == "__main__":
    main()
