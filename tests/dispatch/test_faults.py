"""Fault tests: kill -9 of the dispatcher mid-delivery, restarts, and a lost state file."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from app.kafka.broker import KafkaBroker
from app.runtime.settings import Settings
from app.topics import ALERTS
from tests.conftest import child_env, make_settings
from tests.dispatch.harness import http_receiver, publish, run_role, write_routes
from tests.dispatch.helpers import alert
from tests.procs import role, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_kill_9_mid_delivery_loses_nothing_and_resends_under_the_same_id(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    alerts = [alert(f"d{i}") for i in range(8)]
    publish(broker.bootstrap, ALERTS, alerts)
    env = child_env(
        KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_DATA_DIR=str(tmp_path / "data"),
        APP_WEBHOOK_ALLOW_PRIVATE="127.0.0.1", APP_PARTITIONS="2",
    )  # fmt: skip
    with http_receiver(delay_s=1.0) as rx:
        env["APP_ROUTES_FILE"] = str(write_routes(tmp_path / "routes.yaml", rx.url()))
        with role(["app", "dispatch"], env, tmp_path / "first.log") as first:
            wait_for(lambda: len(rx.requests) >= 3, timeout_s=30, what="three requests")
            in_flight = rx.requests[-1].msg_id  # received, its answer still 1 s away
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(5)
        rx.delay_s = 0.0
        with role(["app", "dispatch"], env, tmp_path / "second.log"):
            restarted = time.monotonic()
            wait_for(lambda: len(rx.verified_ids()) >= len(alerts), timeout_s=30, what="every alert")
            caught_up_s = time.monotonic() - restarted
            time.sleep(0.5)
        ids = rx.verified_ids()
        per_message = Counter(r.msg_id for r in rx.requests)
    assert set(ids) == {a.alert_id for a in alerts}  # nothing lost
    assert all(len(msg_ids) == 1 for msg_ids in ids.values())  # duplicates only under the same id
    assert per_message[in_flight] == 2  # the interrupted message went again, same webhook-id
    assert sum(per_message.values()) <= len(alerts) + 2
    assert caught_up_s < 20


def test_restarts_and_a_lost_state_file_neither_flood_nor_lose(broker: KafkaBroker, tmp_path: Path) -> None:
    cfg: Settings = make_settings(
        tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_WEBHOOK_ALLOW_PRIVATE="127.0.0.1"
    )
    first = [alert(f"d{i}") for i in range(5)]
    publish(broker.bootstrap, ALERTS, first)
    with http_receiver() as rx:
        routes = write_routes(tmp_path / "routes.yaml", rx.url())
        run_role(cfg, routes, lambda: len(rx.requests) >= 5)
        time.sleep(0.3)
        # while it is down: one resolution and one new alert
        publish(broker.bootstrap, ALERTS, [alert("d0", "resolved"), alert("d5")])
        run_role(cfg, routes, lambda: len(rx.requests) >= 7)
        time.sleep(1.0)  # a flood would show up here
        assert len(rx.requests) == 7
        for suffix in ("", "-wal", "-shm"):
            Path(f"{cfg.dispatch_path}{suffix}").unlink(missing_ok=True)
        publish(broker.bootstrap, ALERTS, [alert("d6")])
        run_role(cfg, routes, lambda: len(rx.requests) >= 8)
        time.sleep(1.5)  # replayed alerts are grouped and flushed; the rebuilt log dedups them
        ids = rx.verified_ids()
        total = len(rx.requests)
    assert total == 8
    expected = {a.alert_id for a in [*first, alert("d0", "resolved"), alert("d5"), alert("d6")]}
    assert set(ids) == expected
