"""Rule evaluation benchmarks on Apache Kafka: the pure evaluator, the Faust rule worker beside a
minimal Faust agent and a Quix Streams peer, and event-to-alert latency beside its floor.

Run: ``make bench`` or ``.venv/bin/python bench/bench_rules.py [--events N] [--worker-events W]
[--skip-faust] [--skip-throughput] [--skip-quix] [--skip-latency] [--skip-echo] [--latency-rate R]
[--latency-seconds S] [--producer-linger-ms L] [--latency-partitions P] [--fleet-devices D]``.
Prints one line per figure, beside its target. Each run with a broker starts its own embedded
Apache Kafka (``app.kafka.broker.KafkaBroker`` over a temporary home), P partitions per topic. About 5
minutes on a quiet host: each worker, agent and peer run is bounded at 60 s (most take a few
seconds after their start-up), each latency run at start-up + 5 s warm-up + S s + 5 s drain:

* evaluator alone: events/s (CPU time, best of three) through the bench pack of 51 rules
  (the shipped packs plus threshold and window variants), on real NAB, Apache and OHLC
  events, in batches of 2,000 as the worker evaluates them and one event at a time as
  backtests do;
* the same, on a fleet: ``--fleet-devices`` simulated sensors (default 1,000) and one
  vehicle per 20 of them, each reading every minute, with their registry loaded;
* on the sensors topic, pre-filled with the NAB readings of ``--worker-events`` events
  (~122,000 of the default 200,000): a bare aiokafka consumer (the transport's ceiling);
  the issue's minimal Faust agent (decode, ``temperature > 100``, send on a match: the
  agent the issue measured at ~14,000 events/s when it set the targets); a no-op Faust
  agent (Faust's own per-message floor); the rule worker (``python -m agents worker``, one
  process: decode, the whole pack, produce), its rate read from ``worker_events_total``;
* the Quix Streams peer (``quix_peer.py``, see ``peer_runs.py``) on the same topic after the
  worker: three of the pack's rules by hand (``t-0``, a threshold; ``machine-hourly-heat``,
  a tumbling hour's average per device; ``not-found-scan``, a sliding minute's count per
  client IP), in its own environment. Its events/s beside the worker's, and the agreement of
  their firing transitions per rule: matched, only ours, only Quix's;
* the worker, then the peer, on all three source topics filled with the interleaved events
  (mixed; the peer reads sensors and logs), on a fresh broker: their rates and agreement
  (the sliding rule needs the logs), with the semantic differences printed; then the worker
  on the fleet's readings, its registry in the ``tables.devices`` topic;
* latency: the worker with the pack plus one probe rule, fed the mixed events paced at R
  events/s (default 5,000) every 2 ms by one producer lingering L ms (default 1, the
  worker's own producer's), into topics of P partitions (default 4); one event in five is a
  probe whose alert is matched back to it (``latency_runs.py``). p50/p95/p99/max of the
  alert's broker append time (``alerts`` is created with ``LogAppendTime``) minus the
  event's CreateTime, and of the wall clock from this process's send to its receipt of
  the alert; and the worker's own histograms over the measured window;
* latency floor: the same paced run against a bare aiokafka echo (no Faust, no rules) that
  consumes every event and produces each one to ``alerts``; then the worker's p99 beside
  the echo's, against the targets (p99 <= 20 ms, goal 10 ms; <= 2x the echo's p99).

The host's 2 CPUs are shared by the broker, the worker, this process and whatever else
runs: figures vary from run to run; compare figures within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.runtime import native  # noqa: E402

native.activate()  # before any evaluator module loads

import orjson  # noqa: E402
from aiokafka import AIOKafkaConsumer  # noqa: E402
from faust_agents import MINIMAL_AGENT, MINIMAL_BASELINE, NOOP_AGENT, plain_agent  # noqa: E402
from latency_runs import (  # noqa: E402
    ECHO_WORKER,
    PROBE_RULES,
    LatencyResult,
    log_append_time_alerts,
    measure_latency,
    report_against_floor,
    report_latency,
)
from peer_runs import SEMANTICS, keep_peer_topics, quix_python, report_agreement, run_peer  # noqa: E402
from worker_runs import (  # noqa: E402
    Item,
    Progress,
    bucket_quantile,
    create_topics,
    end_offset,
    fill_many,
    histogram,
    log_tail,
    metric,
    progress_rate,
    wait_for_leaders,
    worker_process,
)

from app.events import SCHEMAS, Event, format_ts, parse_ts  # noqa: E402
from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.broker import KafkaBroker, free_port, kafka_version  # noqa: E402
from app.rules.evaluator import Engine  # noqa: E402
from app.rules.loader import load_rules  # noqa: E402
from app.runtime import native  # noqa: E402
from app.tables import Tables  # noqa: E402
from app.topics import ALERTS, DEVICES_TABLE, SENSORS, SOURCE_TOPICS  # noqa: E402
from ingest.adapters.apache import apache_events  # noqa: E402
from ingest.adapters.nab import nab_events  # noqa: E402
from ingest.adapters.ohlc import ohlc_events  # noqa: E402
from ingest.sim.fleet import FleetConfig, fleet_events, fleet_registry  # noqa: E402

PARTITIONS = 4
WORKER = [sys.executable, "-m", "agents", "worker", "-l", "warn"]  # the rule worker, one process
LATENCY_WARMUP_S = 5.0
#: The evaluator's batch: the worker's default APP_WORKER_BATCH, split by stream and partition as there
EVAL_BATCH = 2000
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
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("iot.yaml", "logs.yaml", "finance.yaml"):
        (directory / name).write_text((ROOT / "rules" / name).read_text())
    body = "rules:" + "".join(
        VARIANTS.format(i=i, hi=80 + i, m=i % 4 * 5, w=1 + i % 3, s=400 + i * 10, b=1000 * i)
        for i in range(11)
    )
    (directory / "variants.yaml").write_text(body)
    return directory


def events(n: int) -> list[Item]:
    """``n`` events interleaving the NAB sensor series, the Apache log and AAPL's bars.

    The mix is repeated as needed; each repetition shifts a source's event
    times past its previous pass, so event time keeps moving forward (the
    rules would otherwise drop the repeated events as stale or late).
    """
    parts = {
        "sensors": [r for r in nab_events(str(NAB), device="m1", field="temperature") if isinstance(r, dict)],
        "logs": [r for r in apache_events(str(APACHE), host="www") if isinstance(r, dict)],
        "finance": [r for r in ohlc_events("AAPL") if isinstance(r, dict)],
    }
    period = {}
    for source, rows in parts.items():
        first, prev, last = (parse_ts(rows[i]["ts"]) for i in (0, -2, -1))
        period[source] = last - first + max(last - prev, 1)
    base: list[tuple[str, dict[str, Any]]] = []
    for i in range(max(len(rows) for rows in parts.values())):
        base += [(source, rows[i]) for source, rows in parts.items() if i < len(rows)]
    out: list[Item] = []
    for cycle in range(n // len(base) + 1):
        for source, row in islice(base, n - len(out)):
            ts = parse_ts(row["ts"]) + cycle * period[source]
            record = {**row, "ts": format_ts(ts)} if cycle else row
            key = str(row[SCHEMAS[source].key]).encode()
            out.append(Item(source, key, orjson.dumps(record), ts))
    return out


def evaluator_rates(
    pack: Path, decoded: list[tuple[str, Event]], tables: Tables | None = None
) -> tuple[float, float]:
    """Events/s through the evaluator, CPU time, best of three passes each way: in batches of
    ``EVAL_BATCH`` (the worker's path) and one event at a time (backtests, the Spark engine)."""
    rs = load_rules([pack])

    def best(run: Callable[[Engine], object]) -> float:
        rates = []
        for _ in range(3):
            eng = Engine(rs, partitions=PARTITIONS, tables=tables)
            t = time.process_time()
            run(eng)
            rates.append(len(decoded) / (time.process_time() - t))
        return max(rates)

    one = best(lambda eng: [eng.process(s, e) for s, e in decoded])
    rate = best(
        lambda eng: [
            eng.process_batch(decoded[i : i + EVAL_BATCH]) for i in range(0, len(decoded), EVAL_BATCH)
        ]
    )
    return rate, one


def bench_evaluator(pack: Path, items: list[Item]) -> float:
    """The evaluator alone on the bench events (see :func:`evaluator_rates`)."""
    rs = load_rules([pack])
    decoded = [(i.source, SCHEMAS[i.source].decode(i.value)) for i in items]
    rate, one = evaluator_rates(pack, decoded)
    t = time.perf_counter()
    for i in items:
        SCHEMAS[i.source].decode(i.value)
    decode_rate = len(items) / (time.perf_counter() - t)
    print(f"rules loaded: {len(rs.rules)}")
    print(
        f"evaluator alone, {len(rs.rules)} rules, batches of {EVAL_BATCH}: {rate:,.0f} events/s "
        f"(target 100,000); one event at a time {one:,.0f}/s; decode alone {decode_rate:,.0f}/s"
    )
    return rate


def fleet(devices: int, n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A simulated fleet of ``devices`` sensors (and a vehicle per 20), a reading a minute
    each: its registry rows and its first ``n`` readings."""
    cfg = FleetConfig(
        seed=7, start_ms=1_700_000_000_000, sensors=devices, vehicles=devices // 20, interval_s=60.0
    )
    return fleet_registry(cfg), list(islice(fleet_events(cfg), n))


def bench_fleet(pack: Path, devices: int, n: int) -> None:
    """The evaluator alone on the fleet, its registry loaded: many groups, each seen once in a while."""
    registry, readings = fleet(devices, n)
    tables = Tables()
    tables.load_rows("devices", registry)
    sensors = SCHEMAS["sensors"]
    decoded = [("sensors", sensors.decode(orjson.dumps(r))) for r in readings]
    rate, one = evaluator_rates(pack, decoded, tables)
    print(
        f"evaluator alone, fleet of {devices:,} devices and {devices // 20:,} vehicles ({n:,} readings): "
        f"batches of {EVAL_BATCH}: {rate:,.0f} events/s; one event at a time {one:,.0f}/s"
    )


async def fill(bootstrap: str, topic: str, values: list[bytes], keys: list[bytes]) -> None:
    await fill_many(bootstrap, [(topic, k, v) for k, v in zip(keys, values, strict=True)])


async def bare_consumer_rate(bootstrap: str, topic: str, expect: int) -> float:
    """Records/s a bare aiokafka consumer (no group, no Faust, no decoding) reads from
    ``topic``'s start: what the broker and the Kafka client allow one process."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        # from the first fetch on (a connection and the topic's metadata are set up by then): timed
        # from the first batch's arrival instead, a topic read in one fetch gave billions a second
        got, started = 0, time.perf_counter()
        deadline = time.monotonic() + 30
        while got < expect and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
            got += sum(len(records) for records in batch.values())
        return got / (time.perf_counter() - started)
    finally:
        await consumer.stop()


def worker_env(bootstrap: str, data: Path, rules: Path, partitions: int = PARTITIONS) -> dict[str, str]:
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "APP_DATA_DIR": str(data),
        "APP_RULES_DIR": str(rules),
        "APP_PARTITIONS": str(partitions),
        "APP_LOG_LEVEL": "WARNING",
        "APP_METRICS_PORT": str(free_port()),
    }


def bench_throughput(tmp: Path, pack: Path, items: list[Item], fleet_devices: int, quix: Path | None) -> None:
    """The minimal and no-op agents, then the rule worker, then the Quix peer, on the same
    pre-filled sensors topic; then the rule worker and the peer on all three source topics
    (mixed), on a fresh broker; then the worker on the fleet's readings with its registry, on a
    fresh broker."""
    sensors = [i.value for i in items if i.source == "sensors"]
    with KafkaBroker(tmp / "kafka-sensors") as b:
        ready = f"ready in {b.ready_s:.1f} s" if b.ready_s is not None else ""
        print(f"Apache Kafka {kafka_version()} on {b.bootstrap}, {ready}; {PARTITIONS} partitions per topic")
        keep_peer_topics(b.bootstrap, PARTITIONS)
        asyncio.run(ensure_topics(b.bootstrap, PARTITIONS))
        # the minimal agent's output: the broker creates no topic on first use
        asyncio.run(create_topics(b.bootstrap, {"bench.minimal": (PARTITIONS, {})}))
        asyncio.run(fill(b.bootstrap, SENSORS, sensors, [b"m1"] * len(sensors)))
        env = worker_env(b.bootstrap, tmp / "data", pack)
        ceiling = asyncio.run(bare_consumer_rate(b.bootstrap, SENSORS, len(sensors)))
        print(f"bare aiokafka consumer (no Faust, no decoding), same topic: {ceiling:,.0f} records/s")
        minimal = plain_agent(tmp, "minimal", MINIMAL_AGENT, env, "minimal_events_total", len(sensors))
        matched = end_offset(b.bootstrap, "bench.minimal")()
        print(
            f"the issue's minimal Faust agent (decode, temperature > 100, send on a match: "
            f"{matched:,.0f} sent): {minimal.describe(len(sensors))} "
            f"(the issue measured ~{MINIMAL_BASELINE:,} on its host)"
        )
        noop = plain_agent(tmp, "noop", NOOP_AGENT, env, "noop_events_total", len(sensors))
        print(f"no-op Faust agent (Faust's own per-message floor): {noop.describe(len(sensors))}")
        rate = progress_rate(
            WORKER,
            env,
            tmp / "worker.log",
            metric(env["APP_METRICS_PORT"], 'worker_events_total{source="sensors"}'),
            len(sensors),
            outputs=end_offset(b.bootstrap, ALERTS) if quix is not None else None,
        )
        print(f"Faust worker, full pack, sensors topic: {rate.describe(len(sensors))} (target 100,000)")
        if minimal.rate and rate.rate:
            print(
                f"  the worker in this run: {rate.rate / minimal.rate:.1f}x the minimal Faust agent's rate "
                f"(the target, 100,000, is {100_000 / MINIMAL_BASELINE:.1f}x the ~{MINIMAL_BASELINE:,} the "
                "issue measured for that agent on its host)"
            )
        if quix is not None:
            peer_beside(quix, b.bootstrap, tmp, "quix-sensors", len(sensors), rate, "the sensors topic")
    records = [(SOURCE_TOPICS[i.source], i.key, i.value) for i in items]
    peer_events = sum(1 for i in items if i.source in ("sensors", "logs"))

    def mixed_peer(bootstrap: str, worker: Progress) -> None:
        if quix is not None:
            peer_beside(
                quix, bootstrap, tmp, "quix-mixed", peer_events, worker, "the sensors and logs topics"
            )
            print(SEMANTICS)

    mixed = worker_on_fresh_broker(
        tmp, pack, "mixed", records, "worker_events_total{", len(items), then=mixed_peer
    )
    print(
        f"Faust worker, full pack, mixed sensors/logs/finance topics: {mixed.describe(len(items))} "
        "(log events are read twice: once as they come, once regrouped by client IP)"
    )
    if not fleet_devices:
        return
    registry, readings = fleet(fleet_devices, len(items))
    # the registry first: the worker reads it as it starts
    records = [(DEVICES_TABLE, str(r["device_id"]).encode(), orjson.dumps(r)) for r in registry]
    records += [(SENSORS, str(r["device_id"]).encode(), orjson.dumps(r)) for r in readings]
    counter = 'worker_events_total{source="sensors"}'
    rate = worker_on_fresh_broker(tmp, pack, "fleet", records, counter, len(readings))
    print(
        f"Faust worker, full pack, fleet of {fleet_devices:,} devices and "
        f"{fleet_devices // 20:,} vehicles: {rate.describe(len(readings))}"
    )


def peer_beside(
    quix: Path, bootstrap: str, tmp: Path, name: str, expect: int, worker: Progress, what: str
) -> None:
    """The Quix peer over the topics the worker (the whole pack) just read: its rate beside the
    worker's, and the agreement of their alerts."""
    peer = run_peer(quix, bootstrap, tmp, name, expect)
    print(
        f"Quix Streams peer (t-0, machine-hourly-heat and not-found-scan by hand), {what}: "
        f"{peer.describe(expect)}"
    )
    if peer.rate and worker.rate:
        print(
            f"  the worker with the whole pack {worker.rate:,.0f} events/s, "
            f"the Quix peer with 3 rules {peer.rate:,.0f}: {worker.rate / peer.rate:.1f}x"
        )
    if not (worker.done and peer.done):
        print("  (one of them did not read every event: what it missed counts against the agreement)")
    report_agreement(bootstrap)


def worker_on_fresh_broker(
    tmp: Path, pack: Path, name: str, records: list[tuple[str, bytes, bytes]], counter: str, expect: int,
    then: Callable[[str, Progress], None] | None = None,
) -> Progress:  # fmt: skip
    """The rule worker on a fresh broker (no offsets or state of an earlier run) whose topics
    hold ``records`` (topic, key, value), produced in order: its rate by the ``counter`` metric.
    ``then`` runs after the worker, with the broker's address, while the broker still runs."""
    with KafkaBroker(tmp / f"kafka-{name}") as b:
        if then is not None:
            keep_peer_topics(b.bootstrap, PARTITIONS)
        asyncio.run(ensure_topics(b.bootstrap, PARTITIONS))
        asyncio.run(fill_many(b.bootstrap, records))
        env = worker_env(b.bootstrap, tmp / f"{name}-data", pack)
        rate = progress_rate(
            WORKER, env, tmp / f"{name}.log", metric(env["APP_METRICS_PORT"], counter), expect,
            outputs=end_offset(b.bootstrap, ALERTS) if then is not None else None,
        )  # fmt: skip
        if then is not None:
            then(b.bootstrap, rate)
        return rate


def bench_latency(tmp: Path, args: argparse.Namespace, echo: bool = False) -> LatencyResult:
    """The rule worker (or, ``echo``, the bare aiokafka echo) under paced traffic, on its own broker."""
    rules = rule_pack(tmp / "latency-rules")
    (rules / "latency-probe.yaml").write_text(PROBE_RULES)
    background = events(int(args.latency_rate * (LATENCY_WARMUP_S + args.latency_seconds) * 1.1) + 1000)
    name = "echo" if echo else "latency-worker"
    partitions = args.latency_partitions
    with KafkaBroker(tmp / f"kafka-{name}") as b:
        asyncio.run(log_append_time_alerts(b.bootstrap, partitions))
        asyncio.run(ensure_topics(b.bootstrap, partitions))
        asyncio.run(wait_for_leaders(b.bootstrap, [*SOURCE_TOPICS.values(), ALERTS]))
        env = worker_env(b.bootstrap, tmp / f"{name}-data", rules, partitions)
        port = env["APP_METRICS_PORT"]
        # the worker's own histograms, read as measuring begins and after it
        histograms = ("worker_consume_lag_seconds", "worker_batch_seconds")
        marks: dict[str, dict[float, float]] = {}

        def on_measure() -> None:
            if not echo:
                marks.update({h: histogram(port, h) for h in histograms})

        cmd = WORKER
        if echo:
            (tmp / "echo.py").write_text(ECHO_WORKER)
            cmd = [sys.executable, str(tmp / "echo.py")]
        with worker_process(cmd, env, tmp / f"{name}.log") as proc:
            res = asyncio.run(
                measure_latency(
                    b.bootstrap,
                    background,
                    partitions=partitions,
                    rate=args.latency_rate,
                    seconds=args.latency_seconds,
                    warmup_s=LATENCY_WARMUP_S,
                    alive=lambda: proc.poll() is None,
                    linger_ms=args.producer_linger_ms,
                    on_measure=on_measure,
                )
            )
            consumed = 0.0 if echo else metric(port, "worker_events_total{")()
            after = {h: histogram(port, h) for h in histograms} if marks else {}
            if proc.poll() is not None:
                print(f"the {name} process exited ({proc.returncode})")
    if echo:
        print(
            "latency floor: a bare aiokafka echo (consumes every event, produces each to alerts; "
            "no Faust, no rules), same broker settings and host:"
        )
    else:
        print(f"latency: the Faust worker, full pack plus a probe rule, {partitions} partitions per topic:")
    report_latency(res)
    if not echo:
        print(f"  the worker had consumed {consumed:,.0f} of the {res.sent:,} events sent when the run ended")
    if after:
        lag, batch = (
            [bucket_quantile(marks[h], after[h], q) for q in (0.5, 0.99)] for h in histograms
        )  # fmt: skip
        print(
            "  the worker's own histograms, from the measured window on (bucket bounds): "
            f"a batch's decoding and evaluation p50 {batch[0]}, p99 {batch[1]}; the age of a "
            f"batch's first record as its evaluation starts p50 {lag[0]}, p99 {lag[1]}"
        )
    warnings = (tmp / f"{name}.log").read_text(errors="replace").splitlines()
    if warnings:
        print(f"  the {name} process logged {len(warnings)} lines at WARNING or above; the last ones:")
        print(log_tail(tmp / f"{name}.log", 3))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=60_000, help="events for the evaluator-alone figures")
    ap.add_argument(
        "--worker-events", type=int, default=200_000, help="events for the Faust agents' and worker's figures"
    )
    ap.add_argument("--skip-faust", action="store_true", help="the evaluator alone: no broker, no worker")
    ap.add_argument(
        "--skip-throughput", action="store_true", help="no minimal-agent, worker and Quix events/s runs"
    )
    ap.add_argument("--skip-quix", action="store_true", help="no Quix Streams peer")
    ap.add_argument("--skip-latency", action="store_true", help="no paced latency run")
    ap.add_argument("--latency-rate", type=float, default=5_000.0, help="paced input, events/s")
    ap.add_argument("--latency-seconds", type=float, default=20.0, help="measured span after warm-up")
    ap.add_argument(
        "--producer-linger-ms", type=int, default=1, help="linger of the latency run's event producer"
    )
    ap.add_argument(
        "--latency-partitions", type=int, default=PARTITIONS, help="partitions per topic in the latency runs"
    )
    ap.add_argument("--skip-echo", action="store_true", help="no bare-aiokafka echo run (the latency floor)")
    ap.add_argument("--fleet-devices", type=int, default=1_000, help="sensors of the fleet figure (0: none)")
    args = ap.parse_args()
    # a produce right after a topic's creation may meet "not leader" once: aiokafka retries it
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    if not NAB.exists():
        print(f"datasets missing under {DATA}: skipped")
        return 0
    # the workers started below inherit APP_NATIVE, and find the same build
    print(f"evaluator hot path: {native.status()}")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        pack = rule_pack(tmp / "rules")
        items = events(args.events)
        bench_evaluator(pack, items)
        if args.fleet_devices:
            bench_fleet(pack, args.fleet_devices, args.events)
        if args.skip_faust:
            return 0
        if not args.skip_throughput:
            quix = None if args.skip_quix else quix_python()
            bench_throughput(tmp, pack, events(args.worker_events), args.fleet_devices, quix)
        if not args.skip_latency:
            worker = bench_latency(tmp, args)
            if not args.skip_echo:
                echo = bench_latency(tmp, args, echo=True)
                report_against_floor(worker, echo)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
