"""The Streamlit page with streamlit's AppTest against a real store in a temp dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.alerts import Alert
from app.config import PROJECT_ROOT
from app.store import AlertStore

APP = PROJECT_ROOT / "dashboard" / "streamlit_app.py"


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
