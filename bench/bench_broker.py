"""Apache Kafka's own floor on this host: produce, consume, one hop and an echo's round trip,
with no Faust and no rules.

Run: ``make bench`` or ``.venv/bin/python bench/bench_broker.py [--events N] [--rate R]
[--seconds S] [--partitions P]``. About a minute with the defaults, on one embedded broker
(``app.kafka.broker.KafkaBroker`` over a temporary home). Small JSON sensor events (~110 bytes),
keys spread over P partitions (4):

* **echo**: R events/s (5,000) for S seconds (10) through ``latency_runs.ECHO_WORKER`` (another process:
  consume each record, produce it to ``alerts``; producer linger 1 ms), from the event's
  CreateTime to the echo's broker append time (``alerts`` is created with ``LogAppendTime``).
  It is the floor of ``bench_rules.py``'s latency run without the rule traffic's mix;
* **produce**: N events (200,000) through one aiokafka producer with the app's publisher
  settings (``app.kafka.clients``: acks=all, idempotent, linger 5 ms), until the last is acked;
* **consume**: a bare consumer (no group, no decoding) reading them from the start;
* **one hop** at R events/s (5,000) for S seconds (10), producer linger 1 ms (the worker's):
  each record's CreateTime to its receipt by a caught-up consumer, once with aiokafka's
  default fetch wait (500 ms) and once with Faust's (1,500 ms). Apache Kafka answers a fetch
  as soon as a record arrives, so the wait should not show in the latency.

Each paced part also prints the broker's CPU share over it, from ``/proc``. The figures
include whatever else runs on the host's CPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads

import orjson  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402
from latency_runs import ECHO_WORKER, log_append_time_alerts  # noqa: E402
from worker_runs import (  # noqa: E402
    close_probe,
    cpu_seconds,
    percentiles,
    wait_for_leaders,
    worker_process,
)

from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.broker import KafkaBroker, kafka_version  # noqa: E402
from app.kafka.clients import make_producer  # noqa: E402
from app.runtime.settings import Settings  # noqa: E402
from app.topics import ALERTS, SENSORS  # noqa: E402

TICK_S = 0.002
FAUST_FETCH_WAIT_MS = 1500  # faust.transport.drivers.aiokafka builds its consumer with it
AIOKAFKA_FETCH_WAIT_MS = 500  # aiokafka's default
BODY = orjson.dumps(
    {"device_id": "dev-0000", "ts": "2026-01-01T00:00:00.000Z", "temperature": 21.5, "pad": "x" * 40}
)
KEYS = [f"dev-{i:04d}".encode() for i in range(100)]


async def produce_rate(bootstrap: str, n: int) -> float:
    """Events/s through one producer with the app's publisher settings, every ack awaited."""
    producer = make_producer(Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": bootstrap}))
    await producer.start()
    try:
        started = time.perf_counter()
        futures = [await producer.send(SENSORS, BODY, key=KEYS[i % len(KEYS)]) for i in range(n)]
        await asyncio.gather(*futures)
        return n / (time.perf_counter() - started)
    finally:
        await producer.stop()


async def consume_rate(bootstrap: str, n: int) -> float:
    """Records/s a bare consumer reads from the topic's start (from its first fetched batch)."""
    consumer = AIOKafkaConsumer(SENSORS, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        got, started, deadline = 0, 0.0, time.monotonic() + 60
        while got < n and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
            if batch and not started:
                started = time.perf_counter()
            got += sum(len(records) for records in batch.values())
        return got / max(time.perf_counter() - started, 1e-6) if started else 0.0
    finally:
        await consumer.stop()


async def paced(
    bootstrap: str, rate: float, seconds: float, read_topic: str, fetch_wait_ms: int
) -> list[float]:
    """Pace ``rate`` events/s into the sensors topic for ``seconds`` (linger 1 ms) while a
    consumer of ``read_topic`` (from its end) takes each record's latency: its timestamp (an
    echo's append time, or the event's CreateTime) minus the event's CreateTime, which the
    echo carries over as the record's value, in ms."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1, acks="all", enable_idempotence=True)
    consumer = AIOKafkaConsumer(
        read_topic, bootstrap_servers=bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=fetch_wait_ms
    )
    await producer.start()
    await consumer.start()
    await consumer.seek_to_end()
    latencies: list[float] = []
    stop = asyncio.Event()

    async def read() -> None:
        while not stop.is_set():
            now = time.time() * 1000
            for records in (await consumer.getmany(timeout_ms=100)).values():
                for r in records:
                    sent = int(r.value.split(b'"sent":', 1)[1].split(b",", 1)[0])
                    end = r.timestamp if read_topic == ALERTS else now
                    latencies.append(end - sent)

    reader = asyncio.create_task(read())
    try:
        t0, sent = time.monotonic(), 0
        while (now := time.monotonic()) < t0 + seconds:
            while sent < int(rate * (now - t0)):
                stamp = int(time.time() * 1000)
                body = b'{"sent":%d,' % stamp + BODY[1:]
                await producer.send(SENSORS, body, key=KEYS[sent % len(KEYS)], timestamp_ms=stamp)
                sent += 1
            await asyncio.sleep(TICK_S)
        await producer.flush()
        await asyncio.sleep(1.0)  # the last records' answers
    finally:
        await close_probe(stop, reader, producer, consumer)
    return latencies


def show(what: str, latencies: list[float], cpu_share: float, seconds: float, rate: float) -> None:
    p50, _p95, p99, top = percentiles(latencies)
    print(
        f"{what}: p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {top:.1f} ms over {len(latencies):,} records "
        f"({len(latencies) / seconds:,.0f}/s of {rate:,.0f} sent); the broker's CPU {cpu_share:.0f} %",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000, help="events produced, then consumed")
    ap.add_argument("--rate", type=float, default=5_000.0, help="paced events/s of the latency parts")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each paced part")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of each topic")
    args = ap.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as name, KafkaBroker(Path(name) / "kafka") as b:
        pid = b.pid or 0
        print(f"Apache Kafka {kafka_version()} on {b.bootstrap}, ready in {b.ready_s or 0:.1f} s")
        asyncio.run(log_append_time_alerts(b.bootstrap, args.partitions))
        asyncio.run(ensure_topics(b.bootstrap, args.partitions))
        asyncio.run(wait_for_leaders(b.bootstrap, [SENSORS, ALERTS]))
        (Path(name) / "echo.py").write_text(ECHO_WORKER)
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": b.bootstrap}
        with worker_process([sys.executable, str(Path(name) / "echo.py")], env, Path(name) / "echo.log"):
            time.sleep(3.0)  # the echo joins its group
            cpu = cpu_seconds(pid)
            lat = asyncio.run(paced(b.bootstrap, args.rate, args.seconds, ALERTS, AIOKAFKA_FETCH_WAIT_MS))
            share = 100 * (cpu_seconds(pid) - cpu) / (args.seconds + 1)
        show("echo, CreateTime -> the echo's append time on alerts", lat, share, args.seconds, args.rate)
        rate = asyncio.run(produce_rate(b.bootstrap, args.events))
        print(f"produce, acks=all, idempotent, linger 5 ms: {rate:,.0f} events/s ({args.events:,} events)")
        rate = asyncio.run(consume_rate(b.bootstrap, args.events))
        print(f"consume, a bare consumer from the start: {rate:,.0f} records/s")
        for wait in (AIOKAFKA_FETCH_WAIT_MS, FAUST_FETCH_WAIT_MS):
            cpu = cpu_seconds(pid)
            lat = asyncio.run(paced(b.bootstrap, args.rate, args.seconds, SENSORS, wait))
            share = 100 * (cpu_seconds(pid) - cpu) / (args.seconds + 1)
            show(
                f"one hop, CreateTime -> consumer, fetch wait {wait} ms", lat, share, args.seconds, args.rate
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
