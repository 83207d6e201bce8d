"""Routes file hot reload: the watcher alone, then the dispatch role on the real broker."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from app.dispatch.config import load_routes
from app.dispatch.reload import RoutesWatcher
from app.kafka.broker import KafkaBroker
from app.roles import dispatch as dispatch_role
from app.topics import ALERTS
from tests.dispatch.harness import http_receiver, publish, role_settings, until, write_routes
from tests.dispatch.helpers import BASE, TIMERS, FakeClock, alert

BROKEN = "route:\n  receiver: nobody\n  group_wait: soon\n"


def test_watcher_adopts_a_valid_edit_and_keeps_the_last_good_config_on_errors(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(BASE + TIMERS)
    clock = FakeClock(0.0)
    watcher = RoutesWatcher(path, load_routes(path), clock=clock)
    assert watcher.poll() is None  # unchanged
    path.write_text(BASE + TIMERS.replace("receiver: ops", "receiver: pager"))
    assert watcher.poll() is None  # not checked again within a second
    clock.advance(1.0)
    edited = watcher.poll()
    assert edited is not None and edited.route.receiver == "pager"
    path.write_text(BASE + BROKEN)
    clock.advance(1.0)
    assert watcher.poll() is None and watcher.current is edited
    (problem,) = watcher.problems
    assert problem.startswith(f"{path}:9:15: 'group_wait': expected a duration"), problem
    clock.advance(1.0)
    assert watcher.poll() is None  # the same bad file is reported once
    path.unlink()
    clock.advance(1.0)
    assert watcher.poll() is None and watcher.current is edited  # a missing file changes nothing


@pytest.mark.slow
@pytest.mark.integration
def test_the_role_applies_an_edited_routes_file_and_rejects_a_broken_one(
    broker: KafkaBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = role_settings(broker, tmp_path)
    routes = tmp_path / "routes.yaml"
    with http_receiver() as rx:

        def at(path: str) -> set[str]:
            return set(rx.verified_ids(path))

        async def main() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(dispatch_role.run(cfg, stop, routes_file=routes))

            await asyncio.to_thread(publish, broker.bootstrap, ALERTS, [alert("d1")])
            await until(task, lambda: alert("d1").alert_id in at("/hook"))
            write_routes(routes, rx.url("/v2"))  # the same receiver moved to another URL
            await asyncio.sleep(1.5)
            await asyncio.to_thread(publish, broker.bootstrap, ALERTS, [alert("d2")])
            await until(task, lambda: alert("d2").alert_id in at("/v2"))
            # a broken edit is rejected; the last good config keeps running
            routes.write_text(routes.read_text().replace("group_wait: 100ms", "group_wait: sometime"))
            await until(task, lambda: "routes file" in caplog.text and "rejected" in caplog.text)
            await asyncio.to_thread(publish, broker.bootstrap, ALERTS, [alert("d3")])
            await until(task, lambda: alert("d3").alert_id in at("/v2"))
            stop.set()
            await asyncio.wait_for(task, 15)

        with caplog.at_level(logging.INFO):
            write_routes(routes, rx.url("/hook"))
            asyncio.run(asyncio.wait_for(main(), 90))
        assert at("/hook") == {alert("d1").alert_id}
    rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(rejected) == 1 and f"{routes}:" in rejected[0] and "group_wait" in rejected[0], rejected
    assert any("routes file reloaded" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
@pytest.mark.integration
def test_edited_retry_settings_apply_to_the_next_attempt_without_a_restart(
    broker: KafkaBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = role_settings(broker, tmp_path)
    routes = tmp_path / "routes.yaml"
    with http_receiver(status=503) as rx:

        def attempts() -> int:
            return sum(1 for r in rx.requests if r.path == "/hook")

        async def main() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(dispatch_role.run(cfg, stop, routes_file=routes))

            await until(task, lambda: "dispatching" in caplog.text, 30)  # running with the slow retries
            # the same receiver, retries now within 200 ms instead of up to a minute
            write_routes(routes, rx.url("/hook"))
            routes.write_text(routes.read_text().replace("retry_cap: 500ms", "retry_cap: 200ms"))
            await until(task, lambda: "routes file reloaded" in caplog.text, 10)
            await asyncio.to_thread(publish, broker.bootstrap, ALERTS, [alert("d1")])
            await until(task, lambda: attempts() >= 1, 20)
            rx.status = 204
            await until(task, lambda: attempts() >= 2, 4)  # the old policy: 0 to 60 s, rarely below 4
            stop.set()
            await asyncio.wait_for(task, 15)

        with caplog.at_level(logging.INFO):
            write_routes(routes, rx.url("/hook"))
            slow = routes.read_text().replace("retry_base: 100ms", "retry_base: 60s")
            routes.write_text(slow.replace("retry_cap: 500ms", "retry_cap: 60s"))
            asyncio.run(asyncio.wait_for(main(), 90))
    assert alert("d1").alert_id in rx.verified_ids("/hook")
