"""The syslog receiver on loopback UDP and TCP, against the real broker."""

from __future__ import annotations

import asyncio
import socket

import orjson
import pytest

from app import topics
from app.kafka.broker import free_port
from app.runtime.settings import Settings
from ingest.syslogd.server import Address, SyslogOptions, serve_syslog
from tests.ingest.conftest import stop_task, udp_port, until_count
from tests.kafka_helpers import consume_json

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RFC5424 = b"<165>1 2003-10-11T22:14:15.003Z web-1 evntslog 8710 ID47 - An application event"
RFC3164 = b"<34>Oct 11 22:14:15 web-2 su[230]: 'su root' failed"


async def _serve(settings: Settings, send: object, expect: int) -> dict[str, object]:
    """Start the receiver, run ``send(addresses)`` and stop once ``expect`` records landed."""
    stop = asyncio.Event()
    ready: asyncio.Future[dict[str, Address]] = asyncio.get_running_loop().create_future()
    opts = SyslogOptions(
        udp=("127.0.0.1", udp_port()), tcp=("127.0.0.1", free_port()), max_message_bytes=4096
    )
    task = asyncio.create_task(serve_syslog(settings, opts, stop, on_ready=ready.set_result))
    bound = await asyncio.wait_for(ready, 10)
    await send(bound)  # type: ignore[operator]
    await until_count(settings.bootstrap_servers, topics.LOGS, expect)
    return orjson.loads((await stop_task(stop, task)).to_json())


@pytest.mark.timeout(60)
def test_udp_datagrams_of_both_rfcs(settings: Settings) -> None:
    async def send(bound: dict[str, Address]) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for datagram in (RFC5424, RFC3164 + b"\n", b"<13>1 not-a-time h - - - - x"):
                s.sendto(datagram, bound["udp"])

    summary = asyncio.run(_serve(settings, send, 2))
    assert (summary["published"], summary["dlq"], summary["udp"], summary["tcp"]) == (2, 1, 3, 0)
    by_host = {e["host"]: e for e in consume_json(settings.bootstrap_servers, topics.LOGS, min_count=2)}
    assert by_host["web-1"] == {
        "host": "web-1", "ts": "2003-10-11T22:14:15.003Z", "facility": "local4", "severity": "notice",
        "level": "INFO", "program": "evntslog", "pid": 8710, "message": "An application event",
    }  # fmt: skip
    assert (by_host["web-2"]["program"], by_host["web-2"]["severity"]) == ("su", "crit")
    (dead,) = consume_json(settings.bootstrap_servers, topics.DLQ, min_count=1)
    assert dead["reason"].startswith("udp from 127.0.0.1: RFC 5424 TIMESTAMP 'not-a-time'")
    assert dead["adapter"] == "syslog"


@pytest.mark.timeout(60)
def test_tcp_octet_counting_and_newline_framing(settings: Settings) -> None:
    multi = b"<11>1 2024-01-01T00:00:00Z app-1 api 7 - - boom\nTraceback: x"

    async def send(bound: dict[str, Address]) -> None:
        _reader, writer = await asyncio.open_connection(*bound["tcp"])
        writer.write(str(len(multi)).encode() + b" " + multi)  # octet counting keeps the newline
        writer.write(RFC3164 + b"\n" + b"<13>Oct 11 22:14:16 ")
        await writer.drain()
        writer.write(b"web-3 cron[1]: split across writes\n")
        writer.write(b"9999999 " + b"x" * 100)  # oversized frame: dead-lettered, then skipped
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    summary = asyncio.run(_serve(settings, send, 3))
    assert (summary["published"], summary["dlq"], summary["connections"]) == (3, 1, 1)
    events = consume_json(settings.bootstrap_servers, topics.LOGS, min_count=3)
    assert {e["host"] for e in events} == {"app-1", "web-2", "web-3"}
    assert next(e for e in events if e["host"] == "app-1")["message"] == "boom\nTraceback: x"
    (dead,) = consume_json(settings.bootstrap_servers, topics.DLQ, min_count=1)
    assert "9999999 bytes exceeds 4096" in dead["reason"]
