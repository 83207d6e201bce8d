"""The dispatch role against the real embedded broker and a real HTTP receiver."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY

from app.dispatch.base import iso
from app.dispatch.commands import RESOLVED_BY_HAND, ResolveCommand, SilenceCommand, sign_command
from app.kafka.broker import KafkaBroker
from app.runtime.settings import DEMO_COMMAND_SECRET, Settings
from app.storage.alert_store import AlertStore
from app.storage.dispatch_db import DispatchDB
from app.topics import ALERTS, COMMANDS, NOTIFICATIONS
from tests.conftest import make_settings
from tests.dispatch.harness import http_receiver, publish, run_role, write_routes
from tests.dispatch.helpers import alert
from tests.kafka_helpers import consume, consume_json, produce
from tests.storage.helpers import sync_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture
def cfg(broker: KafkaBroker, tmp_path: Path) -> Settings:
    return make_settings(
        tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_WEBHOOK_ALLOW_PRIVATE="127.0.0.1"
    )


def test_alerts_are_routed_signed_silenced_and_logged(
    cfg: Settings, broker: KafkaBroker, tmp_path: Path
) -> None:
    fired = [alert(f"d{i}") for i in range(4)]
    silenced = alert("quiet-1")
    now = time.time()
    cmd = SilenceCommand(silence_id="s1", matchers=('device_id=~"quiet-.*"',), starts_at=iso(now - 60),
                         ends_at=iso(now + 3600), at=iso(now), by="ann")  # fmt: skip
    produce(
        broker.bootstrap,
        COMMANDS,
        [(b"s1", sign_command(cmd, DEMO_COMMAND_SECRET).model_dump_json().encode()), (b"x", b"{not json")],
    )
    publish(broker.bootstrap, ALERTS, [*fired, silenced, alert("d9", "pending"), fired[0]])
    with http_receiver() as rx:
        to_bus = "  routes:\n    - {matchers: ['device_id=\"d0\"'], receiver: bus}"
        routes = write_routes(
            tmp_path / "routes.yaml", rx.url(), extra_receivers="  - {name: bus, type: kafka}", route=to_bus
        )
        stopped_in = run_role(cfg, routes, lambda: len(rx.requests) >= 3)
        time.sleep(0.3)
        ids = rx.verified_ids()  # every signature verifies with the standardwebhooks library
    assert set(ids) == {a.alert_id for a in fired[1:]}  # d0 went to the bus only; quiet-1 silenced
    assert all(len(m) == 1 for m in ids.values())
    body = orjson.loads(rx.requests[0].body)
    assert body["version"] == "4" and body["receiver"] == "ops"
    assert body["alerts"][0]["rule_version"] == "1" and "values" in body["alerts"][0]
    (bus,) = consume(broker.bootstrap, "alerts.bus", min_count=1, timeout_s=10)
    assert [a["alert_id"] for a in orjson.loads(bus.value)["alerts"]] == [fired[0].alert_id]
    events = consume_json(broker.bootstrap, NOTIFICATIONS, min_count=8, timeout_s=10)
    assert sorted(e["event"] for e in events) == ["delivered"] * 4 + ["queued"] * 4
    assert stopped_in < 5


def test_a_4xx_is_dead_lettered_and_a_5xx_outage_loses_nothing(
    cfg: Settings, broker: KafkaBroker, tmp_path: Path
) -> None:
    alerts = [alert(f"d{i}") for i in range(6)]
    with http_receiver(status=503, by_path={"/strict": 400}) as rx:
        secret = "whsec_c3RyaWN0LXNlY3JldA=="
        strict = f'  - {{name: strict, type: webhook, url: "{rx.url("/strict")}", secret: "{secret}"}}'
        to_strict = "  routes:\n    - {matchers: ['device_id=\"d5\"'], receiver: strict}"
        routes = write_routes(tmp_path / "routes.yaml", rx.url(), extra_receivers=strict, route=to_strict)
        publish(broker.bootstrap, ALERTS, alerts)

        def recovered() -> bool:
            hook = [r for r in rx.requests if r.path == "/hook"]
            if len(hook) >= 15:
                rx.status = 204  # the outage ends after 15 refused attempts
            return rx.status == 204 and len({a for r in hook[15:] for a in r.alert_ids()}) >= 5

        run_role(cfg, routes, recovered, timeout_s=40)
        ids = rx.verified_ids()
        hook = [r for r in rx.requests if r.path == "/hook"]
        strict_posts = [r for r in rx.requests if r.path == "/strict"]
    assert set(ids) == {a.alert_id for a in alerts[:5]}
    assert all(len(msg_ids) == 1 for msg_ids in ids.values())  # retries kept the webhook-id
    assert len(hook) >= 15 + 5 and len(strict_posts) == 1  # 503 retried, 400 never
    db = DispatchDB(cfg.dispatch_path, readonly=True)
    assert db.counts() == {"delivered": 5, "dead": 1}
    (dead,) = db.outbox("dead")
    assert "answered 400" in dead.last_error and dead.message.alert_ids == (alerts[5].alert_id,)
    db.close()
    events = consume_json(broker.bootstrap, NOTIFICATIONS, min_count=12, timeout_s=10)
    assert [e["msg_id"] for e in events if e["event"] == "dead"] == [dead.message.msg_id]


def test_a_forged_silence_mutes_nothing_and_is_counted(
    cfg: Settings, broker: KafkaBroker, tmp_path: Path
) -> None:
    """The probe's forged silence (`alertname=~".*"` until 2099) written straight to the broker,
    unsigned and signed with another key: neither is applied, both are counted as forged."""
    now = time.time()
    forged = [
        SilenceCommand(
            silence_id=f"f{i}",
            matchers=('alertname=~".*"',),
            starts_at=iso(now - 60),
            ends_at="2099-12-31T00:00:00Z",
            at=iso(now),
            by="mallory",
        )
        for i in range(2)
    ]
    records = [
        (b"f0", forged[0].model_dump_json().encode()),
        (b"f1", sign_command(forged[1], "not-the-dispatchers-key").model_dump_json().encode()),
    ]
    produce(broker.bootstrap, COMMANDS, records)
    fired = [alert(f"d{i}") for i in range(2)]
    publish(broker.bootstrap, ALERTS, fired)
    before = (
        REGISTRY.get_sample_value("dispatch_records_total", {"topic": COMMANDS, "outcome": "forged"}) or 0
    )
    with http_receiver() as rx:
        routes = write_routes(tmp_path / "routes.yaml", rx.url())
        run_role(cfg, routes, lambda: len(rx.verified_ids()) >= 2)
        ids = rx.verified_ids()
    assert set(ids) == {a.alert_id for a in fired}
    after = REGISTRY.get_sample_value("dispatch_records_total", {"topic": COMMANDS, "outcome": "forged"})
    assert after == before + 2


def test_a_resolve_by_hand_reaches_the_receiver_and_the_store_without_writing_alerts(
    cfg: Settings, broker: KafkaBroker, tmp_path: Path
) -> None:
    """The dispatcher may not write `alerts` (only the engines may: app/kafka/acls.py). It
    published a manual resolution there, which make run's ACLs refused: its publisher retried
    that record every second forever, and held its notification log back behind it (found by
    hand, 2026-11-29). The resolution now goes to the store as a `resolved_by_hand` event on
    `notifications`, which the dispatcher writes anyway."""
    fired = alert("d1")
    publish(broker.bootstrap, ALERTS, [fired])
    cmd = ResolveCommand(fingerprint=fired.fingerprint, at=iso(time.time()), by="ann", comment="fixed")
    signed = sign_command(cmd, DEMO_COMMAND_SECRET).model_dump_json().encode()
    sent: list[threading.Thread] = []

    def resolved_once_fired() -> bool:  # the command once the firing alert was delivered
        if rx.requests and not sent:
            sent.append(threading.Thread(target=produce, args=(broker.bootstrap, COMMANDS, [(b"r", signed)])))
            sent[0].start()
        return len(rx.requests) >= 2

    with http_receiver() as rx:
        run_role(cfg, write_routes(tmp_path / "routes.yaml", rx.url()), resolved_once_fired)
        sent[0].join(10)
    statuses = [a["status"] for r in rx.requests for a in orjson.loads(r.body)["alerts"]]
    assert statuses == ["firing", "resolved"]
    events = consume_json(broker.bootstrap, NOTIFICATIONS, min_count=5, timeout_s=10)
    [by_hand] = [e for e in events if e["event"] == RESOLVED_BY_HAND]
    assert by_hand["alert"]["status"] == "resolved"
    assert by_hand["alert"]["annotations"]["resolved_by"] == "resolved by hand by ann: fixed"
    assert [a["status"] for a in consume_json(broker.bootstrap, ALERTS, min_count=1, timeout_s=3)] == [
        "firing"
    ]
    env = {"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "APP_DATA_DIR": str(tmp_path / "data")}
    resolved = "SELECT COUNT(*) FROM alerts WHERE status = 'resolved' AND alert_id = '{}'"
    sync_until(env, resolved.format(by_hand["alert_id"]))
    with AlertStore(Settings.from_env(env).store_path, readonly=True) as store:
        [current] = store.current()
    assert (current.status, current.annotations["resolved_by"]) == (
        "resolved",
        "resolved by hand by ann: fixed",
    )


def test_manual_resolutions_queued_for_alerts_by_an_earlier_release_go_to_notifications(
    cfg: Settings, broker: KafkaBroker, tmp_path: Path
) -> None:
    """A data dir whose publish queue holds a manual resolution for `alerts` (queued by a release
    before the fix above; refused there for ever) sends it where it goes now, in its place."""
    resolved = alert("d1", "resolved")
    db = DispatchDB(cfg.dispatch_path)
    recorded = orjson.dumps({"event": "recorded", "at": 1.0})
    db.commit([], {}, publish=[(ALERTS, resolved.fingerprint.encode(), resolved.to_json()),
                               (NOTIFICATIONS, b"g", recorded)])  # fmt: skip
    db.close()

    def queue_empty() -> bool:
        ro = DispatchDB(cfg.dispatch_path, readonly=True)
        try:
            return not ro.to_publish()
        finally:
            ro.close()

    with http_receiver() as rx:
        run_role(cfg, write_routes(tmp_path / "routes.yaml", rx.url()), queue_empty)
    events = consume_json(broker.bootstrap, NOTIFICATIONS, min_count=2, timeout_s=10)
    assert [e["event"] for e in events] == [RESOLVED_BY_HAND, "recorded"]
    assert events[0]["alert"]["alert_id"] == resolved.alert_id
    assert consume_json(broker.bootstrap, ALERTS, timeout_s=2) == []
