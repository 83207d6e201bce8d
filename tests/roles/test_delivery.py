"""Outbox delivery end to end: real broker, the dispatch role, the real receiver role, real HTTP."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from prometheus_client import REGISTRY
from pydantic import SecretStr

from app.dispatch.messages import OutboxMessage
from app.kafka.broker import KafkaBroker
from app.notify import RetryPolicy, WebhookNotifier
from app.roles import dispatch as dispatch_role
from app.roles import receiver
from app.roles.delivery import OutboxSender, Publisher
from app.runtime.settings import Settings, quiet_libraries
from app.storage.dispatch_db import DispatchDB
from app.topics import ALERTS
from tests.conftest import make_settings
from tests.dispatch.harness import write_routes
from tests.dispatch.helpers import SECRET
from tests.kafka_helpers import committed, produce
from tests.notify.servers import ScriptedServer, make_alert


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        return (await client.get(url.replace("/webhook", "/stats"))).json()


async def _receiver_url(caplog: pytest.LogCaptureFixture) -> str:
    for _ in range(250):
        for rec in caplog.records:
            m = re.fullmatch(r"receiver listening on (\S+)", rec.getMessage())
            if m:
                return m.group(1)
        await asyncio.sleep(0.02)
    msg = "the receiver never logged its URL"
    raise AssertionError(msg)


def run_pair(
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
    until: Callable[[dict[str, Any]], bool],
    receiver_opts: dict[str, Any],
    policy: RetryPolicy | None = None,
    settle_s: float = 1.0,
    tmp_path: Path | None = None,
) -> tuple[dict[str, Any], float]:
    """Run the receiver and dispatch roles until ``until(/stats)`` holds (at most 40 s),
    wait ``settle_s`` for strays, stop both; return (/stats, dispatcher stop seconds)."""

    async def main() -> tuple[dict[str, Any], float]:
        stop_rx, stop_tx = asyncio.Event(), asyncio.Event()
        rx = asyncio.create_task(receiver.run(settings, stop_rx, **receiver_opts))
        url = await _receiver_url(caplog)
        routes = write_routes((tmp_path or settings.data_dir.parent) / "routes.yaml", url)
        tx = asyncio.create_task(dispatch_role.run(settings, stop_tx, routes_file=routes, policy=policy))
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not tx.done():
            if until(await _stats(url)):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(settle_s)
        stats = await _stats(url)
        started = time.monotonic()
        stop_tx.set()
        await asyncio.wait_for(tx, 15)
        stopped_in = time.monotonic() - started
        stop_rx.set()
        await asyncio.wait_for(rx, 5)
        return stats, stopped_in

    with caplog.at_level(logging.INFO):
        return asyncio.run(asyncio.wait_for(main(), 90))


def fast_policy(**kw: Any) -> RetryPolicy:
    return RetryPolicy(**{"base_s": 0.02, "cap_s": 0.1, "max_attempts": None, "max_age_s": None, **kw})


@pytest.fixture
def loopback_settings(broker: KafkaBroker, tmp_path: Path) -> Settings:
    return make_settings(
        tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_WEBHOOK_ALLOW_PRIVATE="127.0.0.1",
        APP_WEBHOOK_SECRET=SECRET,
    )  # fmt: skip


def outbox(settings: Settings) -> dict[str, int]:
    db = DispatchDB(settings.dispatch_path, readonly=True)
    try:
        return db.counts()
    finally:
        db.close()


@pytest.mark.slow
@pytest.mark.integration
def test_every_alert_reaches_the_receiver_exactly_once(
    broker: KafkaBroker, loopback_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    alerts = [make_alert(i) for i in range(40)] + [make_alert(i, "resolved") for i in range(40, 60)]
    pending = make_alert(99, "pending")
    records = [(a.fingerprint.encode(), a.to_json()) for a in [*alerts, pending]]
    produce(broker.bootstrap, ALERTS, [*records, records[0], (b"k", b"{broken")])
    delivered_before = metric("webhook_alerts_total", outcome="delivered")

    stats, stopped_in = run_pair(
        loopback_settings, caplog, lambda s: s["unique_alerts"] >= 40, {"fail_first": 2}, fast_policy()
    )
    # resolutions of alerts never notified as firing are not sent (Alertmanager's dedup rule)
    assert stats["unique_alerts"] == 40
    assert stats["alerts"] == 40, "an alert arrived twice"
    assert stats["failed_on_purpose"] == 2
    assert pending.alert_id not in {r["alert_id"] for r in stats["recent"]}
    assert metric("webhook_alerts_total", outcome="delivered") - delivered_before == 40
    assert metric("webhook_inflight") == 0
    assert stopped_in < 5
    assert outbox(loopback_settings) == {"delivered": 40}
    assert committed(broker.bootstrap, dispatch_role.GROUP_ID) == len(records) + 2


@pytest.mark.slow
@pytest.mark.integration
def test_refused_messages_are_dead_lettered_and_logged(
    broker: KafkaBroker, loopback_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    alert = make_alert(1)
    produce(broker.bootstrap, ALERTS, [(b"k", alert.to_json())])
    failed_before = metric("webhook_deliveries_total", outcome="failed")
    wrong = loopback_settings.model_copy(
        update={"webhook_secret": SecretStr("whsec_b3RoZXItc2VjcmV0LXh4eA==")}
    )

    async def main() -> None:
        stop_rx, stop_tx = asyncio.Event(), asyncio.Event()
        rx = asyncio.create_task(receiver.run(wrong, stop_rx))  # verifies with another secret: 401
        url = await _receiver_url(caplog)
        routes = write_routes(loopback_settings.data_dir.parent / "routes.yaml", url)
        tx = asyncio.create_task(dispatch_role.run(loopback_settings, stop_tx, routes_file=routes))
        deadline = time.monotonic() + 30
        while metric("webhook_deliveries_total", outcome="failed") == failed_before:
            assert time.monotonic() < deadline and not tx.done()
            await asyncio.sleep(0.1)
        stop_tx.set()
        stop_rx.set()
        await asyncio.wait_for(asyncio.gather(tx, rx), 10)

    with caplog.at_level(logging.INFO):
        asyncio.run(asyncio.wait_for(main(), 60))
    assert any(alert.alert_id in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert outbox(loopback_settings) == {"dead": 1}


@pytest.mark.slow
@pytest.mark.integration
def test_stop_during_retries_keeps_the_message_pending(
    broker: KafkaBroker, loopback_settings: Settings, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    produce(broker.bootstrap, ALERTS, [(b"k", make_alert(1).to_json())])
    stats, stopped_in = run_pair(
        loopback_settings, caplog, lambda s: s["failed_on_purpose"] >= 1, {"fail_first": 1000},
        RetryPolicy(base_s=30.0, cap_s=60.0, max_attempts=None, max_age_s=None), settle_s=0.2,
    )  # fmt: skip
    assert stats["alerts"] == 0 and stats["failed_on_purpose"] >= 1
    assert stopped_in < 3
    assert outbox(loopback_settings) == {"pending": 1}


@pytest.mark.slow
@pytest.mark.integration
def test_a_refused_url_disables_the_receiver_and_keeps_its_messages(
    broker: KafkaBroker, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    produce(broker.bootstrap, ALERTS, [(b"k", make_alert(1).to_json())])
    cfg = settings.model_copy(update={"webhook_secret": SecretStr(SECRET)})
    stats, stopped_in = run_pair(  # no APP_WEBHOOK_ALLOW_PRIVATE: 127.0.0.1 is refused
        cfg, caplog, lambda s: metric("webhook_delivery_paused", receiver="ops") == 1, {}, fast_policy(),
        settle_s=0.2,
    )  # fmt: skip
    assert stats["received"] == 0
    assert stopped_in < 3
    assert any("non-public" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert outbox(cfg) == {"pending": 1}


async def stop_when(
    db: DispatchDB, counts: dict[str, int], stop: asyncio.Event, task: asyncio.Task[None]
) -> None:
    """Wait (at most 5 s) for the outbox to hold ``counts``, then stop the sender's ``task``."""
    for _ in range(100):
        if db.counts() == counts:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 3)


def test_a_receiver_without_url_waits_then_dead_letters_at_max_age(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = DispatchDB(tmp_path / "d.sqlite3")
    clock = [1000.0]
    msg = OutboxMessage("msg_1", "default", "g", 1000.0, b"{}", ("a1",))
    db.commit([], {}, [msg])
    sender = OutboxSender(db, "default", None, fast_policy(), max_age_s=60, clock=lambda: clock[0])

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(sender.run(stop))
        await asyncio.sleep(0.3)
        assert db.counts() == {"pending": 1}
        clock[0] += 61
        sender.wake.set()
        await stop_when(db, {"dead": 1}, stop, task)

    with caplog.at_level(logging.WARNING, logger="app.roles.delivery"):
        asyncio.run(main())
    (dead,) = db.outbox("dead")
    assert dead.last_error == "receiver unusable: no URL configured"
    assert any("UNUSABLE: no URL configured" in r.getMessage() for r in caplog.records)
    db.close()


class _RefusingProducer:
    """Acknowledges every record but those of ``refused``, as a broker's ACLs refuse a topic."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.sent: list[bytes] = []

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if topic == self.refused:
            done.set_exception(TopicAuthorizationFailedError(topic))
        else:
            self.sent.append(value)
            done.set_result(None)
        return done


def test_a_refused_record_holds_back_only_what_follows_it(tmp_path: Path) -> None:
    """The records acknowledged before the first refused one are marked published, and the
    retries send the refused one alone: the whole queue was sent again at every retry, each
    second, while one record kept being refused (27,335 notification-log records on a data dir)."""
    db = DispatchDB(tmp_path / "dispatch.sqlite3")
    db.commit([], {}, publish=[("notifications", b"k", b"one"), ("notifications", b"k", b"two"),
                               ("refused", b"k", b"three"), ("notifications", b"k", b"four")])  # fmt: skip
    producer = _RefusingProducer("refused")
    publisher = Publisher(db, producer)  # type: ignore[arg-type]
    for _ in range(3):  # three retries
        with pytest.raises(TopicAuthorizationFailedError):
            asyncio.run(publisher.flush())
    assert [v for _, _, _, v in db.to_publish()] == [b"three", b"four"]  # kept, in order
    assert producer.sent == [b"one", b"two", b"four"]  # each once: the retries send "three" alone
    producer.refused = "none now"  # the ACL is granted: the queue goes out, then whole batches again
    assert asyncio.run(publisher.flush()) == 1 and asyncio.run(publisher.flush()) == 1
    assert producer.sent == [b"one", b"two", b"four", b"three", b"four"] and not db.to_publish()
    assert not publisher.failing
    db.close()


@pytest.mark.parametrize("quiet", [True, False])
def test_a_delivery_is_logged_once_without_its_urls_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, library_logging: None, quiet: bool
) -> None:
    """A Slack-style webhook URL carries its secret in its path. Each role's logging
    (``setup_logging``, the worker's ``on_setup_root_logger``) quiets httpx, whose INFO line
    per request is the whole URL; the delivery's own line names the receiver, the group and
    the attempt. Without the quieting (``quiet=False``), httpx's line shows the secret."""
    db = DispatchDB(tmp_path / "d.sqlite3")
    db.commit([], {}, [OutboxMessage("msg_1", "ops", "g1", time.time(), b"{}", ("a1", "a2"))])
    if quiet:
        quiet_libraries("INFO")

    async def main() -> None:
        async with ScriptedServer() as server:
            url = f"http://127.0.0.1:{server.port}/services/T0/B0/s3cr3t-token"
            async with WebhookNotifier(url, SECRET, allow_private=("127.0.0.1",)) as notifier:
                sender = OutboxSender(db, "ops", notifier, fast_policy(), max_age_s=60)
                stop = asyncio.Event()
                await stop_when(db, {"delivered": 1}, stop, asyncio.create_task(sender.run(stop)))
            assert len(server.seen) == 1

    with caplog.at_level(logging.INFO):
        asyncio.run(asyncio.wait_for(main(), 20))
    db.close()
    lines = [r.getMessage() for r in caplog.records]
    (done,) = [line for line in lines if line.startswith("delivered msg_1")]
    assert done.startswith("delivered msg_1 to ops: group g1, 2 alert(s), attempt 1, ")
    leaked = [line for line in lines if "s3cr3t-token" in line]
    assert not leaked if quiet else leaked
