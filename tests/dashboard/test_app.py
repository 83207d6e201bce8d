"""The Streamlit page with streamlit's AppTest against a real store in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from streamlit.testing.v1 import AppTest

from app.alerts import Alert
from app.dispatch.commands import AckCommand, SilenceCommand, parse_command
from app.dispatch.config import load_routes
from app.dispatch.dispatcher import Dispatcher
from app.kafka.broker import KafkaBroker
from app.runtime.settings import PROJECT_ROOT
from app.storage.alert_store import AlertStore
from app.topics import ALERTS, COMMANDS
from tests.dispatch.harness import publish
from tests.kafka_helpers import consume_json
from tests.storage.helpers import sync_until

APP = PROJECT_ROOT / "dashboard" / "streamlit_app.py"
ROUTES = PROJECT_ROOT / "config" / "routes.yaml"


def alert(device: str, status: str, severity: str = "critical", start: str = "2024-05-01T10:00:00Z") -> Alert:
    return Alert.build(
        rule_id="temp_high",
        rule_version="2",
        status=status,  # type: ignore[arg-type]
        severity=severity,
        labels={"device_id": device},
        annotations={"summary": f"{device} runs hot"},
        starts_at=start,
        ends_at="2024-05-01T10:09:00Z" if status == "resolved" else None,
        source="sensors",
        event_ts="2024-05-01T10:09:00Z" if status == "resolved" else start,
        values={"temp_c": 95},
    )


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("APP_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def run_page() -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=30)
    at.run()
    assert not at.exception, at.exception
    return at


def test_firing_alerts_counts_and_transitions_are_shown(data_dir: Path) -> None:
    with AlertStore(data_dir / "alerts.sqlite3") as store:
        store.apply_many(
            [alert("pump-7", "firing"), alert("pump-9", "firing", "warning", "2024-05-01T10:02:00Z"),
             alert("fan-1", "firing"), alert("fan-1", "resolved")]
        )  # fmt: skip
        store.apply_batch(
            commands=[{"type": "silence", "cmd_id": "c1", "at": "2024-05-01T10:00:00Z", "silence_id": "s1",
                       "matchers": ['device_id="fan-1"'], "starts_at": "2024-05-01T10:00:00Z",
                       "ends_at": "2999-01-01T00:00:00Z", "by": "ann", "comment": "swap"}],
            notifications=[{"event": "dead", "msg_id": "m1", "receiver": "ops", "group_key": "g", "at": 1.0,
                            "alert_ids": ["a1"], "attempts": 2, "reason": "answered 400"}],
        )  # fmt: skip
    at = run_page()
    firing, counts, history, silences, dead = (df.value for df in at.dataframe)
    assert list(silences["matchers"]) == ['device_id="fan-1"'] and list(dead["reason"]) == ["answered 400"]
    assert list(firing["labels"]) == ["device_id=pump-9", "device_id=pump-7"]
    assert list(firing["summary"]) == ["pump-9 runs hot", "pump-7 runs hot"]
    assert list(firing["severity"]) == ["warning", "critical"]
    assert counts.set_index("status")["total"].to_dict() == {"firing": 2, "resolved": 1}
    assert len(history) == 4 and history["status"].iloc[0] == "resolved"
    assert at.metric[0].value == "2"


def test_missing_or_empty_store_says_no_alerts_yet(data_dir: Path) -> None:
    at = run_page()
    assert [i.value for i in at.info] == ["no alerts yet"]
    AlertStore(data_dir / "alerts.sqlite3").close()  # created, still empty
    at = run_page()
    assert [i.value for i in at.info] == ["no alerts yet"]
    assert len(at.dataframe) == 0


@pytest.mark.slow
@pytest.mark.integration
def test_runs_from_its_own_folder_like_streamlit_without_faust_or_spark(tmp_path: Path) -> None:
    # `streamlit run dashboard/streamlit_app.py` puts dashboard/ first on sys.path (a module
    # named app.py there would shadow the `app` package); run the page the same way, with the
    # project root on PYTHONPATH as the supervisor and the Dockerfile set it.
    probe = (
        "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
        "runpy.run_path(sys.argv[2], run_name='__main__'); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('faust', 'pyspark', 'aiokafka')); "
        "print('imported:', bad)"
    )
    env = {**os.environ, "APP_DATA_DIR": str(tmp_path), "PYTHONPATH": str(PROJECT_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", probe, str(APP.parent), str(APP)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "imported: []" in out.stdout


def test_pending_and_no_data_alerts_are_shown_apart_from_firing(data_dir: Path) -> None:
    with AlertStore(data_dir / "alerts.sqlite3") as store:
        store.apply_many([alert("pump-7", "firing"), alert("pump-8", "pending"), alert("pump-9", "no_data")])
    at = run_page()
    firing, waiting = at.dataframe[0].value, at.dataframe[1].value
    assert list(firing["labels"]) == ["device_id=pump-7"]
    assert sorted(zip(waiting["status"], waiting["labels"], strict=True)) == [
        ("no_data", "device_id=pump-9"),
        ("pending", "device_id=pump-8"),
    ]


def test_actions_without_a_broker_say_why_nothing_was_sent(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    with AlertStore(data_dir / "alerts.sqlite3") as store:
        store.apply_many([alert("pump-7", "firing")])
    at = run_page()
    at.text_input(key="silence_matchers").input('device_id="pump-7"')
    at.button[1].click().run()
    assert [e.value for e in at.error] == [
        "not sent: KAFKA_BOOTSTRAP_SERVERS is not set; commands go to the commands topic"
    ]
    at.text_input(key="silence_matchers").input("device_id~bad")
    at.button[1].click().run()
    assert "not sent:" in at.error[0].value and "device_id~bad" in at.error[0].value


@pytest.mark.slow
@pytest.mark.integration
def test_ack_silence_and_unsilence_buttons_publish_commands_the_store_and_dispatcher_apply(
    data_dir: Path, broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
        "APP_DATA_DIR": str(data_dir),
    }
    hot = alert("pump-7", "firing")
    publish(broker.bootstrap, ALERTS, [hot])
    sync_until(env, "SELECT COUNT(*) FROM alerts")

    at = run_page()
    assert [b.label for b in at.button] == ["Ack", "Silence", "Unsilence"]
    at.text_input(key="ack_comment").input("on it")
    at.button[0].click().run()
    at.text_input(key="silence_matchers").input('device_id=~"pump-.*" severity=critical')
    at.text_input(key="silence_duration").input("30m")
    at.text_input(key="silence_by").input("ann")
    at.text_input(key="silence_comment").input("swap")
    at.button[1].click().run()
    assert not at.error and len(at.success) == 1
    sync_until(env, "SELECT COUNT(*) FROM acks")
    sync_until(env, "SELECT COUNT(*) FROM silences")

    commands = [parse_command(orjson.dumps(c)) for c in consume_json(broker.bootstrap, COMMANDS, min_count=2)]
    ack, silence = sorted(commands, key=lambda c: c.type)
    assert isinstance(ack, AckCommand) and isinstance(silence, SilenceCommand)
    assert (ack.fingerprint, ack.starts_at, ack.comment) == (hot.fingerprint, hot.starts_at, "on it")
    assert (silence.matchers, silence.by, silence.comment) == (
        ('device_id=~"pump-.*"', 'severity="critical"'),
        "ann",
        "swap",
    )
    with AlertStore(data_dir / "alerts.sqlite3", readonly=True) as store:
        assert [a["comment"] for a in store.acks()] == ["on it"]
        (row,) = store.silences(active_at=silence.starts_at)
        assert row["id"] == silence.silence_id and row["created_by"] == "ann"
    # the dispatcher applies the same records: the alert is acked and silenced
    disp = Dispatcher(load_routes(ROUTES, {}))
    for c in commands:
        disp.on_command(c)
    assert disp.acks.acked(hot) is not None and disp.silences.mutes(hot, silence.at_s + 1)

    at = run_page()
    assert at.selectbox(key="unsilence_id").value == silence.silence_id
    at.button[2].click().run()
    assert not at.error
    sync_until(env, "SELECT COUNT(*) FROM silences WHERE ended_by IS NOT NULL")
    (unsilence,) = [
        c for c in consume_json(broker.bootstrap, COMMANDS, min_count=3) if c["type"] == "unsilence"
    ]
    disp.on_command(parse_command(orjson.dumps(unsilence)))
    assert not disp.silences.mutes(hot, parse_command(orjson.dumps(unsilence)).at_s + 1)
