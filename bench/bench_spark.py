"""Spark engine throughput (events/s) and micro-batch latency on local[2], against a target.

Usage: ``python bench/bench_spark.py [--pack windowed|threshold] [--events N] [--devices D]
[--batch B] [--small S] [--evaluator-only]``
(``make bench`` runs it with the defaults). An embedded Apache Kafka broker is
started here; N synthetic sensor events (D devices, random-walk temperatures, 1 s
apart per device, seeded) go to ``events.sensors`` first, then the real job
(``jobs.engine``: Spark's Kafka connector, decoding in the JVM for the records the
worker's decoder keeps unchanged, native conditions, ``applyInPandasWithState``
state, idempotent Kafka sink) runs
a rule pack with ``Trigger.AvailableNow``: ``windowed`` (default: tumbling,
hopping, sliding and session windows plus one threshold rule, i.e. mostly the
stream path, the evaluator's own window logic per topic partition) or
``threshold`` (three threshold rules, the keyed path):

- throughput: ``B`` events per micro-batch; events/s = events of the
  measured batches / the sum of their trigger times (the first batch, which
  starts Python workers, is reported apart), on a warm JVM: the same query runs
  once before it (its own checkpoint, every event), and its rate, the JVM's
  compiler warming up over its first ~10 batches, is printed too;
- latency: a second query with ``S`` events per micro-batch (default 10,000, the
  target's batch: p50 of 1 s or less); p50/p95 of the
  trigger times (read, decode, evaluate, produce alerts, commit);
- the state groups: the latency run's stateful group runs, by where each found its state:
  live in the Python worker that got the task, at the worker that holds it live (a peer,
  ``jobs.peers``), restored from the state store, or new;
- Spark's floor: the same topic read with no rule, in ``B``-event batches, to Spark's
  ``noop`` sink: Kafka's records alone, then decoded as the job decodes them, then also
  through the job's stateful step (the pack's task rows, grouped as the job groups them,
  through ``applyInPandasWithState``) with a function that does nothing. No rule pack can
  run faster than that last rate; the bench prints the pack's share of it;
- the evaluator alone (the windowed pack; the threshold pack takes the keyed path): its
  rules over (up to 100,000 of) the same events in this process, without Spark, CPU µs
  per event (what the stream path runs per stream partition), and the rate two stream
  partitions on two cores could not pass even if Spark cost nothing;
- the ceiling: the stateful floor's rate and the evaluator's, one after the other (a
  micro-batch's stages run in turn), what the pack could reach if the stream runner cost
  nothing but the evaluator.

Figures are for this host (shared, 2 cores), one driver with local executors,
not a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads

import orjson  # noqa: E402
from aiokafka import AIOKafkaProducer  # noqa: E402

from app.events import format_ts  # noqa: E402
from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.broker import KafkaBroker  # noqa: E402
from app.rules.loader import load_rules  # noqa: E402
from app.runtime.settings import Settings  # noqa: E402
from app.topics import SENSORS  # noqa: E402

TARGET = 100_000
LATENCY_TARGET_S = 1.0  # micro-batch p50 at 10,000 events per batch
START_MS = 1_700_000_000_000
WINDOWED = """\
engine: spark
rules:
  - id: minute-avg
    source: sensors
    group_by: [device_id]
    window: {type: tumbling, size: 1m}
    allowed_lateness: 10s
    aggregate: {avg_t: avg(temperature), n: count(*)}
    having: avg_t > 105
  - id: hot-share
    source: sensors
    where: temperature > 90
    group_by: [device_id]
    window: {type: hopping, size: 2m, advance: 1m}
    aggregate: {n: count(*), hi: max(temperature)}
    having: n >= 60
  - id: spike
    source: sensors
    group_by: [device_id]
    window: {type: sliding, size: 30s}
    aggregate: {lo: min(temperature), hi: max(temperature)}
    having: hi - lo > 12
  - id: busy-session
    source: sensors
    where: temperature > 100
    group_by: [device_id]
    window: {type: session, gap: 5s}
    aggregate: {n: count(*)}
    having: n >= 30
  - {id: overheat, source: sensors, where: temperature > 100, for: 10m, group_by: [device_id]}
"""
THRESHOLD = """\
engine: spark
rules:
  - {id: overheat, source: sensors, where: temperature > 100, for: 10m, group_by: [device_id]}
  - {id: cold-streak, source: sensors, where: temperature < 10, consecutive: 3, group_by: [device_id]}
  - id: low-battery
    source: sensors
    where: "battery < 15 and status <> 'charging'"
    for: 5m
    group_by: [device_id]
"""


def events(n: int, devices: int, seed: int = 7) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    temp = [rng.uniform(20, 110) for _ in range(devices)]
    out = []
    for i in range(n):
        d = i % devices
        temp[d] = min(130.0, max(-10.0, temp[d] + rng.gauss(0, 3)))
        dev = f"dev-{d:05d}"
        tick = i // devices
        body = {"device_id": dev, "ts": format_ts(START_MS + tick * 1000), "temperature": round(temp[d], 2),
                "battery": round(100 - tick * 0.01 % 100, 2), "status": "ok"}  # fmt: skip
        out.append((dev.encode(), orjson.dumps(body)))
    return out


async def produce(bootstrap: str, items: list[tuple[bytes, bytes]]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=512 * 1024)
    await p.start()
    try:
        for i in range(0, len(items), 10_000):
            futs = [await p.send(SENSORS, value=v, key=k) for k, v in items[i : i + 10_000]]
            await asyncio.gather(*futs)
    finally:
        await p.stop()


def run_query(spark: Any, settings: Settings, per_batch: int, name: str) -> list[dict[str, Any]]:
    from jobs.compile import plan_rules
    from jobs.engine import EngineOptions, start

    rules = settings.data_dir / "rules.yaml"
    plan = plan_rules(load_rules([rules]))
    query, sink = start(
        spark, plan, settings, EngineOptions(once=True, max_offsets_per_trigger=per_batch, query=name)
    )
    try:
        return finished(query, name)
    finally:
        sink.close()


def finished(query: Any, name: str) -> list[dict[str, Any]]:
    """The progress of each micro-batch that read events, once ``query`` (``availableNow``)
    has read everything; at most 900 s."""
    if not query.awaitTermination(900):
        query.stop()
        msg = f"bench: query {name} did not finish within 900 s"
        raise SystemExit(msg)
    return [p for p in query.recentProgress if p["numInputRows"]]


def nothing(_group: Any, frames: Any, _state: Any) -> Any:
    """A stateful function that takes its group's rows as the job's does, and does nothing."""
    import pandas as pd

    from jobs.state import OUTPUT_COLUMNS

    for _ in frames:
        pass
    yield pd.DataFrame.from_records([], columns=OUTPUT_COLUMNS)


#: how far :func:`run_floor` goes: Kafka's records, decoded, through the stateful step
FLOORS = ("read", "decode", "stateful")


def run_floor(spark: Any, settings: Settings, per_batch: int, name: str, step: str) -> list[dict[str, Any]]:
    """The same source with no rule, to Spark's ``noop`` sink, in batches of ``per_batch``
    events, up to ``step`` of :data:`FLOORS`: Kafka's records alone; decoded; or decoded, made
    the pack's task rows and grouped by state group through ``applyInPandasWithState``, as the
    job does (``jobs.state.apply_lifecycle``), into :func:`nothing`. What Spark costs here
    before any rule."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from jobs.compile import plan_rules, tasks
    from jobs.engine import EngineOptions, decoded, records
    from jobs.state import OUTPUT_SCHEMA, STATE_BUCKETS, STATE_CODEC, STATE_SCHEMAS, bucket

    plan = plan_rules(load_rules([settings.data_dir / "rules.yaml"]))
    opts = EngineOptions(once=True, max_offsets_per_trigger=per_batch, query=name)
    df = records(spark, plan, settings, opts)
    if step != "read":
        df = decoded(df, plan, settings)
    if step == "stateful":
        group = bucket(F.col("__key"), STATE_BUCKETS)
        rows = tasks(df, plan, settings.partitions).withColumn("__bucket", group)
        state = STATE_SCHEMAS[STATE_CODEC]
        df = rows.groupBy("__bucket").applyInPandasWithState(
            nothing, OUTPUT_SCHEMA, state, "append", GroupStateTimeout.NoTimeout
        )
    query = (
        df.writeStream.queryName(name)
        .format("noop")
        .option("checkpointLocation", str(settings.data_dir / "spark" / name))
        .trigger(availableNow=True)
        .start()
    )
    return finished(query, name)


def evaluator_alone(pack: str, items: list[tuple[bytes, bytes]], partitions: int = 2) -> float:
    """CPU µs per event of ``pack`` in the evaluator alone: the code the stream path runs per
    stream partition, here in one process without Spark (``app.backtest.backtest`` over the
    decoded events on ``partitions`` partitions, the collector tuned as in Spark's workers),
    best of three passes."""
    import io

    from app.backtest import BacktestReport, backtest
    from app.events import SCHEMAS
    from app.runtime.heap import tune_collector

    tune_collector()
    with tempfile.TemporaryDirectory(prefix="bench-spark-eval-") as tmp:
        (Path(tmp) / "rules.yaml").write_text(pack)
        ruleset = load_rules([Path(tmp) / "rules.yaml"])
    decoded = [("sensors", SCHEMAS["sensors"].decode(v)) for _k, v in items]
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        report = BacktestReport()
        backtest(ruleset, iter(decoded), io.StringIO(), report, engine="spark", partitions=partitions)
        best = min(best, time.process_time() - t0)
    return best / len(decoded) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", choices=["windowed", "threshold"], default="windowed", help="rule pack")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--devices", type=int, default=1_000)
    ap.add_argument("--batch", type=int, default=50_000, help="events per micro-batch, throughput run")
    ap.add_argument("--small", type=int, default=10_000, help="events per micro-batch, latency run")
    ap.add_argument(
        "--evaluator-only", action="store_true",
        help="only the windowed pack's evaluator alone (no broker, no Spark: seconds; run it in two "
        "checkouts to compare them)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.evaluator_only:
        us = evaluator_alone(WINDOWED, events(min(args.events, 100_000), args.devices))
        print(f"the evaluator ({native.status()}): {us:.2f} µs of CPU per event, the windowed pack alone")
        return 0

    from jobs.session import build_session
    from jobs.sink import state_groups

    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        with KafkaBroker(scratch / "kafka") as broker:
            asyncio.run(ensure_topics(broker.bootstrap, partitions=2))
            t0 = time.monotonic()
            items = events(args.events, args.devices)
            asyncio.run(produce(broker.bootstrap, items))
            produced_s = time.monotonic() - t0
            env = {"KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "APP_DATA_DIR": str(scratch)}
            settings = Settings.from_env(env)
            (scratch / "rules.yaml").write_text(WINDOWED if args.pack == "windowed" else THRESHOLD)
            spark = build_session("local[2]", app_name="bench-spark", shuffle_partitions=2)
            try:
                # the JVM's compiler warms up over the first ~10 micro-batches (~1.5 CPU-s each):
                # a query of its own takes that, and the throughput run measures a warm JVM, as a
                # query that runs for days is
                cold = run_query(spark, settings, args.batch, "bench-warm-up")
                big = run_query(spark, settings, args.batch, "bench-throughput")
                before = state_groups()
                small = run_query(spark, settings, args.small, "bench-latency")[:30]
                groups = {k: int(n - before[k]) for k, n in state_groups().items()}
                read, dec, stateful = (
                    run_floor(spark, settings, args.batch, f"bench-{step}", step) for step in FLOORS
                )
            finally:
                spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # the stream path's own cost (the threshold pack takes the keyed path, not measured so)
    eval_us = evaluator_alone(WINDOWED, items[:100_000]) if args.pack == "windowed" else None

    def secs(p: dict[str, Any]) -> float:
        return float(p["durationMs"]["triggerExecution"]) / 1000

    def rate_of(progress: list[dict[str, Any]]) -> float:
        warm = progress[1:] or progress
        return sum(p["numInputRows"] for p in warm) / sum(secs(p) for p in warm)

    warm = big[1:] or big
    rate, read_rate = rate_of(big), rate_of(read)
    decode_rate, stateful_rate = rate_of(dec), rate_of(stateful)
    cold_rate = sum(p["numInputRows"] for p in cold) / sum(secs(p) for p in cold)
    lat = sorted(secs(p) for p in small[1:] or small)
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
    pack = "4 windowed + 1 threshold rules" if args.pack == "windowed" else "3 threshold rules"
    print(f"spark engine on local[2] ({os.cpu_count()} CPUs), {pack}, {args.events:,} events from "
          f"{args.devices:,} devices (produced in {produced_s:.1f} s)")  # fmt: skip
    print(f"  evaluator       {native.status()}")
    print(f"  throughput      {rate:>10,.0f} events/s   target {TARGET:,} events/s ({rate / TARGET:.0%})"
          f"  [{len(warm)} batches of <= {args.batch:,}; first batch {big[0]['numInputRows']:,} events"
          f" in {secs(big[0]):.1f} s; a warm JVM]")  # fmt: skip
    print(f"                  {cold_rate:>10,.0f} events/s   the same query before it, on a cold JVM"
          f" (every batch, the first included: the compiler's warm-up)")  # fmt: skip
    big_p50, small_p50 = statistics.median(secs(p) for p in warm), statistics.median(lat)
    print(f"  micro-batch     p50 {small_p50:.2f} s, p95 {p95:.2f} s at <= {args.small:,} events/batch"
          f" (target p50 <= {LATENCY_TARGET_S:.0f} s at 10,000)")  # fmt: skip
    print(f"                  p50 {big_p50:.2f} s at <= {args.batch:,} events/batch")
    share = rate / stateful_rate
    print(f"  spark's floor   {read_rate:>10,.0f} events/s  Kafka read alone; {decode_rate:,.0f} events/s"
          f" read and decoded; {stateful_rate:,.0f} events/s decoded and through the stateful step to a"
          f" function that does nothing (no rule, noop sink, same batches): the pack runs at {share:.0%}"
          " of that last rate")  # fmt: skip
    # a micro-batch's stages run one after the other: the read and decode on both cores, then
    # the stream partitions' evaluators on both cores, each behind Spark's stateful step
    both = None if eval_us is None else 1 / (1 / stateful_rate + eval_us / 2e6)
    if eval_us is not None and both is not None:
        ceiling = 2 / eval_us * 1e6
        print(f"  the evaluator   {eval_us:.1f} µs of CPU per event alone (the pack's rules without Spark,"
              f" best of 3 over {min(len(items), 100_000):,} events): two stream partitions on two"
              f" cores could not pass {ceiling:,.0f} events/s with no Spark work at all")  # fmt: skip
        print(
            f"  the ceiling     {both:>10,.0f} events/s  the stateful floor's rate and the evaluator's"
            f" alone, one after the other as a micro-batch runs them; the pack: {rate / both:.0%}"
        )
    found = ", ".join(f"{k} {n}" for k, n in groups.items())
    print(f"  state groups    the latency run's stateful group runs, by where their state came from:"
          f" {found} (spark_state_groups_total, docs/spark.md)")  # fmt: skip
    measured = small[1:] or small
    parts = {k for p in measured for k in p["durationMs"] if k != "triggerExecution"}
    medians = {k: statistics.median(float(p["durationMs"].get(k, 0)) for p in measured) for k in parts}
    biggest = sorted(medians.items(), key=lambda kv: -kv[1])
    said = ", ".join(f"{k} {v / 1000:.2f}" for k, v in biggest if v >= 5)
    print(f"  where a {args.small:,}-event batch goes (median s of each part): {said}")
    summary = {
        "pack": args.pack,
        "events_per_s": round(rate),
        "cold_events_per_s": round(cold_rate),
        "target": TARGET,
        "batch_p50_s": round(statistics.median(lat), 3),
        "batch_p95_s": round(p95, 3),
        "batch_events": args.small,
        "read_events_per_s": round(read_rate),
        "decode_events_per_s": round(decode_rate),
        "stateful_floor_events_per_s": round(stateful_rate),
        "evaluator_us_per_event": None if eval_us is None else round(eval_us, 2),
        "ceiling_events_per_s": None if both is None else round(both),
        "events": args.events,
        "devices": args.devices,
        "state_groups": groups,
    }
    print(orjson.dumps(summary).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
