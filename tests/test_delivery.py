"""The delivery role end to end: real broker, real receiver role, real HTTP."""

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
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client import REGISTRY

from app import delivery, receiver
from app.broker import EmbeddedBroker
from app.config import Settings
from app.notify import RetryPolicy
from app.topics import ALERTS
from tests.conftest import make_settings
from tests.kafka_helpers import produce
from tests.notify.servers import make_alert


def committed(bootstrap: str, group: str, topic: str = ALERTS) -> int:
    """Sum of ``group``'s committed offsets over ``topic`` (0 where none).

    Compared with the number of records produced, not with end offsets: the
    embedded Tansu 0.6.0 reports the last batch's base offset + 1 as the end.
    """

    async def main() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            await consumer.topics()
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            return sum([(await consumer.committed(tp)) or 0 for tp in tps])
        finally:
            await consumer.stop()

    return asyncio.run(asyncio.wait_for(main(), 20))


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
    delivery_opts: dict[str, Any],
    settle_s: float = 1.0,
) -> tuple[dict[str, Any], float]:
    """Run receiver and delivery roles until ``until(/stats)`` holds (at most
    40 s), wait ``settle_s`` for strays, stop both; return (/stats, stop seconds)."""

    async def main() -> tuple[dict[str, Any], float]:
        stop_rx, stop_tx = asyncio.Event(), asyncio.Event()
        rx = asyncio.create_task(receiver.run(settings, stop_rx, **receiver_opts))
        url = await _receiver_url(caplog)
        cfg = Settings(**{**settings.__dict__, "webhook_url": url})
        tx = asyncio.create_task(delivery.run(cfg, stop_tx, **delivery_opts))
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
    return RetryPolicy(**{"base_s": 0.02, "cap_s": 0.1, "max_attempts": 6, **kw})


@pytest.fixture
def loopback_settings(broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    return make_settings(
        tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_WEBHOOK_ALLOW_PRIVATE="127.0.0.1"
    )


@pytest.mark.slow
@pytest.mark.integration
def test_every_alert_reaches_the_receiver_exactly_once(
    broker: EmbeddedBroker, loopback_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    alerts = [make_alert(i) for i in range(40)] + [make_alert(i, "resolved") for i in range(20)]
    pending = make_alert(99, "pending")
    records = [(a.fingerprint.encode(), a.to_json()) for a in [*alerts, pending]]
    produce(broker.bootstrap, ALERTS, [*records, records[0], (b"k", b"{broken")])
    delivered_before = metric("webhook_alerts_total", outcome="delivered")

    stats, stopped_in = run_pair(
        loopback_settings,
        caplog,
        lambda s: s["unique_alerts"] >= len(alerts),
        {"fail_first": 2},
        {"policy": fast_policy(), "max_batch": 16},
    )
    assert stats["unique_alerts"] == len(alerts)
    assert stats["alerts"] == len(alerts), "an alert arrived twice"
    assert stats["failed_on_purpose"] == 2
    assert pending.alert_id not in {r["alert_id"] for r in stats["recent"]}
    assert metric("webhook_alerts_total", outcome="delivered") - delivered_before == len(alerts)
    assert metric("webhook_inflight") == 0
    assert stopped_in < 5
    assert committed(broker.bootstrap, delivery.GROUP_ID) == len(records) + 2


@pytest.mark.slow
@pytest.mark.integration
def test_given_up_alerts_are_logged_counted_and_committed(
    broker: EmbeddedBroker, loopback_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    alert = make_alert(1)
    produce(broker.bootstrap, ALERTS, [(b"k", alert.to_json())])
    failed_before = metric("webhook_deliveries_total", outcome="failed")
    wrong = Settings(**{**loopback_settings.__dict__, "webhook_secret": "whsec_b3RoZXItc2VjcmV0LXh4eA=="})

    async def main() -> None:
        stop_rx, stop_tx = asyncio.Event(), asyncio.Event()
        rx = asyncio.create_task(receiver.run(wrong, stop_rx))  # verifies with another secret: 401
        url = await _receiver_url(caplog)
        tx = asyncio.create_task(
            delivery.run(Settings(**{**loopback_settings.__dict__, "webhook_url": url}), stop_tx)
        )
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
    assert committed(broker.bootstrap, delivery.GROUP_ID) == 1


@pytest.mark.slow
@pytest.mark.integration
def test_stop_during_retries_leaves_the_alert_uncommitted(
    broker: EmbeddedBroker, loopback_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    produce(broker.bootstrap, ALERTS, [(b"k", make_alert(1).to_json())])
    stats, stopped_in = run_pair(
        loopback_settings,
        caplog,
        until=lambda s: s["failed_on_purpose"] >= 1,
        receiver_opts={"fail_first": 1000},
        delivery_opts={"policy": RetryPolicy(base_s=30.0, cap_s=60.0)},
        settle_s=0.2,
    )
    assert stats["alerts"] == 0 and stats["failed_on_purpose"] >= 1
    assert stopped_in < 3
    assert committed(broker.bootstrap, delivery.GROUP_ID) == 0


@pytest.mark.slow
@pytest.mark.integration
def test_a_refused_url_pauses_delivery_without_committing(
    broker: EmbeddedBroker, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    produce(broker.bootstrap, ALERTS, [(b"k", make_alert(1).to_json())])
    stats, stopped_in = run_pair(  # no APP_WEBHOOK_ALLOW_PRIVATE: 127.0.0.1 is refused
        settings,
        caplog,
        until=lambda s: metric("webhook_delivery_paused") == 1,
        receiver_opts={},
        delivery_opts={"policy": fast_policy()},
        settle_s=0.2,
    )
    assert stats["received"] == 0
    assert stopped_in < 3
    assert any("SSRF" in r.getMessage() or "non-public" in r.getMessage() for r in caplog.records)
    assert committed(broker.bootstrap, delivery.GROUP_ID) == 0


def test_empty_webhook_url_idles_until_stop(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = make_settings(tmp_path, KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1")

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(delivery.run(settings, stop))
        await asyncio.sleep(0.3)
        assert not task.done()
        stop.set()
        await asyncio.wait_for(task, 2)

    with caplog.at_level(logging.WARNING, logger="app.delivery"):
        asyncio.run(main())
    assert any("delivery disabled" in r.getMessage() for r in caplog.records)
