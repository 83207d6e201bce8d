"""The HTTP ingest endpoint on loopback against the real broker: good, bad and mixed batches."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from app import topics
from app.runtime.settings import Settings
from ingest.httpd.server import HttpOptions, serve_http
from ingest.runtime import AdapterSummary
from tests.ingest.conftest import stop_task, topic_count
from tests.kafka_helpers import consume, consume_json

pytestmark = [pytest.mark.slow, pytest.mark.integration]

NDJSON = {"Content-Type": "application/x-ndjson"}
Scenario = Callable[[aiohttp.ClientSession, str], Awaitable[None]]


def _reading(i: int, **extra: Any) -> dict[str, Any]:
    return {"device_id": f"dev-{i % 3}", "ts": "2024-01-01T00:00:00Z", "temperature": 20 + i, **extra}


def _batch(*events: Any) -> bytes:
    return b"\n".join(e if isinstance(e, bytes) else orjson.dumps(e) for e in events) + b"\n"


def _serve(settings: Settings, scenario: Scenario, **options: Any) -> AdapterSummary:
    async def run() -> AdapterSummary:
        stop = asyncio.Event()
        ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        opts = HttpOptions(port=0, **options)
        task = asyncio.create_task(serve_http(settings, opts, stop, on_ready=ready.set_result))
        url = await asyncio.wait_for(ready, 15)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as client:
                await scenario(client, url)
        finally:
            summary = await stop_task(stop, task)
        return summary

    return asyncio.run(run())


@pytest.mark.timeout(60)
def test_single_event_and_batch_get_202_after_the_broker_has_them(settings: Settings) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.post(f"{url}/v1/events/sensors", json=_reading(0)) as r:
            assert (r.status, await r.json()) == (202, {"accepted": 1})
        assert await topic_count(settings.bootstrap_servers, topics.SENSORS) == 1  # acked before 202
        body = _batch(*(_reading(i) for i in range(1, 101)))
        async with client.post(f"{url}/v1/events/sensors", data=body, headers=NDJSON) as r:
            assert (r.status, await r.json()) == (202, {"accepted": 100})
        assert await topic_count(settings.bootstrap_servers, topics.SENSORS) == 101
        log = {"host": "web-1", "ts": "2024-01-01T00:00:00Z", "status": 500, "path": "/x"}
        async with client.post(f"{url}/v1/events/logs", json=log) as r:
            assert r.status == 202
        async with client.get(f"{url}/healthz") as r:
            assert (r.status, await r.text()) == (200, "ok")

    summary = _serve(settings, scenario)
    assert (summary.published, summary.dlq, summary.extra["requests"]) == (102, 0, 3)
    records = consume(settings.bootstrap_servers, topics.SENSORS, min_count=101)
    assert {r.key for r in records} == {b"dev-0", b"dev-1", b"dev-2"}
    assert consume_json(settings.bootstrap_servers, topics.LOGS, min_count=1)[0]["status"] == 500


@pytest.mark.timeout(60)
def test_a_mixed_batch_is_rejected_whole_with_per_line_errors(settings: Settings) -> None:
    bad_ts = _reading(2, ts="yesterday")
    body = _batch(_reading(1), bad_ts, b"", b'{"device_id": "d", "ts"', _reading(4, colour="red"))

    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        async with client.post(f"{url}/v1/events/sensors", data=body, headers=NDJSON) as r:
            assert r.status == 400
            answer = await r.json()
        assert (answer["accepted"], answer["rejected"], answer["published"]) == (0, 3, False)
        assert [(e["line"], e["field"]) for e in answer["errors"]] == [(2, "ts"), (4, None), (5, "colour")]
        assert "not an RFC 3339 timestamp" in answer["errors"][0]["reason"]
        assert "resend the whole batch" in answer["detail"]
        all_bad = _batch(*(_reading(i, ts="x") for i in range(150)))
        async with client.post(f"{url}/v1/events/sensors", data=all_bad, headers=NDJSON) as r:
            answer = await r.json()
        assert (r.status, len(answer["errors"]), answer["errors_truncated"]) == (400, 100, True)

    summary = _serve(settings, scenario)
    assert (summary.published, summary.dlq) == (0, 153)
    assert asyncio.run(topic_count(settings.bootstrap_servers, topics.SENSORS)) == 0
    dead = consume_json(settings.bootstrap_servers, topics.DLQ, min_count=153)
    assert [d["reason"].split(":")[0] for d in dead[:3]] == ["http line 2", "http line 4", "http line 5"]
    assert orjson.loads(dead[0]["raw"]) == bad_ts


@pytest.mark.timeout(60)
def test_limits_types_sources_and_auth(settings: Settings, tmp_path: Path) -> None:
    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        auth = {"Authorization": "Bearer s3cret"}
        cases: list[tuple[str, dict[str, str], bytes, int]] = [
            ("sensors", {**auth, **NDJSON}, b"x" * 5000, 413),
            ("sensors", {**auth, "Content-Type": "text/plain"}, b"{}", 415),
            ("weather", {**auth, "Content-Type": "application/json"}, b"{}", 404),
            ("sensors", {**auth, **NDJSON}, b"\n\n", 400),
            ("sensors", {"Content-Type": "application/json"}, orjson.dumps(_reading(1)), 401),
            ("sensors", {**auth, "Content-Type": "application/json"}, b"[1, 2]", 400),
            ("sensors", {**auth, "Content-Type": "application/json"}, orjson.dumps(_reading(1)), 202),
        ]
        for source, headers, body, status in cases:
            async with client.post(f"{url}/v1/events/{source}", data=body, headers=headers) as r:
                assert r.status == status, (source, headers, await r.text())

    summary = _serve(settings, scenario, max_body_bytes=4096, token="s3cret")
    assert (summary.published, summary.dlq) == (1, 1)


@pytest.mark.timeout(60)
def test_events_from_a_bad_clock_or_with_a_repeated_key_are_refused(settings: Settings) -> None:
    """A device whose clock says 2099 was accepted (202) and wrecked its partition's clock;
    one that repeated a key had its first value silently replaced."""
    now = datetime.now(tz=UTC)
    future = _reading(1, ts="2099-12-31T00:00:00Z")
    repeated = b'{"device_id": "dev-1", "ts": "%s", "temperature": 20, "temperature": 99}' % (
        now.isoformat().encode()
    )

    async def scenario(client: aiohttp.ClientSession, url: str) -> None:
        for body, field, reason in (
            (orjson.dumps(future), "ts", "ahead of the wall clock"),
            (repeated, "temperature", "key 'temperature' appears more than once"),
        ):
            async with client.post(f"{url}/v1/events/sensors", data=body, headers=NDJSON) as r:
                answer = await r.json()
            assert r.status == 400, answer
            assert answer["errors"][0]["field"] == field and reason in answer["errors"][0]["reason"]
        present = _reading(2, ts=now.isoformat())
        async with client.post(f"{url}/v1/events/sensors", json=present) as r:
            assert r.status == 202

    summary = _serve(settings, scenario)
    assert (summary.published, summary.dlq) == (1, 2)
    dead = consume_json(settings.bootstrap_servers, topics.DLQ, min_count=2)
    assert "(max skew 5m, APP_MAX_EVENT_SKEW)" in dead[0]["reason"] and dead[0]["field"] == "ts"
    assert dead[1]["raw"] == repeated.decode()
