"""Escalation survives dispatcher restarts: with its state file, and with the file lost."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.dispatch.base import iso
from app.dispatch.commands import AckCommand, sign_command
from app.kafka.broker import KafkaBroker
from app.runtime.settings import DEMO_COMMAND_SECRET
from app.topics import ALERTS, COMMANDS
from tests.conftest import make_settings
from tests.dispatch.harness import SECRET, http_receiver, publish, run_role, write_routes
from tests.dispatch.helpers import alert
from tests.kafka_helpers import produce

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.parametrize("lose_state", [False, True], ids=["state-kept", "state-lost"])
def test_an_escalation_pending_at_restart_still_escalates_once(
    broker: KafkaBroker, tmp_path: Path, lose_state: bool
) -> None:
    cfg = make_settings(
        tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_WEBHOOK_ALLOW_PRIVATE="127.0.0.1"
    )
    hot, acked = alert("d1"), alert("d2")
    publish(broker.bootstrap, ALERTS, [hot, acked])
    with http_receiver() as rx:
        pager = f'  - {{name: pager, type: webhook, url: "{rx.url("/pager")}", secret: "{SECRET}"}}'
        routes = write_routes(
            tmp_path / "routes.yaml",
            rx.url(),
            extra_receivers=pager,
            route="  escalate: {after: 3s, to: pager}",
        )
        # first run: both alerts notified (escalations armed), stopped long before they are due
        run_role(cfg, routes, lambda: len(rx.verified_ids()) == 2)
        assert rx.verified_ids("/pager") == {}
        ack = AckCommand(
            fingerprint=acked.fingerprint, starts_at=acked.starts_at, at=iso(time.time()), by="ann"
        )
        produce(
            broker.bootstrap,
            COMMANDS,
            [(acked.fingerprint.encode(), sign_command(ack, DEMO_COMMAND_SECRET).model_dump_json().encode())],
        )
        if lose_state:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{cfg.dispatch_path}{suffix}").unlink(missing_ok=True)
        # second run (a real restart of the role): the armed escalation comes due and is sent
        run_role(cfg, routes, lambda: len(rx.verified_ids("/pager")) >= 1, timeout_s=30)
        time.sleep(1.0)
        escalated = rx.verified_ids("/pager")
        assert set(escalated) == {hot.alert_id}  # the acknowledged alert did not escalate
        # third run: already sent, never sent twice; nothing was re-notified to ops either
        run_role(cfg, routes, lambda: True)
        time.sleep(0.5)
        run_role(cfg, routes, lambda: True)
        assert rx.verified_ids("/pager") == escalated
        assert {a: len(m) for a, m in rx.verified_ids().items()} == {hot.alert_id: 1, acked.alert_id: 1}
