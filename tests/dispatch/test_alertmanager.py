"""Push to a real prometheus-alertmanager (the Debian package `make test` installs)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.kafka.broker import KafkaBroker, free_port
from app.topics import ALERTS
from tests.conftest import make_settings
from tests.dispatch.harness import publish, run_role
from tests.dispatch.helpers import alert
from tests.procs import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

AM_BIN = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
AM_CONFIG = """route:
  receiver: blackhole
  group_wait: 1h
receivers:
  - name: blackhole
"""


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager on a free loopback port, no clustering; yields its base URL."""
    if not Path(AM_BIN).exists():
        pytest.skip("prometheus-alertmanager is not installed (make test installs it)")
    import subprocess

    port = free_port()
    (tmp_path / "am.yml").write_text(AM_CONFIG)
    log = (tmp_path / "am.log").open("wb")
    proc = subprocess.Popen(
        [AM_BIN, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), timeout_s=30, what="alertmanager /-/ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _alerts(url: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = httpx.get(f"{url}/api/v2/alerts", timeout=5).json()
    return data


def test_firing_and_resolved_alerts_are_pushed_to_alertmanager(
    broker: KafkaBroker, alertmanager: str, tmp_path: Path
) -> None:
    cfg = make_settings(
        tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_WEBHOOK_ALLOW_PRIVATE="127.0.0.1",
        APP_EXTERNAL_URL="http://alerts.example",
    )  # fmt: skip
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        f"""receivers:
  - {{name: am, type: alertmanager, url: "{alertmanager}", timeout: 5s}}
route: {{receiver: am, group_by: ['...'], group_wait: 100ms, group_interval: 300ms}}
"""
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    publish(broker.bootstrap, ALERTS, [alert(f"pump-{i}", start=now) for i in range(3)])
    run_role(cfg, routes, lambda: len(_alerts(alertmanager)) >= 3)
    got = {a["labels"]["device_id"]: a for a in _alerts(alertmanager)}
    assert sorted(got) == ["pump-0", "pump-1", "pump-2"]
    pump = got["pump-0"]
    assert pump["labels"] == {"alertname": "hot", "severity": "critical", "device_id": "pump-0"}
    assert pump["annotations"] == {"summary": "pump-0 is hot"}
    assert pump["status"]["state"] == "active"
    assert pump["generatorURL"] == "http://alerts.example/rules/hot"
    assert pump["startsAt"].startswith(now[:16])

    ended = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5))
    publish(broker.bootstrap, ALERTS, [alert("pump-0", "resolved", start=now, event=ended)])
    run_role(cfg, routes, lambda: "pump-0" not in {a["labels"]["device_id"] for a in _alerts(alertmanager)})
    assert sorted(a["labels"]["device_id"] for a in _alerts(alertmanager)) == ["pump-1", "pump-2"]
