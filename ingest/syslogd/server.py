"""``python -m ingest syslog``: receive syslog over UDP and/or TCP onto ``events.logs``.

Each message (a UDP datagram, or a TCP frame: :mod:`ingest.syslogd.framing`)
is parsed by :func:`ingest.adapters.syslog.parse_received` with the sender's address as the
host of last resort and the arrival time as the receive time (also the time of a
message without a timestamp, as a relay stamps it), validated and
published keyed by host. Messages that do not parse, and framing errors, go to
``dlq.events`` with the transport and sender in the reason.

Backpressure: messages wait in a bounded queue for the single publishing
task. A TCP connection stops being read while the queue is full (the sender
is slowed by TCP); a UDP datagram that finds the queue full is dropped and
counted in ``ingest_syslog_dropped_total``, since UDP cannot be slowed. The
UDP socket asks for a 4 MiB receive buffer so bursts wait in the kernel; Linux
caps it at ``net.core.rmem_max`` (a warning says so), beyond which the kernel
drops datagrams without telling anyone.

Stopping (``stop`` set): the listeners close, open TCP connections are closed
after the frames already received are queued, the queue is drained and every
record is flushed before the summary is returned. Lifecycle and threading:
one event loop; :func:`serve_syslog` owns every socket it opens.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, tzinfo
from typing import NamedTuple

from prometheus_client import Counter

from app.runtime.settings import Settings
from app.topics import LOGS
from ingest.adapters.logbase import LineContext
from ingest.adapters.logformats import log_format, parse_log_line
from ingest.adapters.syslog import parse_received
from ingest.publisher import Publisher
from ingest.runtime import AdapterSummary, take_batch
from ingest.syslogd.framing import FrameDecoder, FramingError

logger = logging.getLogger(__name__)

RECEIVED = Counter("ingest_syslog_received_total", "Syslog messages received", ["transport"])
DROPPED = Counter("ingest_syslog_dropped_total", "UDP syslog messages dropped: queue full")

Address = tuple[str, int]
_CLOSE_TIMEOUT_S = 5.0  # for open TCP connections to hand over their last frames


@dataclass(frozen=True)
class SyslogOptions:
    """Where to listen (None: not on that transport) and the limits."""

    udp: Address | None = None
    tcp: Address | None = None
    tz: tzinfo = UTC
    max_message_bytes: int = 64 * 1024
    queue_size: int = 10_000
    udp_rcvbuf_bytes: int = 4 * 1024 * 1024


class _Message(NamedTuple):
    raw: bytes | FramingError
    transport: str
    sender: str
    received_ms: int


def _grow_receive_buffer(sock: socket.socket, size: int) -> None:
    """Ask for a large UDP receive buffer: bursts then wait in the kernel, not on the floor."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    if got < size:
        logger.warning(
            "UDP receive buffer is %d bytes, not %d: raise net.core.rmem_max to survive bursts", got, size
        )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, queue: asyncio.Queue[_Message], counts: dict[str, int]) -> None:
        self._queue, self._counts = queue, counts

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        RECEIVED.labels("udp").inc()
        message = _Message(data.strip(b"\x00").removesuffix(b"\n"), "udp", str(addr[0]), _now_ms())
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            self._counts["dropped"] += 1
            DROPPED.inc()


async def serve_syslog(
    settings: Settings,
    opts: SyslogOptions,
    stop: asyncio.Event,
    on_ready: Callable[[dict[str, Address]], None] | None = None,
) -> AdapterSummary:
    """Listen until ``stop`` is set; ``on_ready`` gets the bound addresses."""
    fmt = replace(log_format("syslog"), parse=parse_received)  # a file's parser refuses a line with no time
    queue: asyncio.Queue[_Message] = asyncio.Queue(opts.queue_size)
    counts = {"udp": 0, "tcp": 0, "dropped": 0, "connections": 0}
    conns: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}

    async def on_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            conns[writer] = task
        counts["connections"] += 1
        sender = str(writer.get_extra_info("peername")[0])
        decoder = FrameDecoder(opts.max_message_bytes)
        try:
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    RECEIVED.labels("tcp").inc()
                    await queue.put(_Message(frame, "tcp", sender, _now_ms()))
        except (ConnectionError, OSError) as exc:
            logger.info("tcp connection from %s ended: %r", sender, exc)
        finally:
            for frame in decoder.close():
                await queue.put(_Message(frame, "tcp", sender, _now_ms()))
            conns.pop(writer, None)
            writer.close()

    async with Publisher(settings, LOGS, "logs", "syslog") as pub:

        async def publish(message: _Message) -> None:
            counts[message.transport] += 1
            where = f"{message.transport} from {message.sender}"
            if isinstance(message.raw, FramingError):
                await pub.reject(f"{where}: {message.raw.reason}", message.raw.raw)
                return
            ctx = LineContext(message.sender, opts.tz, message.received_ms)
            text = message.raw.decode("utf-8", errors="replace")
            await pub.submit(parse_log_line(fmt, text, ctx, 0, message.raw), where=where)

        loop = asyncio.get_running_loop()
        bound: dict[str, Address] = {}
        udp_transport, tcp_server = None, None
        try:
            if opts.udp:
                udp_transport, _ = await loop.create_datagram_endpoint(
                    lambda: _Udp(queue, counts), local_addr=opts.udp
                )
                bound["udp"] = udp_transport.get_extra_info("sockname")[:2]
                _grow_receive_buffer(udp_transport.get_extra_info("socket"), opts.udp_rcvbuf_bytes)
            if opts.tcp:
                tcp_server = await asyncio.start_server(on_tcp, *opts.tcp, limit=opts.max_message_bytes)
                bound["tcp"] = tcp_server.sockets[0].getsockname()[:2]
            logger.info("syslog listening on %s", ", ".join(f"{k} {h}:{p}" for k, (h, p) in bound.items()))
            if on_ready:
                on_ready(bound)
            while not stop.is_set() and (batch := await take_batch(queue, stop)):
                for message in batch:
                    await publish(message)
        finally:
            if udp_transport is not None:
                udp_transport.close()
            if tcp_server is not None:
                tcp_server.close()
            handlers = set(conns.values())
            for writer in list(conns):
                writer.close()
            deadline = loop.time() + _CLOSE_TIMEOUT_S
            while (handlers or not queue.empty()) and loop.time() < deadline:
                while not queue.empty():
                    await publish(queue.get_nowait())
                if handlers:
                    _, handlers = await asyncio.wait(handlers, timeout=0.05)
    return AdapterSummary.of(pub, **counts)
