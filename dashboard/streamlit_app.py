"""Streamlit page over the alert store: firing alerts, counts, transitions, silences and dead letters.

Run with ``streamlit run dashboard/streamlit_app.py``. It opens the SQLite store at
``Settings.from_env().store_path`` read-only on every refresh (every
``REFRESH_S`` seconds, via ``st.fragment(run_every=...)``), never reads Kafka,
and shows "no alerts yet" while the store is missing or empty. It imports
only the core config and store, never Faust or Spark.
"""

from __future__ import annotations

import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import streamlit as st

from app.config import Settings
from app.errors import ConfigError
from app.store import AlertStore, Counts, CurrentAlert

logger = logging.getLogger(__name__)

REFRESH_S = 2
HISTORY_LIMIT = 50
NO_ALERTS = "no alerts yet"


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def firing_rows(alerts: list[CurrentAlert]) -> list[dict[str, Any]]:
    """One table row per firing alert, most recently started first."""
    return [
        {
            "severity": a.severity,
            "rule": a.rule_id,
            "labels": _labels(a.labels),
            "started": a.starts_at,
            "summary": a.annotations.get("summary", ""),
            "alert_id": a.alert_id,
        }
        for a in alerts
    ]


def count_rows(counts: Counts) -> list[dict[str, Any]]:
    """One row per status with a column per severity, plus the total."""
    severities = sorted(counts.by_severity)
    return [
        {"status": status, **{s: row.get(s, 0) for s in severities}, "total": sum(row.values())}
        for status, row in sorted(counts.matrix.items())
    ]


def history_rows(store: AlertStore, limit: int = HISTORY_LIMIT) -> list[dict[str, Any]]:
    """The latest transitions, newest event first."""
    return [
        {
            "event time": a.event_ts,
            "status": a.status,
            "severity": a.severity,
            "rule": a.rule_id,
            "labels": _labels(a.labels),
            "alert_id": a.alert_id,
        }
        for a in store.history(limit)
    ]


def operator_rows(store: AlertStore) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(active silences, dead letters): what operators muted, and what could not be delivered."""
    now = datetime.now(tz=UTC).isoformat()
    silences = [
        {"id": s["id"], "matchers": " ".join(s["matchers"]), "ends": s["ends_at"], "by": s["created_by"],
         "comment": s["comment"]}
        for s in store.silences(active_at=now)
    ]  # fmt: skip
    dead = [
        {"message": n["msg_id"], "receiver": n["receiver"], "alerts": len(n["alert_ids"]),
         "attempts": n["attempts"], "reason": n["reason"]}
        for n in store.notifications(status="dead", limit=HISTORY_LIMIT)
    ]  # fmt: skip
    return silences, dead


Rows = list[dict[str, Any]]


def load(path: Path) -> tuple[Rows, Rows, Rows, Rows, Rows] | None:
    """(firing, counts, history, silences, dead letters) rows from the store, or None while
    it has nothing to show."""
    try:
        store = AlertStore(path, readonly=True)
    except (FileNotFoundError, sqlite3.Error):
        return None
    try:
        history = history_rows(store)
        if not history:
            return None
        silences, dead = operator_rows(store)
        return firing_rows(store.current("firing")), count_rows(store.counts()), history, silences, dead
    except sqlite3.OperationalError:  # the writer has not created the tables yet
        return None
    finally:
        store.close()


@st.fragment(run_every=REFRESH_S)
def live(path: Path) -> None:
    """The refreshing part of the page."""
    data = load(path)
    if data is None:
        st.info(NO_ALERTS)
        return
    firing, counts, history, silences, dead = data
    st.metric("firing", len(firing))
    st.subheader("Firing alerts")
    if firing:
        st.dataframe(firing, hide_index=True)
    else:
        st.write("nothing is firing")
    st.subheader("Counts by status and severity")
    st.dataframe(counts, hide_index=True, width="content")
    st.subheader("Recent transitions")
    st.dataframe(history, hide_index=True)
    st.subheader("Active silences")
    if silences:
        st.dataframe(silences, hide_index=True)
    else:
        st.write("no active silence (add one with `python -m app alerts silence`)")
    st.subheader("Dead letters")
    if dead:
        st.dataframe(dead, hide_index=True)
    else:
        st.write("no undeliverable notification")


def main() -> None:
    st.set_page_config(page_title="streamalert: alerts", layout="wide")
    st.title("Alerts")
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        st.error(str(exc))
        return
    st.caption(f"alert store {settings.store_path}, refreshed every {REFRESH_S} s")
    live(settings.store_path)


if __name__ == "__main__":
    main()
