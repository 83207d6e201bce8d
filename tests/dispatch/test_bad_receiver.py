"""One receiver with an unusable configuration: `routes check` refuses it with its position,
and the dispatcher disables it alone (ERROR, metric) while every other receiver delivers,
at start and after a reload."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from app.cli.main import main
from app.dispatch.config import load_routes
from app.dispatch.messages import OutboxMessage
from app.kafka.broker import KafkaBroker
from app.notify import RetryPolicy
from app.notify.check import receiver_problems
from app.roles import dispatch as dispatch_role
from app.roles.delivery import OutboxSender
from app.storage.dispatch_db import DispatchDB
from app.topics import ALERTS
from tests.dispatch.harness import http_receiver, publish, role_settings, until, write_routes
from tests.dispatch.helpers import SECRET, alert

BAD_URLS = ["file:///etc/passwd", "gopher://127.0.0.1:70/_x", "http:///no-host"]


def bad_receiver(url: str) -> str:
    return f'  - {{name: broken, type: webhook, url: "{url}", secret: "{SECRET}"}}\n'


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("url", BAD_URLS)
def test_routes_check_refuses_what_dispatch_would_refuse(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    routes = write_routes(
        tmp_path / "routes.yaml", "https://hooks.example.com/a", extra_receivers=bad_receiver(url)
    )
    assert main(["routes", "check", str(routes)]) == 1
    out = capsys.readouterr().out
    assert f"{routes}:3:" in out and "receiver 'broken': 'url':" in out
    assert "must be http:// or https:// with a host" in out
    load_routes(routes)  # the file itself is well-formed: the dispatcher starts and disables it


def test_routes_check_knows_the_allow_list_with_its_ports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    routes = write_routes(tmp_path / "routes.yaml", "http://127.0.0.1:8080/hook")
    assert main(["routes", "check", str(routes)]) == 1
    assert "non-public address" in capsys.readouterr().out
    monkeypatch.setenv("APP_WEBHOOK_ALLOW_PRIVATE", "127.0.0.1:9090")  # another port only
    assert main(["routes", "check", str(routes)]) == 1
    monkeypatch.setenv("APP_WEBHOOK_ALLOW_PRIVATE", "127.0.0.1:8080")
    assert main(["routes", "check", str(routes)]) == 0


def test_every_unusable_setting_is_named(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(
        'receivers:\n  - {name: r, type: webhook, url: "ftp://x/y", secret: "not base64!", timeout: 0s,'
        ' headers: {"bad name": "v", "X-Ok": "a\\nb"}}\nroute: {receiver: r}\n'
    )
    fields = [field for field, _ in receiver_problems(load_routes(path, {}).receivers[0])]
    assert fields == ["url", "secret", "timeout", "headers", "headers"]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("when", ["at start", "after a reload"])
def test_one_bad_receiver_is_disabled_alone_and_the_others_deliver(
    when: str, broker: KafkaBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = role_settings(broker, tmp_path)
    routes = tmp_path / "routes.yaml"
    both = "  routes:\n    - {receiver: broken, continue: true}\n    - {receiver: ops}\n"
    with http_receiver() as rx:

        def good(url: str) -> None:
            write_routes(routes, url, extra_receivers=bad_receiver("file:///etc/passwd"), route=both)

        async def scenario() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(dispatch_role.run(cfg, stop, routes_file=routes))
            if when == "after a reload":
                await asyncio.to_thread(publish, broker.bootstrap, ALERTS, [alert("d0")])
                await until(task, lambda: alert("d0").alert_id in rx.verified_ids("/hook"))
                good(rx.url("/v2"))
                await until(task, lambda: "routes file reloaded" in caplog.text)
            await asyncio.to_thread(publish, broker.bootstrap, ALERTS, [alert("d1")])
            path = "/hook" if when == "at start" else "/v2"
            await until(task, lambda: alert("d1").alert_id in rx.verified_ids(path))
            assert not task.done()
            stop.set()
            await asyncio.wait_for(task, 15)

        with caplog.at_level(logging.INFO):
            if when == "at start":
                good(rx.url("/hook"))
            else:
                write_routes(
                    routes, rx.url("/hook"), extra_receivers=bad_receiver("https://hooks.example.com/x")
                )
            asyncio.run(asyncio.wait_for(scenario(), 90))
    disabled = [r for r in caplog.records if "RECEIVER broken DISABLED" in r.getMessage()]
    assert disabled and disabled[0].levelno == logging.ERROR
    assert "file:///etc/passwd must be http:// or https:// with a host" in disabled[0].getMessage()
    assert metric("dispatch_receiver_invalid", receiver="broken") == 1
    assert metric("dispatch_receiver_invalid", receiver="ops") == 0


def test_a_transport_that_raises_disables_its_receiver_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = DispatchDB(tmp_path / "d.sqlite3")
    db.commit([], {}, [OutboxMessage("m1", "odd", "g", 1000.0, b"{}", ("a1",))])

    class Broken:
        disabled = False

        async def deliver(self, msg_id: str, body: bytes, key: str = "") -> None:
            raise UnicodeError("a header the transport cannot encode")

        async def aclose(self) -> None:
            return None

    sender = OutboxSender(db, "odd", Broken(), RetryPolicy(), max_age_s=60, clock=lambda: 1000.0)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(sender.run(stop))
        for _ in range(50):
            if sender.unusable:
                break
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.wait_for(task, 3)  # the sender ends normally: nothing escaped it

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert "UnicodeError" in sender.unusable
    assert db.counts() == {"pending": 1}
    assert any("RECEIVER odd DISABLED" in r.getMessage() for r in caplog.records)
