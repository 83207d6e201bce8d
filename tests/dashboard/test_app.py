"""The console with streamlit's AppTest against a real store in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import streamlit as st
from prometheus_client import CollectorRegistry, Counter, start_http_server
from streamlit import config
from streamlit.testing.v1 import AppTest

from app.console.health import write_roles_file
from app.dispatch.commands import AckCommand, SilenceCommand, UnsilenceCommand, parse_command
from app.kafka.broker import KafkaBroker, free_port
from app.runtime.settings import PROJECT_ROOT
from app.storage.alert_store import AlertStore
from app.topics import ALERTS, COMMANDS
from tests.console_helpers import PASSWORD, add_user, make_alert, seed, seed_with_a_running_rule
from tests.dispatch.harness import publish
from tests.kafka_helpers import consume_json, produce
from tests.storage.helpers import sync_until

APP = PROJECT_ROOT / "dashboard" / "streamlit_app.py"


@pytest.fixture(autouse=True)
def _loopback_after() -> Iterator[None]:
    yield
    config.set_option("server.address", "")


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("APP_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("APP_USERS_FILE", raising=False)
    monkeypatch.delenv("APP_STATE_URLS", raising=False)
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


def run_page(page: str = "overview", address: str = "127.0.0.1", **params: str) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["page"] = page
    for k, v in params.items():
        at.query_params[k] = v
    config.set_option("server.address", address)
    at.run()
    assert not at.exception, at.exception
    return at


def sign_in(at: AppTest, name: str = "ann", password: str = PASSWORD) -> AppTest:
    at.text_input(key="sign_in_user").input(name)
    at.text_input(key="sign_in_password").input(password)
    next(b for b in at.button if b.label == "Sign in").click().run()
    assert not at.exception, at.exception
    return at


def test_missing_or_empty_store_says_no_alerts_yet(data_dir: Path) -> None:
    at = run_page()
    assert "no alerts yet" in [i.value for i in at.info]
    AlertStore(data_dir / "alerts.sqlite3").close()
    at = run_page("alerts")
    assert "no alerts yet" in [i.value for i in at.info]


def test_overview_counts_firing_by_severity(data_dir: Path) -> None:
    seed(data_dir / "alerts.sqlite3")
    at = run_page()
    metrics = {m.label: m.value for m in at.metric}
    assert (metrics["firing"], metrics["critical"], metrics["warning"]) == ("3", "1", "2")
    assert any("Pipeline health" in s.value for s in at.subheader)
    # the transitions per minute: times drawn in UTC with 24-hour labels. Vega-Lite's own axis
    # drew the browser's zone as %I:%M (16:31 read 04:31) under the title "recorded (UTC)"
    (chart,) = at.get("vega_lite_chart")
    x = orjson.loads(chart.proto.spec)["encoding"]["x"]
    assert (x["title"], x["scale"]) == ("recorded (UTC)", {"type": "utc"})
    assert "utcFormat(datum.value, '%H:%M')" in x["axis"]["labelExpr"] and "%I" not in x["axis"]["labelExpr"]


def test_alerts_filter_group_and_detail(data_dir: Path) -> None:
    seed(data_dir / "alerts.sqlite3")
    at = run_page("alerts")
    assert at.dataframe[0].value.shape[0] == 3  # pump-7, pump-9, vehicle-01 (fan-1 is resolved)
    shown = at.dataframe[0].value
    engines = dict(zip(shown["labels"].str.split(",").str[0], shown["engine"], strict=True))
    assert engines == {"device_id=pump-7": "faust", "device_id=pump-9": "faust",
                       "device_id=vehicle-01": "spark"}  # fmt: skip
    at.text_input(key="filter").input('severity="critical", device_id=~"pump-.*"').run()
    (table,) = [d.value for d in at.dataframe]
    assert list(table["labels"]) == ["device_id=pump-7, team=plant-ops"]
    at.text_input(key="filter").input("device_id~bad").run()
    assert "filter:" in at.error[0].value and "device_id~bad" in at.error[0].value
    at.text_input(key="filter").input("").run()
    at.selectbox(key="group_by").select("severity").run()
    assert {m.value for m in at.markdown} >= {"**severity=critical**: 1", "**severity=warning**: 2"}
    at.selectbox(key="open_alert").select_index(0).run()
    assert not at.exception


def test_alert_detail_shows_runbook_values_transitions_and_notifications(data_dir: Path) -> None:
    alerts = seed(data_dir / "alerts.sqlite3")
    pump = alerts[1]
    at = run_page("alerts", alert=f"{pump.rule_id}/{pump.fingerprint}")
    md = [m.value for m in at.markdown]
    assert "[Runbook](https://runbooks.example/overheat)" in md
    assert "**Input: temperature** around the alert" in md
    frames = [d.value for d in at.dataframe]
    timeline = next(f for f in frames if "event time" in f.columns)
    assert list(timeline["status"]) == ["pending", "firing"]
    (sent,) = [t.value for t in at.table if t.value.index.name == "webhook_id"]
    assert list(sent.index) == ["wh-123"] and list(sent["receiver"]) == ["ops"]
    assert list(sent["updated_at"]) == ["2024-05-01T10:00:30.000Z"]  # not Unix seconds
    assert at.json[0].value == '{"temperature": 104.0}'
    assert any("threshold > 100" in c.value for c in at.caption)
    assert any("engine **faust**" in c.value for c in at.caption)
    assert list(timeline["engine"]) == ["faust", "faust"]
    vehicle = alerts[5]
    at = run_page("alerts", alert=f"{vehicle.rule_id}/{vehicle.fingerprint}")
    assert any("engine **spark**" in c.value for c in at.caption)


def test_alerts_whose_rule_was_removed_or_edited_are_marked_retired_with_the_remedy(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No engine ends an alert open under a rule version that no longer runs (docs/rules.md,
    hot reload): the list says which, and the detail says how to end it."""
    rules = tmp_path / "rules"
    monkeypatch.setenv("APP_RULES_DIR", str(rules))
    alerts, running = seed_with_a_running_rule(data_dir, rules)
    at = run_page("alerts")
    (table,) = [d.value for d in at.dataframe]
    marked = dict(zip(table["labels"].str.split(",").str[0], table["retired"], strict=True))
    assert marked == {"device_id=pump-1": False, "device_id=pump-7": True, "device_id=pump-9": True,
                      "device_id=vehicle-01": True}  # fmt: skip
    pump7 = alerts[1]
    at = run_page("alerts", alert=f"{pump7.rule_id}/{pump7.fingerprint}")
    (warning,) = [w.value for w in at.warning if "no longer runs" in w.value]
    assert "Rule machine-overheat no longer runs in version 2" in warning
    assert f"python -m app alerts resolve {pump7.fingerprint}" in warning
    at = run_page("alerts", alert=f"machine-overheat/{running}")
    assert not [w for w in at.warning if "no longer runs" in w.value]
    (rules / "iot.yaml").write_text("rules: [")  # the files do not load: nothing is said
    at = run_page("alerts", alert=f"{pump7.rule_id}/{pump7.fingerprint}")
    assert not [w for w in at.warning if "no longer runs" in w.value]


def test_actions_need_a_signed_in_user_and_record_them(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    seed(data_dir / "alerts.sqlite3")
    at = run_page("silences")
    assert "read-only" in at.warning[0].value  # no users file yet: nobody can act
    add_user(data_dir)
    at = run_page("silences")
    at.text_input(key="silence_matchers").input('device_id=~"pump-.*"').run()
    assert any("would mute 2 current alert(s)" in m.value for m in at.markdown)
    assert at.button(key="create_silence").disabled
    sign_in(at, password="wrong password")
    assert [e.value for e in at.error] == ["wrong user or password"]
    sign_in(at)
    assert any(m.value == "signed in as **ann**" for m in at.sidebar.markdown)
    at.button(key="create_silence").click().run()
    (error,) = [e.value for e in at.error]  # no broker, and no `make run` up on the data dir
    assert error.startswith("not sent: KAFKA_BOOTSTRAP_SERVERS is not set and no `make run` is up on")


def test_beyond_loopback_without_users_runs_read_only_and_says_so(data_dir: Path) -> None:
    seed(data_dir / "alerts.sqlite3")
    at = run_page("alerts", address="0.0.0.0")  # beyond loopback: the case under test
    assert at.error[0].value.startswith("READ-ONLY: this console is bound beyond loopback")
    add_user(data_dir)
    at = run_page("alerts", address="0.0.0.0")
    assert "sign in (sidebar) to view it" in at.info[0].value and not at.dataframe
    sign_in(at)
    assert at.dataframe


def test_rules_and_map_pages(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed(data_dir / "alerts.sqlite3")
    (data_dir / "fleet-devices.csv").write_text(
        "device_id,kind,lat,lon,depot_lat,depot_lon,geofence_km\n"
        "pump-7,thermometer,48.1,11.5,,,\nvehicle-01,vehicle,,,48.15,11.6,5\n"
    )
    port = free_port()
    reg = CollectorRegistry()
    Counter("worker_rule_events_total", "x", ["rule"], registry=reg).labels("machine-overheat").inc(120)
    Counter("worker_rule_matched_total", "x", ["rule"], registry=reg).labels("machine-overheat").inc(7)
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        write_roles_file(data_dir, [{"name": "worker", "metrics": f"http://127.0.0.1:{port}/metrics"}])
        at = run_page("rules")
    finally:
        server.shutdown()
        thread.join(5)
    rules = at.dataframe[0].value.set_index("rule")
    assert rules.loc["machine-overheat", "file:line"].endswith("rules/iot.yaml:4")
    assert rules.loc["machine-overheat", "firing now"] == 2  # pump-7, pump-9
    overheat = rules.loc["machine-overheat"]
    assert (overheat["events evaluated"], overheat["events matched"]) == (120, 7)
    assert rules["events evaluated"].isna().sum() == len(rules) - 1  # the rules the worker did not report
    at = run_page("map")
    devices = at.dataframe[0].value.set_index("device_id")
    assert devices.loc["pump-7", "state"] == "critical"
    assert (devices.loc["vehicle-01", "lat"], devices.loc["vehicle-01", "state"]) == (48.2, "warning")
    at.selectbox(key="map_device").select("pump-7").run()
    assert any(s.value == "Alerts of pump-7" for s in at.subheader)


@pytest.mark.slow
@pytest.mark.integration
def test_runs_from_its_own_folder_like_streamlit_without_faust_or_spark(tmp_path: Path) -> None:
    # `streamlit run dashboard/streamlit_app.py` puts dashboard/ first on sys.path (a module
    # named app.py there would shadow the `app` package); run the page the same way.
    probe = (
        "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
        "runpy.run_path(sys.argv[2], run_name='__main__'); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('faust', 'pyspark', 'aiokafka')); "
        "print('imported:', bad)"
    )
    env = {**os.environ, "APP_DATA_DIR": str(tmp_path), "PYTHONPATH": str(PROJECT_ROOT)}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    out = subprocess.run(
        [sys.executable, "-c", probe, str(APP.parent), str(APP)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "imported: []" in out.stdout


@pytest.mark.slow
@pytest.mark.integration
def test_ack_silence_and_expire_publish_signed_commands_by_the_signed_in_user(
    data_dir: Path, broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
    env = {"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "APP_DATA_DIR": str(data_dir)}
    hot = make_alert("pump-7", "firing")
    publish(broker.bootstrap, ALERTS, [hot])
    sync_until(env, "SELECT COUNT(*) FROM alerts")
    add_user(data_dir)

    at = sign_in(run_page("alerts", alert=f"{hot.rule_id}/{hot.fingerprint}"))
    at.text_input(key="ack_comment").input("on it")
    next(b for b in at.button if b.label == "Ack").click().run()
    assert not at.error and len(at.success) == 1
    sync_until(env, "SELECT COUNT(*) FROM acks")

    at = sign_in(run_page("silences"))
    at.text_input(key="silence_matchers").input('device_id=~"pump-.*" severity=critical').run()
    at.text_input(key="silence_duration").input("30m").run()
    at.button(key="create_silence").click().run()
    assert not at.error and len(at.success) == 1
    sync_until(env, "SELECT COUNT(*) FROM silences")
    at = sign_in(run_page("silences"))
    at.selectbox(key="expire_id").select_index(0).run()
    at.button(key="expire").click().run()
    assert not at.error
    sync_until(env, "SELECT COUNT(*) FROM silences WHERE ended_by IS NOT NULL")

    cmds = [parse_command(orjson.dumps(c)) for c in consume_json(broker.bootstrap, COMMANDS, min_count=3)]
    ack = next(c for c in cmds if isinstance(c, AckCommand))
    silence = next(c for c in cmds if isinstance(c, SilenceCommand))
    unsilence = next(c for c in cmds if isinstance(c, UnsilenceCommand))
    assert (ack.fingerprint, ack.comment, ack.by) == (hot.fingerprint, "on it", "ann")
    assert (silence.matchers, silence.by) == (('device_id=~"pump-.*"', 'severity="critical"'), "ann")
    assert (unsilence.silence_id, unsilence.by) == (silence.silence_id, "ann")
    with AlertStore(data_dir / "alerts.sqlite3", readonly=True) as store:
        assert [(a["by"], a["comment"]) for a in store.acks()] == [("ann", "on it")]


@pytest.mark.slow
@pytest.mark.integration
def test_alert_detail_charts_the_groups_raw_readings_from_the_source_topic(
    data_dir: Path, broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
    st.cache_data.clear()  # the readings are cached 30 s per alert: another test may have read this one
    alerts = seed(data_dir / "alerts.sqlite3")
    pump = alerts[1]  # firing since 10:00: the chart reads from 09:00 (an hour before) to now
    readings = [
        (device.encode(), orjson.dumps({"device_id": device, "ts": f"2024-05-01T{h:02d}:{m:02d}:00Z",
                                        "temperature": 90.0 + m / 10}))
        for h in (8, 9, 10) for m in range(0, 60, 5) for device in ("pump-7", "pump-9")
    ]  # fmt: skip
    produce(broker.bootstrap, "events.sensors", readings)
    at = run_page("alerts", alert=f"{pump.rule_id}/{pump.fingerprint}")
    captions = [c.value for c in at.caption]
    assert any(c.startswith("24 reading(s) of temperature for device_id=pump-7") for c in captions), captions
    assert any("line: the raw readings, markers: the values the transitions carried" in c for c in captions)
