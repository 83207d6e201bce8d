"""The embedded broker under a steady load: does a fetch get dearer as the log grows?

Run: ``make bench`` or ``.venv/bin/python bench/bench_broker.py [--rate R] [--seconds S]
[--partitions P] [--only NAME,...]``. About 2 minutes with the defaults.

Each variant starts a fresh embedded Tansu broker, creates one topic of P partitions
and produces R small JSON events a second to it for S seconds (keys spread over the
partitions). A consumer with no group reads them as they come, as a caught-up rule
worker does, with the worker's fetch wait. Every 5 s it prints the broker's CPU share
over those 5 s, read from ``/proc``, and the latency from each record's CreateTime to
its receipt here:

* ``linger-2``: the producer lingers 2 ms (the latency bench's event producer);
* ``linger-20``: the same traffic in ten times fewer, larger record batches;
* ``produce-only``: linger 2 ms and no consumer: what storing costs by itself;
* ``fetch-wait-500``: linger 2 ms, the consumer waiting up to 500 ms a fetch
  (aiokafka's default) instead of the worker's 5 ms: fewer, slower fetches.

With Apache Kafka, a fetch finds its offset through the segment's index, whatever
the log's length, so every line of a variant would read alike. The figures this
prints for Tansu 0.6.0's memory storage are in the README, under "The walls".
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402
from worker_runs import percentiles  # noqa: E402

from agents.transport import FETCH_MAX_WAIT_MS  # noqa: E402
from app.broker import KafkaBroker, cpu_seconds  # noqa: E402

TOPIC = "bench.broker"
REPORT_EVERY_S = 5.0
#: how often the paced producer wakes up to send what is due
TICK_S = 0.002


@dataclass(frozen=True)
class Variant:
    name: str
    linger_ms: int
    fetch_wait_ms: int | None  # None: no consumer


VARIANTS = (
    Variant("linger-2", 2, FETCH_MAX_WAIT_MS),
    Variant("linger-20", 20, FETCH_MAX_WAIT_MS),
    Variant("produce-only", 2, None),
    Variant("fetch-wait-500", 2, 500),
)


async def run(bootstrap: str, pid: int, v: Variant, rate: float, seconds: float, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=v.linger_ms, acks=1)
    await producer.start()
    consumer = None
    latencies: list[float] = []
    if v.fetch_wait_ms is not None:
        consumer = AIOKafkaConsumer(
            TOPIC, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
            fetch_max_wait_ms=v.fetch_wait_ms,
        )  # fmt: skip
        await consumer.start()

    async def consume() -> None:
        assert consumer is not None
        while True:
            got = await consumer.getmany(timeout_ms=100)
            now_ms = time.time() * 1000
            for records in got.values():
                latencies.extend(now_ms - r.timestamp for r in records)

    reader = asyncio.create_task(consume()) if consumer is not None else None
    event = {"device_id": "d", "ts": "2026-01-01T00:00:00Z", "temperature": 21.5, "pad": "x" * 80}
    body = orjson.dumps(event)
    keys = [str(i).encode() for i in range(100)]
    try:
        t0 = time.monotonic()
        mark, cpu_mark, sent = t0, cpu_seconds(pid) or 0.0, 0
        while (now := time.monotonic()) < t0 + seconds:
            due = int(rate * (now - t0))
            while sent < due:
                await producer.send(TOPIC, body, key=keys[sent % len(keys)])
                sent += 1
            if now - mark >= REPORT_EVERY_S:
                cpu = cpu_seconds(pid) or 0.0
                share = 100 * (cpu - cpu_mark) / (now - mark)
                line = f"  t={now - t0:4.0f} s: {sent:>9,} events stored, broker CPU {share:3.0f} %"
                if consumer is not None:
                    p50, p99 = percentiles(latencies, (0.5, 0.99))
                    line += f", consume latency p50 {p50:5.0f} ms, p99 {p99:6.0f} ms"
                    latencies.clear()
                print(line, flush=True)
                mark, cpu_mark = now, cpu
            await asyncio.sleep(TICK_S)
    finally:
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        await producer.stop()
        if consumer is not None:
            await consumer.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=5_000.0, help="events/s produced")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each variant")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of the topic")
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    args = ap.parse_args()
    chosen = [v for v in VARIANTS if not args.only or v.name in args.only.split(",")]
    for v in chosen:
        reads = f"a consumer with fetch wait {v.fetch_wait_ms} ms" if v.fetch_wait_ms else "no consumer"
        print(
            f"embedded broker, {v.name}: {args.rate:,.0f} events/s for {args.seconds:.0f} s into "
            f"{args.partitions} partitions, producer linger {v.linger_ms} ms, {reads}"
        )
        with KafkaBroker() as b:
            assert b.pid is not None
            asyncio.run(run(b.bootstrap, b.pid, v, args.rate, args.seconds, args.partitions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
