"""The console's pages: Overview, Alerts (with an alert's detail), Map, Rules, Silences.

Each page reads the alert store through :class:`app.console.queries.ConsoleQueries`
(bounded, indexed queries; one read-only connection per refresh) and never reads a
topic. The pipeline's health comes from a background sampler (:mod:`app.console.health`);
the live rule state of a group from the workers' interactive queries when they answer
(:mod:`app.console.state_client`). Actions publish signed commands, as the CLI does, with
the signed-in user as ``by``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from app.cli.operator import ack_command, publish_command, silence_command, unsilence_command
from app.console import health
from app.console.catalog import Catalog, RuleRow, files_key, load_catalog
from app.console.fleet import COLOURS, fleet, load_registry, registry_path
from app.console.queries import (
    ACTIVE,
    SEVERITY_ORDER,
    ConsoleQueries,
    notified_labels,
    retired,
    severity_rank,
    silence_preview,
    split_matchers,
)
from app.dispatch.commands import Command
from app.errors import ConfigError, RuleConfigError
from app.runtime.settings import Settings
from app.storage.alert_store import CurrentAlert

logger = logging.getLogger(__name__)

NO_ALERTS = "no alerts yet"
SEVERITY_MARK = {"critical": "🔴", "error": "🟠", "warning": "🟡", "info": "🔵"}
STATUS_COLOURS = {"firing": "#dc2626", "pending": "#f59e0b", "no_data": "#6b7280", "resolved": "#16a34a",
                  "inactive": "#9ca3af"}  # fmt: skip


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _queries(path: Path) -> ConsoleQueries | None:
    try:
        q = ConsoleQueries(path)
    except (FileNotFoundError, sqlite3.Error):
        return None
    if not q.has_data():
        q.close()
        return None
    return q


def alert_key(a: CurrentAlert) -> str:
    return f"{a.rule_id}/{a.fingerprint}"


def open_alert(key: str) -> None:
    """Show the detail of alert ``rule_id/fingerprint`` on the Alerts page."""
    st.session_state["page"] = "Alerts"
    st.session_state["detail"] = key
    st.query_params["page"] = "alerts"
    st.query_params["alert"] = key


def _send(settings: Settings, user: str | None, build: Callable[[str], Command]) -> bool:
    """Build a command as ``user`` and publish it; say what was sent or why nothing was."""
    if user is None:
        st.error("sign in first: every action records who did it")
        return False
    try:
        cmd = build(user)
        publish_command(settings, cmd)
    except (ValueError, ConfigError) as exc:
        st.error(f"not sent: {exc}")
        return False
    except Exception as exc:  # the broker is down or slow: say so, keep the page
        logger.exception("publishing a command failed")
        st.error(f"not sent: the commands topic is unreachable ({exc!r})")
        return False
    logger.info("console: %s sent %s %s", user, cmd.type, cmd.cmd_id)
    st.success(f"{cmd.type} sent by {user} ({cmd.cmd_id})")
    return True


# -- overview -------------------------------------------------------------------------------


@st.cache_resource
def _sampler(data_dir: str, bootstrap: str, user: str, _target: Settings) -> health.HealthSampler:
    """One sampler per data dir, cluster and principal (``_target``: the settings, with the
    console's credentials as ``make run`` gives them; unhashed, the three before key it)."""
    return health.HealthSampler(lambda: health.take_sample(Path(data_dir), _target), interval_s=5.0)


def overview_data(path: Path, now: datetime) -> dict[str, Any] | None:
    """The store's part of the Overview: counts, the last hour's rate, the newest event."""
    q = _queries(path)
    if q is None:
        return None
    with q:
        latest = q.alerts(statuses=("firing",), limit=10).rows
        return {"counts": q.counts(), "rate": q.rate(now), "newest": q.newest_event(), "latest": latest}


def overview(settings: Settings) -> None:
    st.header("Overview")
    now = datetime.now(tz=UTC)
    data = overview_data(settings.store_path, now)
    if data is None:
        st.info(NO_ALERTS)
    else:
        firing = data["counts"].get("firing", {})
        sevs = sorted(set(SEVERITY_ORDER) | set(firing), key=severity_rank)
        cols = st.columns(len(sevs) + 1)
        cols[0].metric("firing", sum(firing.values()))
        for col, sev in zip(cols[1:], sevs, strict=True):
            col.metric(sev, firing.get(sev, 0))
        pending = data["counts"].get("pending", {})
        no_data = data["counts"].get("no_data", {})
        st.caption(f"pending {sum(pending.values())}, no data {sum(no_data.values())}")
        if data["latest"]:
            st.markdown("**Latest firing**")
            st.dataframe(_styled(pd.DataFrame(alert_rows(data["latest"], set()))), hide_index=True)
        st.subheader("Alert transitions per minute, last hour")
        if data["rate"]:
            frame = pd.DataFrame(data["rate"])
            frame["minute"] = pd.to_datetime(frame["minute"], utc=True)  # recorded in UTC
            chart = (
                alt.Chart(frame)
                .mark_bar()
                .encode(
                    x=time_x("minute", "recorded (UTC)"),
                    y=alt.Y("n:Q", title="transitions"),
                    color=alt.Color(
                        "status:N",
                        scale=alt.Scale(domain=list(STATUS_COLOURS), range=list(STATUS_COLOURS.values())),
                    ),
                )
                .properties(height=220)
            )
            st.altair_chart(chart, width="stretch")
        else:
            st.write("no transition recorded in the last hour")
    pipeline_health(settings, data["newest"] if data else None)


def pipeline_health(settings: Settings, newest_alert_event: str | None) -> None:
    st.subheader("Pipeline health")
    prev, cur = _sampler(
        str(settings.data_dir), settings.bootstrap_servers, settings.kafka_auth.username, settings
    ).latest()
    if cur is None:
        st.caption("sampling the pipeline (every 5 s)...")
        return
    if cur.roles:
        st.dataframe(
            [{"role": r.name, "state": r.label, "metrics": r.metrics_url or "(none)"} for r in cur.roles],
            hide_index=True,
        )  # fmt: skip
    else:
        st.caption("roles: unknown (no roles.json: the console runs outside `python -m app run`)")
    if cur.error:
        st.warning(f"Kafka: {cur.error}")
        return
    from app.topics import DLQ, SOURCE_TOPICS

    rate = health.rates(prev, cur)
    a, b, c = st.columns(3)
    with a:
        st.markdown("**events/s per topic**")
        st.dataframe(
            [{"topic": t, "events/s": round(rate.get(t, 0.0), 1), "total": cur.ends.get(t, 0)}
             for t in SOURCE_TOPICS.values()],
            hide_index=True,
        )  # fmt: skip
    with b:
        st.markdown("**consumer lag (records)**")
        st.dataframe(
            # one type per column (Arrow refuses ints mixed with "n/a")
            [{"consumer": k, "lag": "n/a" if v is None else f"{v:,}"} for k, v in cur.lag.items()],
            hide_index=True,
        )
    with c:
        st.metric("DLQ records/s", f"{rate.get(DLQ, 0.0):.2f}", help=f"total {cur.ends.get(DLQ, 0)}")
        if cur.newest_event_ms is not None:
            age = time.time() - cur.newest_event_ms / 1000
            st.metric("newest event", f"{age:.0f} s ago")
        elif newest_alert_event:
            st.metric("newest alert event time", newest_alert_event)


# -- alerts ---------------------------------------------------------------------------------


def _styled(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a coloured marker before each severity (a Styler costs ~0.25 ms a row)."""
    if "severity" in frame.columns:
        frame = frame.assign(severity=[f"{SEVERITY_MARK.get(v, '⚪')} {v}" for v in frame["severity"]])
    return frame


def engine_text(engine: str) -> str:
    """An alert's engine(s) as shown: ``faust``, ``spark``, ``faust, spark`` (both produced it),
    or ``unknown`` (recorded before the store kept engines)."""
    return ", ".join(engine.split(",")) if engine else "unknown"


def alert_rows(
    alerts: list[CurrentAlert], acked: set[tuple[str, str]], running: frozenset[tuple[str, str]] | None = None
) -> list[dict[str, Any]]:
    return [
        {
            "severity": a.severity,
            "status": a.status,
            "rule": a.rule_id,
            "engine": engine_text(a.engine),
            "labels": _labels(a.labels),
            "started": a.starts_at,
            "summary": a.annotations.get("summary", ""),
            "acked": (a.fingerprint, a.starts_at) in acked or (a.fingerprint, "") in acked,
            "retired": retired(a, running),
            "key": alert_key(a),
        }
        for a in alerts
    ]


#: time-axis labels in UTC, 24-hour: the date at midnight, seconds only when a tick has some
UTC_LABEL = (
    "utcFormat(datum.value, '%H:%M:%S.%L') == '00:00:00.000' ? utcFormat(datum.value, '%b %d')"
    " : utcFormat(datum.value, '%S.%L') == '00.000' ? utcFormat(datum.value, '%H:%M')"
    " : utcFormat(datum.value, '%H:%M:%S')"
)


def time_x(field: str, title: str) -> alt.X:
    """A time axis in UTC with 24-hour labels. Vega-Lite's own draws a time in the browser's
    zone and labels minutes ``%I:%M``, with no AM or PM: 16:31 read 04:31, under a title
    saying UTC, and an operator's browser elsewhere would shift every time by its offset."""
    return alt.X(f"{field}:T", title=title, scale=alt.Scale(type="utc"), axis=alt.Axis(labelExpr=UTC_LABEL))


SORTS = {
    "newest first": lambda r: "",  # the store's order
    "severity": lambda r: severity_rank(r["severity"]),
    "rule": lambda r: r["rule"],
    "oldest first": lambda r: r["started"],
}


def alerts_page(settings: Settings, user: str | None) -> None:
    st.header("Alerts")
    q = _queries(settings.store_path)
    if q is None:
        st.info(NO_ALERTS)
        return
    with q:
        top = st.columns([4, 2, 1, 1])
        text = top[0].text_input(
            "filter", key="filter", placeholder='severity="critical", device_id=~"pump-.*"',
            help="Alertmanager matchers on the labels (alertname and severity included), comma-separated",
        )  # fmt: skip
        statuses = top[1].multiselect(
            "status", [*ACTIVE, "resolved", "inactive"], default=list(ACTIVE), key="statuses"
        )
        sort = top[2].selectbox("sort", list(SORTS), key="sort")
        try:
            matchers = split_matchers(text)
        except ValueError as exc:
            st.error(f"filter: {exc}")
            return
        page = q.alerts(matchers, statuses or ACTIVE)
        keys = sorted({k for a in page.rows for k in notified_labels(a)} - {"alertname"})
        group_by = top[3].selectbox("group by", ["(none)", "alertname", *keys], key="group_by")
        acked = q.acked(a.fingerprint for a in page.rows)
        rows = alert_rows(page.rows, acked, running_rules(settings))
        if sort != "newest first":
            rows.sort(key=SORTS[sort])
        more = f" (showing {len(rows)})" if page.total > len(rows) else ""
        st.caption(f"{page.total} alert(s) match{more}")
        if not rows:
            st.write("no alert matches")
        elif group_by == "(none)":
            st.dataframe(_styled(pd.DataFrame(rows)), hide_index=True, key="alerts_table")
        else:
            groups: dict[str, list[dict[str, Any]]] = {}
            by_key = {alert_key(a): a for a in page.rows}
            for r in rows:
                groups.setdefault(notified_labels(by_key[r["key"]]).get(group_by, ""), []).append(r)
            for value, members in sorted(groups.items()):
                st.markdown(f"**{group_by}={value or '(empty)'}**: {len(members)}")
                st.dataframe(_styled(pd.DataFrame(members)), hide_index=True)
        options = [r["key"] for r in rows]
        labels_of = {r["key"]: f"{r['severity']} {r['rule']} {r['labels']}" for r in rows}
        wanted = st.session_state.get("detail") or st.query_params.get("alert")
        index = options.index(wanted) if wanted in options else None
        chosen = st.selectbox(
            "open alert", options, index=index, key="open_alert", format_func=lambda k: labels_of.get(k, k),
            placeholder="choose an alert to see why it fired",
        )  # fmt: skip
        key = chosen or (wanted if isinstance(wanted, str) else None)
        if key:
            alert_detail(settings, q, key, user)


def _runbook(annotations: dict[str, str]) -> str | None:
    for k in ("runbook_url", "runbook"):
        if annotations.get(k):
            return annotations[k]
    return None


def alert_detail(settings: Settings, q: ConsoleQueries, key: str, user: str | None) -> None:
    rule_id, _, fp = key.partition("/")
    a = q.alert(rule_id, fp)
    if a is None:
        st.warning(f"alert {key} is not in the store")
        return
    st.divider()
    st.subheader(f"{a.rule_id}: {a.annotations.get('summary', _labels(a.labels))}")
    st.caption(f"status **{a.status}**, severity **{a.severity}**, since {a.starts_at}, rule version "
               f"{a.rule_version}, engine **{engine_text(a.engine)}**, "
               f"fingerprint {a.fingerprint}")  # fmt: skip
    if retired(a, running_rules(settings)):
        st.warning(
            f"Rule {a.rule_id} no longer runs in version {a.rule_version}: it was removed or edited "
            "since this alert fired, and no engine will resolve it. Resolve it by hand: "
            f"`python -m app alerts resolve {a.fingerprint}`, or `python -m app alerts resolve "
            "--retired --yes` for every such alert."
        )
    left, right = st.columns(2)
    with left:
        st.markdown("**Labels**")
        st.table(pd.DataFrame({"value": dict(sorted(notified_labels(a).items()))}))
        st.markdown("**Annotations**")
        for k, v in sorted(a.annotations.items()):
            st.markdown(f"- {k}: {v}")
        book = _runbook(a.annotations)
        if book:
            st.markdown(f"[Runbook]({book})")
        else:
            st.caption("no runbook annotation (add runbook_url to the rule's annotations)")
    with right:
        st.markdown("**Triggering values**")
        st.json(a.values, expanded=True)
    transitions = q.transitions(a.rule_id, a.fingerprint)
    engines = q.engines_of(t.alert_id for t in transitions)
    st.markdown("**Transitions**")
    timeline = pd.DataFrame(
        [{"event time": t.event_ts, "status": t.status, "starts": t.starts_at,
          "engine": engine_text(engines.get(t.alert_id, "")), "alert_id": t.alert_id} for t in transitions]
    )  # fmt: skip
    if not timeline.empty:
        tl = timeline.assign(t=pd.to_datetime(timeline["event time"], utc=True, format="ISO8601"))
        st.altair_chart(
            alt.Chart(tl)
            .mark_circle(size=120)
            .encode(
                x=time_x("t", "event time (UTC)"),
                y=alt.Y("status:N"),
                color=alt.Color(
                    "status:N",
                    scale=alt.Scale(domain=list(STATUS_COLOURS), range=list(STATUS_COLOURS.values())),
                ),
                tooltip=["event time", "status", "alert_id"],
            )
            .properties(height=140),
            width="stretch",
        )
        st.dataframe(timeline, hide_index=True)
    input_chart(settings, a, transitions)
    st.markdown("**Notifications sent**")
    sent = q.notifications_for([t.alert_id for t in transitions])
    if sent:
        st.table(pd.DataFrame(sent).set_index("webhook_id"))
    else:
        st.caption("no notification recorded for this alert (pending, silenced, or not yet delivered)")
    acks = q.acks_of(a.fingerprint)
    if acks:
        st.markdown("**Acks**")
        st.table(pd.DataFrame(acks).set_index("at"))
    with st.form("ack_detail", clear_on_submit=True):
        comment = st.text_input("ack comment", key="ack_comment")
        if st.form_submit_button("Ack", disabled=user is None):
            _send(settings, user, lambda by: ack_command(a, by=by, comment=comment))
    live_state(settings, a)


@st.cache_resource(ttl=30)
def _catalog(rules_dir: str, key: tuple[tuple[str, int, int], ...]) -> Catalog:
    return load_catalog(Path(rules_dir))


def catalog(settings: Settings) -> Catalog:
    return _catalog(str(settings.rules_dir), files_key(settings.rules_dir))


@st.cache_resource(ttl=30)
def _running(rules_dir: str, key: tuple[tuple[str, int, int], ...]) -> frozenset[tuple[str, str]] | None:
    from app.rules.loader import running_versions  # as load_catalog: the compiler, when asked

    try:
        return running_versions([Path(rules_dir)])
    except RuleConfigError:  # the engines keep their last good rules, which the files do not say
        return None


def running_rules(settings: Settings) -> frozenset[tuple[str, str]] | None:
    """The (rule id, version) pairs the engines run from the rule files; None while they do
    not load. Read again when a file changes (``files_key``) or after 30 s."""
    return _running(str(settings.rules_dir), files_key(settings.rules_dir))


@st.cache_data(ttl=30, show_spinner="reading the source topic...")
def _raw_readings(_target: Settings, _plan: Any, key: tuple[Any, ...]) -> tuple[list[dict[str, Any]], str]:
    """The group's readings and the sentence about them, read at most every 30 s per alert
    window (``key``: the target's address and principal, and the plan's fields)."""
    from app.console.readings import describe
    from app.console.source_reader import read_readings

    collect, report = read_readings(_target, _plan)
    return collect.points(), describe(_plan, report, len(collect.readings))


def raw_readings(
    settings: Settings, a: CurrentAlert, rule: RuleRow | None
) -> tuple[list[dict[str, Any]], str]:
    """The rule's input field for the alert's group, read from its source topic around the
    alert (bounded: :mod:`app.console.source_reader`), and what the read met."""
    from dataclasses import astuple

    from app.console.readings import plan_readings
    from app.runtime.credentials import operator_settings

    if rule is None:
        return [], "raw readings not available: the rule is not loaded"
    now_ms = int(time.time() // 30 * 30_000)  # one read per 30 s while the alert is active
    plan = plan_readings(
        source=rule.source, group_by=rule.group_by, field=rule.field, window_ms=rule.window_ms,
        labels=a.labels, starts_at=a.starts_at, ends_at=a.ends_at, now_ms=now_ms,
    )  # fmt: skip
    if isinstance(plan, str):
        return [], f"raw readings not available: {plan}"
    try:
        target = operator_settings(settings)
    except ConfigError as exc:
        return [], f"raw readings not available: {exc}"
    key = (target.bootstrap_servers, target.kafka_auth.username, *astuple(plan))
    return _raw_readings(target, plan, key)


def transition_points(transitions: list[Any], field: str | None) -> list[dict[str, Any]]:
    """The numeric values of ``field`` (all numeric values without one) each transition
    carried, as chart rows."""
    points = []
    for t in transitions:
        for name, value in t.values.items():
            if (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and (field is None or name == field or name.endswith(f"_{field}") or field.endswith(name))
            ):
                points.append({"time": t.event_ts, "field": name, "value": float(value), "status": t.status})
    return points


def input_chart(settings: Settings, a: CurrentAlert, transitions: list[Any]) -> None:
    """The rule's input field for this key around the alert: the raw readings of the group
    from the rule's source topic as a line, the values each transition carried as markers on
    it, and the threshold (a dashed rule) or the window (a band) drawn."""
    rule = catalog(settings).get(a.rule_id)
    field = rule.field if rule else None
    points = transition_points(transitions, field)
    readings, read_note = raw_readings(settings, a, rule)
    st.markdown(f"**Input: {field or 'triggering values'}** around the alert")
    if not points and not readings:
        st.caption("no numeric value recorded with this alert's transitions")
        st.caption(read_note)
        return
    y = alt.Y("value:Q", title=field or "value", scale=alt.Scale(zero=False))
    layers = []
    if readings:
        raw = pd.DataFrame(readings)
        raw["at"] = raw["time"]  # the tooltip's: as recorded, in UTC
        raw["time"] = pd.to_datetime(raw["time"], utc=True, format="ISO8601")
        layers.append(
            alt.Chart(raw).mark_line(color="#64748b", strokeWidth=1.5)
            .encode(x=time_x("time", "event time (UTC)"), y=y, tooltip=["at", "value"])
        )  # fmt: skip
    if points:
        frame = pd.DataFrame(points)
        frame["at"] = frame["time"]
        frame["time"] = pd.to_datetime(frame["time"], utc=True, format="ISO8601")
        layers.append(
            alt.Chart(frame).mark_point(size=90, filled=True)
            .encode(
                x=time_x("time", "event time (UTC)"), y=y,
                color=alt.Color("status:N", scale=alt.Scale(domain=list(STATUS_COLOURS),
                                                            range=list(STATUS_COLOURS.values()))),
                shape="field:N", tooltip=["at", "field", "value", "status"],
            )
        )  # fmt: skip
    if rule is not None and rule.threshold is not None:
        layers.append(
            alt.Chart(pd.DataFrame({"threshold": [rule.threshold]}))
            .mark_rule(color="#dc2626", strokeDash=[6, 4])
            .encode(y="threshold:Q")
        )
    if rule is not None and rule.window_ms:
        start = pd.to_datetime(a.starts_at, utc=True, format="ISO8601")
        band = pd.DataFrame({"from": [start - timedelta(milliseconds=rule.window_ms)], "to": [start]})
        band_x = time_x("from", "event time (UTC)")
        layers.append(alt.Chart(band).mark_rect(opacity=0.15, color="#f59e0b").encode(x=band_x, x2="to:T"))
    st.altair_chart(alt.layer(*layers).properties(height=240), width="stretch")
    what = f"threshold {rule.op} {rule.threshold:g}" if rule and rule.threshold is not None else ""
    if rule and rule.window_ms:
        what = f"window {rule.window_ms / 1000:g} s before the alert started"
    where = rule.where if rule and rule.where else ""
    st.caption(
        f"rule {a.rule_id} ({rule.kind if rule else '?'}): {where} {what}; "
        "line: the raw readings, markers: the values the transitions carried"
    )
    st.caption(read_note)


def live_state(settings: Settings, a: CurrentAlert) -> None:
    """The group's live rule state, from the workers' interactive queries (when they run)."""
    from app.console.state_client import group_key, query_state

    key = group_key(a.labels, catalog(settings).get(a.rule_id))
    st.markdown("**Live rule state** (interactive query to the workers)")
    answer = query_state(a.rule_id, key)
    if answer.error:
        st.caption(f"not available: {answer.error}")
    else:
        st.caption(f"answered by worker {answer.worker}")
        st.json(answer.body, expanded=False)


# -- map ------------------------------------------------------------------------------------


def map_page(settings: Settings) -> None:
    import pydeck as pdk

    st.header("Map")
    registry = load_registry(registry_path(settings.data_dir))
    if not registry:
        st.info(f"no device registry at {registry_path(settings.data_dir)} (set APP_REGISTRY_FILE)")
        return
    q = _queries(settings.store_path)
    states: dict[str, dict[str, Any]] = {}
    if q is not None:
        with q:
            states = q.devices(row["device_id"] for row in registry)
    points = fleet(registry, states)
    devices = pd.DataFrame(
        [{"device_id": p.device_id, "kind": p.kind, "lat": p.lat, "lon": p.lon, "state": p.state,
          "active alerts": p.active, "colour": COLOURS.get(p.state, COLOURS["info"])} for p in points]
    )  # fmt: skip
    depots = pd.DataFrame(
        [{"device_id": p.device_id, "lat": p.depot[0], "lon": p.depot[1],
          "radius_m": (p.geofence_km or 0) * 1000} for p in points if p.depot is not None]
    )  # fmt: skip
    layers = []
    if not depots.empty:
        layers.append(
            pdk.Layer(
                "ScatterplotLayer", data=depots, id="geofences", get_position="[lon, lat]",
                get_radius="radius_m", filled=False, stroked=True, get_line_color=[37, 99, 235, 200],
                line_width_min_pixels=2,
            )
        )  # fmt: skip
        layers.append(
            pdk.Layer(
                "ScatterplotLayer", data=depots, id="depots", get_position="[lon, lat]", get_radius=120,
                get_fill_color=[37, 99, 235, 220], radius_min_pixels=5,
            )
        )  # fmt: skip
    layers.append(
        pdk.Layer(
            "ScatterplotLayer", data=devices, id="devices", get_position="[lon, lat]", get_radius=150,
            get_fill_color="colour", radius_min_pixels=7, pickable=True,
        )
    )  # fmt: skip
    view = pdk.ViewState(
        latitude=float(devices["lat"].mean()), longitude=float(devices["lon"].mean()), zoom=10
    )
    deck = pdk.Deck(layers=layers, initial_view_state=view, map_style=None,
                    tooltip={"text": "{device_id} ({kind}): {state}, {active alerts} active"})  # fmt: skip
    event = st.pydeck_chart(
        deck, on_select="rerun", selection_mode="single-object", key="fleet_map", height=480
    )
    st.caption("red critical, orange error, yellow warning, blue info, green no active alert; "
               "blue rings: depot geofences. Click a device to see its alerts.")  # fmt: skip
    picked = None
    try:
        objs = event.selection.objects.get("devices") or []
        picked = objs[0]["device_id"] if objs else None
    except (AttributeError, KeyError, IndexError, TypeError):
        picked = None
    st.dataframe(devices.drop(columns=["colour"]), hide_index=True)
    choice = st.selectbox("device", list(devices["device_id"]), index=None, key="map_device",
                          placeholder="or choose a device")  # fmt: skip
    device = picked or choice
    if device:
        device_alerts(settings, str(device))


def device_alerts(settings: Settings, device: str) -> None:
    st.subheader(f"Alerts of {device}")
    q = _queries(settings.store_path)
    if q is None:
        st.write("no alert yet")
        return
    with q:
        page = q.alerts(split_matchers(f'device_id="{device}"'), [*ACTIVE, "resolved"])
    if not page.rows:
        st.write("no alert for this device")
        return
    st.dataframe(_styled(pd.DataFrame(alert_rows(page.rows, set()))), hide_index=True)
    for a in page.rows[:10]:
        st.button(f"open {a.rule_id} ({a.status})", key=f"open_{alert_key(a)}", on_click=open_alert,
                  args=(alert_key(a),))  # fmt: skip


# -- rules ----------------------------------------------------------------------------------


def rules_page(settings: Settings) -> None:
    st.header("Rules")
    cat = catalog(settings)
    stats = health.worker_stats(settings.data_dir)
    activity = {}
    q = _queries(settings.store_path)
    if q is not None:
        with q:
            activity = q.rule_activity()
    reloads = stats.get("reloads", {})
    if reloads:
        st.caption("worker reloads: " + ", ".join(f"{k} {v:g}" for k, v in sorted(reloads.items())))
    if cat.rejected:
        st.error(f"last reload: {len(cat.rejected)} file(s) rejected; the worker keeps their last good rules")
    else:
        st.success(f"last reload: {len(cat.rules)} rule(s) from every file loaded")
    rows = []
    for r in cat.rules:
        act = activity.get(r.id)
        rows.append(rule_row(r, act.by_status if act else {}, act.transitions if act else 0, stats, cat))
    st.dataframe(pd.DataFrame(rows), hide_index=True)
    if cat.rejected:
        st.subheader("Rejected files")
        for path, problems in cat.rejected:
            st.markdown(f"**{path}**")
            st.code(problems, language=None)
    st.subheader("Live state")
    chosen = st.selectbox("rule", [r.id for r in cat.rules], index=None, key="state_rule",
                          placeholder="choose a rule to ask the workers for its groups")  # fmt: skip
    if chosen:
        from app.console.state_client import query_state

        answer = query_state(chosen, None)
        if answer.error:
            st.caption(f"not available: {answer.error}")
        else:
            st.caption(f"answered by worker {answer.worker}")
            st.dataframe(answer.body.get("groups", []), hide_index=True)


def _count(value: float | None) -> int | None:
    return None if value is None else int(value)


def rule_row(r: RuleRow, by_status: dict[str, int], transitions: int, stats: dict[str, Any],
             cat: Catalog) -> dict[str, Any]:  # fmt: skip
    fired = stats.get("alerts", {}).get(r.id)
    errors = [p for f, p in cat.rejected for line in p.splitlines() if f": {r.id}: " in line]
    return {
        "rule": r.id,
        "file:line": f"{r.path}:{r.line}",
        "engine": r.engine,
        "version": r.version,
        "kind": r.kind,
        "source": r.source,
        "events evaluated": _count(stats.get("rule_events", {}).get(r.id)),
        "events matched": _count(stats.get("rule_matched", {}).get(r.id)),
        "alerts fired": int(fired) if fired is not None else transitions,
        "firing now": by_status.get("firing", 0),
        "pending": by_status.get("pending", 0),
        "last error": errors[0] if errors else "",
    }


# -- silences and acks ----------------------------------------------------------------------


def silences_page(settings: Settings, user: str | None) -> None:
    st.header("Silences and acks")
    if user is None:
        st.info("sign in (sidebar) to create or expire silences and to ack")
    st.subheader("New silence")
    text = st.text_input(
        "matchers", key="silence_matchers", placeholder='alertname="machine-overheat", device_id=~"pump-.*"'
    )
    cols = st.columns(2)
    duration = cols[0].text_input("duration", value="2h", key="silence_duration")
    comment = cols[1].text_input("comment", key="silence_comment")
    matchers: tuple[Any, ...] = ()
    try:
        matchers = split_matchers(text)
    except ValueError as exc:
        st.error(f"matchers: {exc}")
    q = _queries(settings.store_path)
    if matchers and q is not None:
        with q:
            preview = silence_preview(q, matchers)
        st.markdown(f"**Preview**: this silence would mute {preview.total} current alert(s)")
        if preview.rows:
            st.dataframe(
                _styled(pd.DataFrame(alert_rows(preview.rows, set()))), hide_index=True, key="preview"
            )
    if st.button("Create silence", key="create_silence", disabled=user is None or not matchers):
        _send(settings, user, lambda by: silence_command([str(m) for m in matchers], by=by, comment=comment,
                                                          duration=duration))  # fmt: skip
    st.subheader("Silences")
    if q is None:
        st.write("no silence yet")
        return
    with ConsoleQueries(settings.store_path) as q2:
        now = datetime.now(tz=UTC)
        show_expired = st.toggle("show expired", key="show_expired")
        rows = q2.silences(now, include_expired=show_expired)
    if rows:
        st.dataframe(
            [{"id": r["id"], "matchers": ", ".join(r["matchers"]), "starts": r["starts_at"],
              "ends": r["ends_at"], "active": r["active"], "created by": r["created_by"],
              "comment": r["comment"], "expired by": r["ended_by"] or ""} for r in rows],
            hide_index=True,
        )  # fmt: skip
        active = [r for r in rows if r["active"]]
        by_id = {r["id"]: r for r in active}
        sid = st.selectbox("silence to expire", list(by_id), index=None, key="expire_id",
                           format_func=lambda i: f"{', '.join(by_id[i]['matchers'])} ({i[:8]})")  # fmt: skip
        if st.button("Expire", key="expire", disabled=user is None or sid is None) and sid:
            _send(settings, user, lambda by: unsilence_command(sid, by=by))
    else:
        st.write("no active silence")


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
