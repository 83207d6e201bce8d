"""Ingest throughput per adapter, in events/s, against an embedded Apache Kafka broker started here.

Usage: ``python bench/bench_ingest.py [--events N] [--only a,b] [--budget S]``
(``make bench`` runs it with the defaults). Each adapter runs in this process
with its real code path: validation, keying, the publisher with ``acks=all``
and ``linger_ms=5``, waiting for every acknowledgement. The clock runs from
the first input to the moment the broker holds the last event. Load
generators (HTTP client, UDP/TCP senders, the MQTT publisher) share the
machine, and for HTTP and syslog the event loop, with the adapter, so the
figures are a floor for one process on this host, not a cluster figure.

Every adapter is bounded by ``--budget`` seconds (30); one that runs out is
reported as such and the script goes on. mosquitto is started on a free
loopback port when installed; otherwise the MQTT line says it was skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads

import aiohttp  # noqa: E402
import orjson  # noqa: E402
import paho.mqtt.client as mqtt  # noqa: E402
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402
from worker_runs import wait_for_leaders  # noqa: E402

from app import topics  # noqa: E402
from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.broker import KafkaBroker, free_port, kafka_version  # noqa: E402
from app.kafka.clients import end_offsets  # noqa: E402
from app.runtime.settings import Settings  # noqa: E402
from ingest.adapters import apache_events, nab_events  # noqa: E402
from ingest.httpd.server import HttpOptions, serve_http  # noqa: E402
from ingest.mqtt.bridge import MqttOptions, bridge  # noqa: E402
from ingest.mqtt.mapping import parse_map_option  # noqa: E402
from ingest.registry.load import TableRecord  # noqa: E402
from ingest.registry.model import TABLES  # noqa: E402
from ingest.registry.publish import load_table  # noqa: E402
from ingest.replay import replay  # noqa: E402
from ingest.sim.fleet import FleetConfig, fleet_events  # noqa: E402
from ingest.sim.ticks import TickConfig, tick_events  # noqa: E402
from ingest.syslogd.server import SyslogOptions, serve_syslog  # noqa: E402
from ingest.tail.tailer import TailOptions, tail  # noqa: E402

DATASETS = (ROOT / "../shared/datasets").resolve()
NAB = DATASETS / "nab/data/realKnownCause/machine_temperature_system_failure.csv"
APACHE = DATASETS / "apache_logs/apache_logs"
START_MS = 1_700_000_000_000
UDP_OFFERED_PER_S = 10_000


@dataclass
class Result:
    adapter: str
    events: int
    seconds: float
    note: str = ""

    def line(self) -> str:
        rate = f"{self.events / self.seconds:>10,.0f}" if self.seconds > 0 and self.events else f"{'-':>10}"
        return f"{self.adapter:<16}{self.events:>9,}{self.seconds:>9.2f}{rate}  {self.note}"


class Bench:
    """Shared state: settings, scratch directory, sizes."""

    def __init__(self, settings: Settings, tmp: Path, events: int) -> None:
        self.settings, self.tmp, self.n = settings, tmp, events

    async def count(self, topic: str) -> int:
        return (await end_offsets(self.settings.bootstrap_servers, [topic]))[topic]

    async def until(self, topic: str, target: int) -> None:
        while await self.count(topic) < target:
            await asyncio.sleep(0.02)


async def b_replay_nab(b: Bench) -> Result:
    if not NAB.exists():
        return Result("replay-nab", 0, 0, f"skipped: {NAB} missing")
    items = nab_events(str(NAB), device="m1", field="temperature")
    t0 = time.perf_counter()
    s = await replay(b.settings, items, topic=topics.SENSORS, adapter="nab")
    return Result("replay-nab", s.published, time.perf_counter() - t0, "real NAB CSV, 22,695 rows")


async def b_replay_apache(b: Bench) -> Result:
    if not APACHE.exists():
        return Result("replay-apache", 0, 0, f"skipped: {APACHE} missing")
    t0 = time.perf_counter()
    s = await replay(b.settings, apache_events(str(APACHE), host="www"), topic=topics.LOGS, adapter="apache")
    return Result("replay-apache", s.published, time.perf_counter() - t0, "real access log, 10,000 lines")


async def b_sim_fleet(b: Bench) -> Result:
    events = itertools.islice(fleet_events(FleetConfig(42, START_MS, 20, 5)), b.n)
    t0 = time.perf_counter()
    s = await replay(b.settings, events, topic=topics.SENSORS, adapter="sim-fleet")
    return Result("simulate-fleet", s.published, time.perf_counter() - t0, "generation included")


async def b_sim_ticks(b: Bench) -> Result:
    events = itertools.islice(tick_events(TickConfig(7, ("AAPL", "MSFT", "IBM"), START_MS)), b.n)
    t0 = time.perf_counter()
    s = await replay(b.settings, events, topic=topics.FINANCE, adapter="sim-ticks")
    return Result("simulate-ticks", s.published, time.perf_counter() - t0, "generation included")


async def b_tail(b: Bench) -> Result:
    log = b.tmp / "bench-app.log"
    with open(log, "w") as f:
        for i in range(b.n):
            f.write(
                f"[INFO] [req-{i}] [2024/05/01 12:00:00 {i % 1000:03d}] [Api {i % 97}] request {i} done\n"
            )
    opts = TailOptions(str(log), "applog", b.tmp / "bench-tail.state", host="app-1", poll_interval_s=0.05)
    base, stop = await b.count(topics.LOGS), asyncio.Event()
    t0 = time.perf_counter()
    task = asyncio.create_task(tail(b.settings, opts, stop))
    await b.until(topics.LOGS, base + b.n)
    elapsed = time.perf_counter() - t0
    stop.set()
    await task
    return Result("tail-applog", b.n, elapsed, "file written beforehand; parse + state saves")


async def _syslog(b: Bench, transport: str) -> Result:
    stop, ready = asyncio.Event(), asyncio.get_running_loop().create_future()
    opts = SyslogOptions(udp=("127.0.0.1", 0), tcp=("127.0.0.1", 0))
    task = asyncio.create_task(serve_syslog(b.settings, opts, stop, on_ready=ready.set_result))
    bound = await ready
    base = await b.count(topics.LOGS)
    messages = [
        f"<134>1 2024-01-01T00:00:00Z web-{i % 8} app {i} - - request {i}".encode() for i in range(b.n)
    ]
    t0 = time.perf_counter()
    if transport == "tcp":
        _reader, writer = await asyncio.open_connection(*bound["tcp"])
        for start in range(0, b.n, 1000):
            writer.write(b"".join(b"%d %s" % (len(m), m) for m in messages[start : start + 1000]))
            await writer.drain()
        writer.close()
        await b.until(topics.LOGS, base + b.n)
        published, elapsed = b.n, time.perf_counter() - t0
    else:
        await asyncio.to_thread(_send_udp, messages, bound["udp"], UDP_OFFERED_PER_S)
        published, last_progress = 0, time.perf_counter()
        while published < b.n and time.perf_counter() - last_progress < 1.0:  # lost ones never come
            await asyncio.sleep(0.02)
            now = await b.count(topics.LOGS) - base
            if now > published:
                published, last_progress = now, time.perf_counter()
        elapsed = last_progress - t0
    stop.set()
    await task
    lost = b.n - published
    note = (
        "octet counting, one connection"
        if transport == "tcp"
        else f"offered at {UDP_OFFERED_PER_S:,}/s from another thread: {lost} lost"
    )
    return Result(f"syslog-{transport}", published, elapsed, note)


def _send_udp(messages: list[bytes], address: tuple[str, int], per_s: int) -> None:
    """Send at about ``per_s`` datagrams per second, in bursts of 50."""
    t0 = time.perf_counter()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i, m in enumerate(messages):
            s.sendto(m, address)
            if i % 50 == 49:
                ahead = t0 + (i + 1) / per_s - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)


async def b_syslog_tcp(b: Bench) -> Result:
    return await _syslog(b, "tcp")


async def b_syslog_udp(b: Bench) -> Result:
    return await _syslog(b, "udp")


async def _http(b: Bench, batch: int) -> Result:
    stop, ready = asyncio.Event(), asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve_http(b.settings, HttpOptions(port=0), stop, on_ready=ready.set_result))
    url = await ready
    n = b.n if batch > 1 else min(b.n, 2000)
    events = [{"device_id": f"d-{i % 50}", "ts": "2024-01-01T00:00:00Z", "temperature": i} for i in range(n)]
    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as client:
        if batch > 1:
            headers = {"Content-Type": "application/x-ndjson"}
            for start in range(0, n, batch):
                body = b"\n".join(orjson.dumps(e) for e in events[start : start + batch])
                async with client.post(f"{url}/v1/events/sensors", data=body, headers=headers) as r:
                    assert r.status == 202, await r.text()
        else:

            async def one(chunk: list[dict[str, object]]) -> None:
                for e in chunk:
                    async with client.post(f"{url}/v1/events/sensors", json=e) as r:
                        assert r.status == 202, await r.text()

            await asyncio.gather(*(one(events[i::16]) for i in range(16)))
    elapsed = time.perf_counter() - t0
    stop.set()
    await task
    note = f"NDJSON batches of {batch}" if batch > 1 else "one event per request, 16 concurrent clients"
    return Result("http-batch" if batch > 1 else "http-single", n, elapsed, note)


async def b_http_batch(b: Bench) -> Result:
    return await _http(b, 1000)


async def b_http_single(b: Bench) -> Result:
    return await _http(b, 1)


async def _mqtt(b: Bench, inflight: int) -> Result:
    name = f"mqtt-inflight{inflight}"
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not os.access(binary, os.X_OK):
        return Result(name, 0, 0, "skipped: mosquitto not installed")
    port = free_port()
    conf = b.tmp / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        f"max_queued_messages 0\nmax_inflight_messages {inflight}\n"
    )
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    try:
        await asyncio.sleep(0.3)
        n = min(b.n, 10_000)
        rules = (parse_map_option("sensors/+device_id/temperature=temperature"),)
        opts = MqttOptions("127.0.0.1", port, f"bench-bridge-{inflight}", rules)

        async def run_bridge(until: int) -> None:
            stop, connected = asyncio.Event(), asyncio.Event()
            task = asyncio.create_task(bridge(b.settings, opts, stop, on_connected=connected.set))
            await asyncio.wait_for(connected.wait(), 10)
            await b.until(topics.SENSORS, until)
            stop.set()
            await task

        base = await b.count(topics.SENSORS)
        await run_bridge(base)  # creates the persistent session
        await asyncio.to_thread(_mqtt_publish, port, n)  # queued by mosquitto for the absent bridge
        t0 = time.perf_counter()
        await run_bridge(base + n)
        elapsed = time.perf_counter() - t0
        note = f"QoS 1 backlog drained, PUBACK after the Kafka ack; max_inflight_messages {inflight}"
        return Result(name, n, elapsed, note)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


async def b_mqtt_20(b: Bench) -> Result:
    return await _mqtt(b, 20)  # mosquitto's default


async def b_mqtt_1000(b: Bench) -> Result:
    return await _mqtt(b, 1000)


def _mqtt_publish(port: int, n: int) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-publisher")
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [client.publish(f"sensors/d-{i % 50}/temperature", str(i), qos=1) for i in range(n)]
        for info in infos:
            info.wait_for_publish(timeout=30)
    finally:
        client.disconnect()
        client.loop_stop()


async def b_registry(b: Bench) -> Result:
    spec = TABLES["devices"]
    n = min(b.n, 10_000)
    rows = [spec.parse_row({"device_id": f"dev-{i}", "site": f"s{i % 9}", "max_temp": 30}) for i in range(n)]
    records = [TableRecord(key, value, i) for i, (key, value) in enumerate(rows)]
    t0 = time.perf_counter()
    summary = await load_table(b.settings, spec, records)
    return Result("registry", summary.upserted, time.perf_counter() - t0, "validation done beforehand")


BENCHES: dict[str, Callable[[Bench], Awaitable[Result]]] = {
    "replay-nab": b_replay_nab,
    "replay-apache": b_replay_apache,
    "simulate-fleet": b_sim_fleet,
    "simulate-ticks": b_sim_ticks,
    "tail": b_tail,
    "syslog-tcp": b_syslog_tcp,
    "syslog-udp": b_syslog_udp,
    "http-batch": b_http_batch,
    "http-single": b_http_single,
    "mqtt-inflight20": b_mqtt_20,
    "mqtt-inflight1000": b_mqtt_1000,
    "registry": b_registry,
}


async def _bounded(name: str, bench: Bench, budget_s: float) -> Result:
    try:
        return await asyncio.wait_for(BENCHES[name](bench), budget_s)
    except TimeoutError:
        return Result(name, 0, budget_s, f"did not finish within {budget_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events per adapter (20000)")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHES)}")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds allowed per adapter (30)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",")] if args.only else list(BENCHES)
    unknown = set(names) - set(BENCHES)
    if unknown:
        parser.error(f"unknown adapters: {', '.join(sorted(unknown))}")
    with (
        tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp,
        KafkaBroker(Path(tmp) / "kafka") as broker,
    ):
        asyncio.run(ensure_topics(broker.bootstrap, partitions=4))
        asyncio.run(wait_for_leaders(broker.bootstrap, [t.name for t in topics.TOPICS]))
        env = {"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "APP_DATA_DIR": tmp}
        bench = Bench(Settings.from_env(env), Path(tmp), args.events)
        kafka = f"Apache Kafka {kafka_version()} on {broker.bootstrap}"
        print(f"ingest throughput, {kafka}, {os.cpu_count()} CPUs, acks=all, idempotent")
        print(f"{'adapter':<16}{'events':>9}{'seconds':>9}{'events/s':>10}  note")
        results = []
        for name in names:
            result = asyncio.run(_bounded(name, bench, args.budget))
            results.append(result)
            print(result.line(), flush=True)
    failed = [r for r in results if r.note.startswith("did not finish")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
