"""At-least-once against exactly-once: the rule worker's throughput, CPU and alert latency under
each ``APP_PROCESSING_GUARANTEE``, in the same run, alternating (docs/exactly-once.md).

Run: ``.venv/bin/python bench/bench_eos.py [--events N] [--rounds R] [--partitions P]
[--latency-rate E] [--latency-seconds S] [--skip-latency] [--skip-throughput]``. Takes about
``R x 2 x 30 s`` for throughput plus ``2 x (S + 25) s`` for latency (defaults: 3 rounds of
200,000 events, 4 partitions, 2,000 events/s for 15 s).

* throughput: the worker (``python -m agents worker``, one process, the shipped rule packs) on a
  fresh embedded broker whose sensors topic holds N events (the real NAB machine-temperature
  series, repeated with its time shifted forward). Events/s from its
  ``worker_events_total{source="sensors"}`` counter, between its first non-zero reading and N
  (start-up and group join excluded); then the time until the group's *committed* offsets cover
  the topic (with exactly-once, outputs are visible only then); the worker's CPU time per
  1,000 events over the same span as the rate. Rounds alternate the two guarantees. With the
  2 CPUs shared, CPU per event is the steadier figure.
* latency: the worker fed E events/s (the same series, device ``m1``) plus one probe event every
  10 ms on its own device, which a probe rule turns into one alert transition each (firing on
  odd, resolved on even sequence numbers). Per probe: from this process's send of the event to
  its receipt of the alert by a ``read_committed`` consumer, as the dispatcher reads them.

The host's 2 CPUs are shared by the broker, the worker and this process: figures vary from run
to run; compare the two guarantees within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads

import orjson  # noqa: E402
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402
from latency_runs import probe_rules  # noqa: E402
from worker_runs import close_probe, committed_offsets, cpu_seconds, fill_many, metric, worker_process  # noqa: E402

from app.events import format_ts, parse_ts  # noqa: E402
from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.broker import KafkaBroker, free_port  # noqa: E402
from app.kafka.clients import end_offsets  # noqa: E402
from app.placement import partition_for  # noqa: E402
from app.topics import ALERTS, SENSORS  # noqa: E402
from ingest.adapters.nab import nab_events  # noqa: E402

NAB = ROOT.parent / "shared/datasets/nab/data/realKnownCause/machine_temperature_system_failure.csv"
WORKER = [sys.executable, "-m", "agents", "worker", "-l", "warn"]
GUARANTEES = ("at_least_once", "exactly_once")
GROUP = "streamalert-rules"
PROBE_RULE = "eos-latency-probe"
PROBE_RULES = probe_rules(PROBE_RULE)
PROBE_EVERY_S = 0.01
TICK_S = 0.005


def series(n: int) -> list[tuple[bytes, bytes, int]]:
    """``n`` readings of the real NAB series as device ``m1``'s events ``(key, value, ts_ms)``,
    the series repeated with its event time shifted past the previous pass."""
    rows = [r for r in nab_events(str(NAB), device="m1", field="temperature") if isinstance(r, dict)]
    first, prev, last = (parse_ts(rows[i]["ts"]) for i in (0, -2, -1))
    period = last - first + max(last - prev, 1)
    out: list[tuple[bytes, bytes, int]] = []
    cycle = 0
    while len(out) < n:
        for row in rows[: n - len(out)]:
            ts = parse_ts(row["ts"]) + cycle * period
            out.append((b"m1", orjson.dumps({**row, "ts": format_ts(ts)}), ts))
        cycle += 1
    return out


def rule_dir(tmp: Path, probe: bool) -> Path:
    rules = tmp / ("rules-probe" if probe else "rules")
    if not rules.exists():
        rules.mkdir()
        for pack in (ROOT / "rules").glob("*.yaml"):
            shutil.copy(pack, rules / pack.name)
        if probe:
            (rules / "probe.yaml").write_text(PROBE_RULES)
    return rules


def worker_env(bootstrap: str, data: Path, rules: Path, partitions: int, guarantee: str) -> dict[str, str]:
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "APP_PROCESSING_GUARANTEE": guarantee,
        "APP_KAFKA_IDEMPOTENCE": "on",  # both: exactly-once needs it, and it is the default
        "APP_DATA_DIR": str(data),
        "APP_RULES_DIR": str(rules),
        "APP_PARTITIONS": str(partitions),
        "APP_LOG_LEVEL": "WARNING",
        "APP_METRICS_PORT": str(free_port()),
    }


def worker(env: dict[str, str], log: Path) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """The rule worker for the ``with`` block; terminated after it, killed at 15 s."""
    return worker_process(WORKER, env, log)


def scrape(port: str, prefix: str) -> float:
    """The sum of a worker's Prometheus samples whose ``name{labels}`` starts with ``prefix``."""
    return metric(port, prefix)()


def events_counter(port: str) -> float:
    return scrape(port, 'worker_events_total{source="sensors"}')


def commits(port: str) -> str:
    """The worker's exactly-once commits so far: how many, and their mean time."""
    n = scrape(port, "worker_transaction_commit_seconds_count")
    total = scrape(port, "worker_transaction_commit_seconds_sum")
    return f"{n:,.0f} commits, {1000 * total / n:.1f} ms each on average" if n else "no transaction commits"


async def committed_total(bootstrap: str, topic: str) -> int:
    return sum(n for tp, n in (await committed_offsets(bootstrap, GROUP)).items() if tp.topic == topic)


def throughput(
    tmp: Path, guarantee: str, items: list[tuple[bytes, bytes, int]], partitions: int, n: int
) -> str:
    """One run (see the module docstring); its figures as a line."""
    with KafkaBroker(tmp / f"kafka-{guarantee}-{n}") as b:
        asyncio.run(ensure_topics(b.bootstrap, partitions))
        asyncio.run(fill_many(b.bootstrap, [(SENSORS, k, v) for k, v, _ in items]))
        env = worker_env(
            b.bootstrap, tmp / f"data-{guarantee}-{n}", rule_dir(tmp, False), partitions, guarantee
        )
        port = env["APP_METRICS_PORT"]
        with worker(env, tmp / f"worker-{guarantee}-{n}.log") as proc:
            began = time.monotonic()
            deadline = began + 120
            first: tuple[float, float] | None = None
            rate = cpu = math.nan
            cpu_first = 0.0
            while time.monotonic() < deadline and proc.poll() is None:
                count, now = events_counter(port), time.monotonic()
                if count and first is None:
                    first, cpu_first = (now, count), cpu_seconds(proc.pid)
                if first is not None and count >= len(items):
                    rate = (count - first[1]) / max(now - first[0], 1e-3)
                    cpu = (cpu_seconds(proc.pid) - cpu_first) / max(count - first[1], 1)
                    break
                time.sleep(0.1)
            evaluated = time.monotonic()
            while time.monotonic() < deadline and proc.poll() is None:
                if asyncio.run(committed_total(b.bootstrap, SENSORS)) >= len(items):
                    break
                time.sleep(0.05)
            committed = time.monotonic()
            committing = commits(port)
            if proc.poll() is not None:
                return f"{guarantee}: the worker exited ({proc.returncode}); see {tmp}"
    if first is None or math.isnan(rate):
        return f"{guarantee}: INCOMPLETE (no full pass within 120 s)"
    whole = len(items) / (committed - first[0])
    return (
        f"{guarantee:>13}: {rate:9,.0f} events/s evaluated; every offset committed "
        f"{committed - evaluated:4.2f} s after the last evaluation ({whole:8,.0f} "
        f"events/s committed); worker CPU {cpu * 1e6:5.1f} ms per 1,000 events evaluated; "
        f"first progress {first[0] - began:.1f} s after start; {committing}"
    )


async def paced_latency(bootstrap: str, background: list[tuple[bytes, bytes, int]], rate: float,
                        seconds: float, partitions: int, alive: object) -> list[float]:  # fmt: skip
    """Send ``rate`` events/s of ``background`` plus a probe every 10 ms for ``seconds`` after
    the first probe alert; return each measured probe's latency in ms (inf: no alert)."""
    avoid = partition_for(b"m1", partitions)  # the probes do not move the series' partition clock
    device = next(
        f"probe-{i}" for i in range(1000) if partition_for(f"probe-{i}".encode(), partitions) != avoid
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, acks=1)
    consumer = AIOKafkaConsumer(
        ALERTS, bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=20,
        isolation_level="read_committed",
    )  # fmt: skip
    sent: dict[int, float] = {}
    got: dict[int, float] = {}
    stop = asyncio.Event()
    seq = 0
    clock_ms = background[0][2]

    async def read() -> None:
        while not stop.is_set():
            for records in (await consumer.getmany(timeout_ms=100)).values():
                now = time.monotonic()
                for r in records:
                    alert = orjson.loads(r.value)
                    if alert["rule_id"] == PROBE_RULE:
                        got.setdefault(abs(int(alert["values"]["value"])), now)

    async def probe(measured: bool) -> None:
        nonlocal seq
        seq += 1
        body = {"device_id": device, "ts": format_ts(clock_ms), "value": float(seq if seq % 2 else -seq)}
        if measured:
            sent[seq] = time.monotonic()
        await producer.send(SENSORS, orjson.dumps(body), key=device.encode())

    await producer.start()
    await consumer.start()
    reader = asyncio.create_task(read())
    try:
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline and alive():  # type: ignore[operator]
            await probe(False)
            await asyncio.sleep(0.25)
        if not got:
            return []
        t0 = time.monotonic()
        sent_bg, next_probe = 0, t0
        bg = iter(background)
        while (now := time.monotonic()) < t0 + seconds:
            while sent_bg < int(rate * (now - t0)):
                key, value, ts = next(bg)
                clock_ms = max(clock_ms, ts)
                await producer.send(SENSORS, value, key=key)
                sent_bg += 1
            if now >= next_probe:
                await probe(True)
                next_probe += PROBE_EVERY_S
            await asyncio.sleep(TICK_S)
        await producer.flush()
        drain = time.monotonic() + 10
        while time.monotonic() < drain and not set(sent) <= set(got):
            await asyncio.sleep(0.05)
    finally:
        await close_probe(stop, reader, producer, consumer)
    return [(got[s] - sent[s]) * 1000 if s in got else math.inf for s in sorted(sent)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def latency(tmp: Path, guarantee: str, rate: float, seconds: float, partitions: int) -> str:
    background = series(int(rate * (seconds + 5)) + 1000)
    with KafkaBroker(tmp / f"kafka-latency-{guarantee}") as b:
        asyncio.run(ensure_topics(b.bootstrap, partitions))
        env = worker_env(
            b.bootstrap, tmp / f"data-latency-{guarantee}", rule_dir(tmp, True), partitions, guarantee
        )
        with worker(env, tmp / f"worker-latency-{guarantee}.log") as proc:
            ms = asyncio.run(paced_latency(b.bootstrap, background, rate, seconds, partitions,
                                           lambda: proc.poll() is None))  # fmt: skip
            committing = commits(env["APP_METRICS_PORT"])
        alerts = asyncio.run(end_offsets(b.bootstrap, [ALERTS]))[ALERTS]
    if not ms:
        return f"{guarantee}: no probe alert within 60 s"
    missing = sum(1 for v in ms if math.isinf(v))
    p50, p95, p99, top = (percentile(ms, q) for q in (0.5, 0.95, 0.99, 1.0))
    return (
        f"{guarantee:>13}: {len(ms):,} probes at {rate:,.0f} events/s: send -> read_committed receipt "
        f"p50 {p50:.0f} ms, p95 {p95:.0f} ms, p99 {p99:.0f} ms, max {top:.0f} ms; {missing} without alert "
        f"(the alerts topic's end offset: {alerts:,}); {committing}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000, help="sensor events per throughput run")
    ap.add_argument("--rounds", type=int, default=3, help="throughput rounds (each runs both guarantees)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions per topic")
    ap.add_argument("--latency-rate", type=float, default=2_000.0, help="paced background events/s")
    ap.add_argument("--latency-seconds", type=float, default=15.0, help="measured span")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    if not NAB.exists():
        print(f"the NAB series is missing: {NAB}")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-eos-"))
    try:
        if not args.skip_throughput:
            items = series(args.events)
            print(
                f"throughput: {len(items):,} NAB sensor events, {args.partitions} partitions, "
                "the shipped rule packs"
            )
            rates: dict[str, list[str]] = {g: [] for g in GUARANTEES}
            for r in range(args.rounds):
                order = GUARANTEES if r % 2 == 0 else GUARANTEES[::-1]
                for g in order:
                    line = throughput(tmp, g, items, args.partitions, r)
                    rates[g].append(line)
                    print(f"  round {r + 1}: {line}", flush=True)
            for g, lines in rates.items():
                figures = [float(x.split(":", 1)[1].split("events/s")[0].replace(",", "")) for x in lines
                           if "events/s evaluated" in x]  # fmt: skip
                cpus = [float(x.split("worker CPU")[1].split("ms")[0]) for x in lines if "worker CPU" in x]
                if cpus:
                    print(f"{g}: median worker CPU {statistics.median(cpus):.1f} ms per 1,000 events")
                if figures:
                    print(
                        f"{g}: median {statistics.median(figures):,.0f} events/s evaluated "
                        f"over {len(figures)} runs"
                    )
        if not args.skip_latency:
            for g in GUARANTEES:
                print(
                    f"latency: {latency(tmp, g, args.latency_rate, args.latency_seconds, args.partitions)}",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
