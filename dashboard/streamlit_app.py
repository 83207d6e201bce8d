"""Streamlit page over the alert store: firing, pending and no-data alerts, counts, transitions,
silences and dead letters, plus ack, silence and unsilence actions.

Run with ``streamlit run dashboard/streamlit_app.py``. It opens the SQLite store at
``Settings.from_env().store_path`` read-only on every refresh (every
``REFRESH_S`` seconds, via ``st.fragment(run_every=...)``), never reads Kafka,
and shows "no alerts yet" while the store is missing or empty. The action
forms publish the very commands the CLI publishes (:mod:`app.cli.operator`) to
the ``commands`` topic; the Kafka client is imported only when a button is
pressed. It never imports Faust or Spark.
"""

from __future__ import annotations

import getpass
import logging
import shlex
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import streamlit as st

from app.cli.operator import ack_command, publish_command, silence_command, unsilence_command
from app.dispatch.commands import Command
from app.errors import ConfigError
from app.runtime.settings import Settings
from app.storage.alert_store import AlertStore, Counts, CurrentAlert

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


def waiting_rows(store: AlertStore) -> Rows:
    """Alerts that are pending (``for`` not over) or have no data: recorded, never notified."""
    return [
        {
            "status": a.status,
            "severity": a.severity,
            "rule": a.rule_id,
            "labels": _labels(a.labels),
            "since": a.starts_at,
            "alert_id": a.alert_id,
        }
        for status in ("pending", "no_data")
        for a in store.current(status)
    ]


def load(path: Path) -> tuple[Rows, Rows, Rows, Rows, Rows, Rows] | None:
    """(firing, pending/no data, counts, history, silences, dead letters) rows from the store,
    or None while it has nothing to show."""
    try:
        store = AlertStore(path, readonly=True)
    except (FileNotFoundError, sqlite3.Error):
        return None
    try:
        history = history_rows(store)
        if not history:
            return None
        silences, dead = operator_rows(store)
        return (
            firing_rows(store.current("firing")),
            waiting_rows(store),
            count_rows(store.counts()),
            history,
            silences,
            dead,
        )
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
    firing, waiting, counts, history, silences, dead = data
    st.metric("firing", len(firing))
    st.subheader("Firing alerts")
    if firing:
        st.dataframe(firing, hide_index=True)
    else:
        st.write("nothing is firing")
    st.subheader("Pending and no data (not notified)")
    if waiting:
        st.dataframe(waiting, hide_index=True)
    else:
        st.write("nothing pending, every group reports")
    st.subheader("Counts by status and severity")
    st.dataframe(counts, hide_index=True, width="content")
    st.subheader("Recent transitions")
    st.dataframe(history, hide_index=True)
    st.subheader("Active silences")
    if silences:
        st.dataframe(silences, hide_index=True)
    else:
        st.write("no active silence (add one below or with `python -m app alerts silence`)")
    st.subheader("Dead letters")
    if dead:
        st.dataframe(dead, hide_index=True)
    else:
        st.write("no undeliverable notification")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


def _send(settings: Settings, build: Callable[[], Command]) -> None:
    """Build a command and publish it; show what was sent, or why nothing was."""
    try:
        cmd = build()
        publish_command(settings, cmd)
    except (ValueError, ConfigError) as exc:
        st.error(f"not sent: {exc}")
        return
    except Exception as exc:  # the broker is down or slow: say so, keep the page
        logger.exception("publishing a command failed")
        st.error(f"not sent: the commands topic is unreachable ({exc!r})")
        return
    st.success(f"{cmd.type} sent ({cmd.cmd_id})")


def _choices(path: Path) -> tuple[list[CurrentAlert], list[dict[str, Any]]]:
    """(firing alerts, active silences) for the action forms; empty without a store."""
    try:
        with AlertStore(path, readonly=True) as store:
            return store.current("firing"), store.silences(active_at=datetime.now(tz=UTC).isoformat())
    except (FileNotFoundError, sqlite3.Error):
        return [], []


def actions(settings: Settings) -> None:
    """Ack, silence and unsilence forms; each press publishes one command, as the CLI does."""
    firing, silences = _choices(settings.store_path)
    st.subheader("Actions")
    ack, silence, unsilence = st.columns(3)
    with ack.form("ack", clear_on_submit=True):
        st.markdown("**Acknowledge** a firing alert")
        by_fp = {a.fingerprint: a for a in firing}
        fp = st.selectbox(
            "alert",
            list(by_fp),
            key="ack_alert",
            format_func=lambda f: f"{by_fp[f].rule_id} {_labels(by_fp[f].labels)} ({f[:8]})",
        )
        by = st.text_input("by", value=_user(), key="ack_by")
        comment = st.text_input("comment", key="ack_comment")
        if st.form_submit_button("Ack") and fp is not None:
            _send(settings, lambda: ack_command(by_fp[fp], by=by, comment=comment))
    with silence.form("silence", clear_on_submit=True):
        st.markdown("**Silence** alerts matching")
        matchers = st.text_input(
            "matchers", key="silence_matchers", placeholder='device_id=~"pump-.*" severity=warning'
        )
        duration = st.text_input("duration", value="2h", key="silence_duration")
        creator = st.text_input("creator", value=_user(), key="silence_by")
        note = st.text_input("comment", key="silence_comment")
        if st.form_submit_button("Silence"):
            _send(
                settings,
                lambda: silence_command(shlex.split(matchers), by=creator, comment=note, duration=duration),
            )
    with unsilence.form("unsilence", clear_on_submit=True):
        st.markdown("**Unsilence** (end a silence now)")
        by_id = {s["id"]: s for s in silences}
        sid = st.selectbox(
            "silence",
            list(by_id),
            key="unsilence_id",
            format_func=lambda i: f"{' '.join(by_id[i]['matchers'])} until {by_id[i]['ends_at']} ({i[:8]})",
        )
        who = st.text_input("by", value=_user(), key="unsilence_by")
        if st.form_submit_button("Unsilence") and sid is not None:
            _send(settings, lambda: unsilence_command(sid, by=who))


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
    actions(settings)


if __name__ == "__main__":
    main()
