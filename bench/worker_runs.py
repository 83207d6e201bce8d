"""Benchmark runs of a Faust worker subprocess: throughput from its progress, and event-to-alert latency.

Used by ``bench_rules.py``. Every function here is bounded: a worker process is
terminated (then killed) when its ``with`` block ends, and every wait has a
deadline. Times are on this host's clock; the broker, the worker and this
process share its CPUs, so the figures include that contention.
"""

from __future__ import annotations

import asyncio
import logging
import math
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from app.broker import cpu_seconds
from app.events import format_ts
from app.kafka import end_offsets
from app.rules.evaluator import partition_for
from app.topics import ALERTS, SENSORS, SOURCE_TOPICS

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.2


class Item(NamedTuple):
    """One benchmark event: its source, record key and value, and its event time (epoch ms)."""

    source: str
    key: bytes
    value: bytes
    ts_ms: int


@contextmanager
def worker_process(cmd: Sequence[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` (stdout and stderr to ``log``) for the ``with`` block; terminate it after, kill at 15 s."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(cmd), env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def log_tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Progress(NamedTuple):
    """Events/s between the first non-zero progress reading and the last one; ``done``: ``expect`` reached."""

    rate: float
    count: float
    done: bool
    startup_s: float  # from the start of the process to its first non-zero reading

    def describe(self, expect: float) -> str:
        started = f"first progress {self.startup_s:.1f} s after start"
        if self.done:
            return f"{self.rate:,.0f} events/s ({started})"
        stopped = f"INCOMPLETE: stopped at {self.count:,.0f} of {expect:,.0f}"
        return f"{self.rate:,.0f} events/s ({stopped}; {started})"


def progress_rate(
    cmd: Sequence[str],
    env: dict[str, str],
    log: Path,
    progress: Callable[[], float],
    expect: float,
    timeout_s: float = 40.0,
) -> Progress:
    """Start a worker and measure its events/s through a pre-filled topic.

    ``progress`` returns a count that grows with the events handled (an output
    topic's end offset, or a worker counter). The rate runs from its first
    non-zero reading (start-up and group join excluded) until it reaches
    ``expect``; if the worker exits or ``timeout_s`` passes first, the rate so
    far, with ``done`` false (0.0 when nothing was handled).
    """
    with worker_process(cmd, env, log) as proc:
        first: tuple[float, float] | None = None
        count, now = 0.0, time.monotonic()
        began, deadline = now, now + timeout_s
        while now < deadline and proc.poll() is None:
            count = progress()
            now = time.monotonic()
            if count and first is None:
                first = (now, count)
            if first is not None and count >= expect:
                return Progress((count - first[1]) / max(now - first[0], 1e-3), count, True, first[0] - began)
            time.sleep(POLL_S)
        if proc.poll() is not None:
            print(f"worker exited ({proc.returncode}); its log ends:\n{log_tail(log)}")
        if first is None:
            return Progress(0.0, count, False, math.nan)
        return Progress((count - first[1]) / max(now - first[0], 1e-3), count, False, first[0] - began)


def end_offset(bootstrap: str, topic: str) -> Callable[[], float]:
    """A progress reading: the sum of ``topic``'s end offsets."""
    return lambda: float(asyncio.run(end_offsets(bootstrap, [topic]))[topic])


def scrape(port: int | str) -> list[str]:
    """The lines of a Prometheus endpoint on 127.0.0.1; none when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return resp.read().decode().splitlines()
    except OSError:
        return []


def metric(port: int | str, sample: str) -> Callable[[], float]:
    """A progress reading: the sum of the samples of a Prometheus endpoint whose ``name{labels}``
    starts with ``sample``; 0 when there are none or the endpoint does not answer."""

    def read() -> float:
        return sum(float(line.split()[-1]) for line in scrape(port) if line.startswith(sample))

    return read


# -- latency ---------------------------------------------------------------------------------------

PROBE_RULE = "latency-probe"
PROBE_RULES = f"""rules:
  - id: {PROBE_RULE}
    description: Benchmark probe; fires on odd and resolves on even sequence numbers of one device
    source: sensors
    where: value > 0
    group_by: [device_id]
    severity: info
"""
PROBE_EVERY = 5  # one event in five is a probe; the others are the pack's real traffic
TICK_S = 0.002  # the producer sends what is due every 2 ms


def probe_device(partitions: int, avoid: bytes = b"m1") -> str:
    """A device id on another sensors partition than ``avoid``, so the probes do not move its clock."""
    return next(
        f"probe-{i}"
        for i in range(1000)
        if partitions == 1
        or partition_for(f"probe-{i}".encode(), partitions) != partition_for(avoid, partitions)
    )


@dataclass
class LatencyResult:
    """Figures of one paced run. Latencies in ms; ``math.inf`` for a probe whose alert never came."""

    requested_rate: float
    achieved_rate: float = 0.0
    seconds: float = 0.0
    sent: int = 0  # every event sent, readiness and warm-up included
    ready_s: float = 0.0  # from the first readiness probe to the first probe alert
    record_ms: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)
    missing: int = 0
    wrong_status: int = 0
    other_alerts: int = 0
    not_create_time: int = 0  # probe alerts whose record timestamp is not CreateTime (the broker's instead)
    broker_cpu: list[float] = field(default_factory=list)  # the broker's CPU share, each second measured


def histogram(port: int | str, name: str) -> dict[float, float]:
    """A Prometheus histogram's cumulative bucket counts, by upper bound, summed over its
    labels; empty when the endpoint does not answer."""
    counts: dict[float, float] = {}
    for line in scrape(port):
        if line.startswith(name + "_bucket{"):
            bound = float(line.split('le="', 1)[1].split('"', 1)[0])
            counts[bound] = counts.get(bound, 0.0) + float(line.split()[-1])
    return counts


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> str:
    """The upper bound of the bucket holding the ``q`` quantile of what a histogram counted
    between two readings, as text (``<= 5 ms``)."""
    grown = sorted((bound, after[bound] - before.get(bound, 0.0)) for bound in after)
    if not grown or grown[-1][1] <= 0:
        return "n/a"
    for bound, count in grown:
        if count >= q * grown[-1][1]:
            return "over the last bucket" if math.isinf(bound) else f"<= {bound * 1000:g} ms"
    return "n/a"


def percentiles(values: list[float], qs: Sequence[float] = (0.5, 0.95, 0.99, 1.0)) -> list[float]:
    """Nearest-rank percentiles (``1.0`` is the maximum); empty input gives NaN."""
    if not values:
        return [math.nan for _ in qs]
    ordered = sorted(values)
    return [ordered[max(0, math.ceil(q * len(ordered)) - 1)] for q in qs]


async def measure_latency(
    bootstrap: str,
    background: Sequence[Item],
    *,
    partitions: int,
    rate: float,
    seconds: float,
    warmup_s: float,
    alive: Callable[[], bool],
    ready_timeout_s: float = 45.0,
    drain_s: float = 5.0,
    linger_ms: int = 2,
    broker_pid: int | None = None,
    on_measure: Callable[[], object] | None = None,
) -> LatencyResult:
    """Pace ``rate`` events/s at a running worker and time each probe event to its alert.

    Every ``PROBE_EVERY``-th event is a probe: device ``probe_device()``, ``value``
    = +seq on odd and -seq on even sequence numbers, so under ``PROBE_RULES``
    each probe is one transition (firing, then resolved) whose alert carries
    ``values.value``. A probe's event time is that of the latest background
    sensors event, so the rules see the same clock as the rest of the traffic.

    First one probe every 0.25 s until an alert comes back (the worker has
    joined and loaded its tables; ``ready_timeout_s``), then ``warmup_s`` of
    paced traffic, then ``seconds`` measured, then up to ``drain_s`` for the
    last alerts. Two figures per probe, in ms: the alert record's CreateTime
    minus the event record's (both stamped at ``send`` on this host's clock),
    and this process's receipt of the alert minus its ``send`` of the event.

    ``linger_ms``: the event producer's linger. Events go out in ticks of
    ``TICK_S``; with no linger each tick became a produce request per partition,
    and those tiny requests alone kept the embedded broker busy enough that even
    a bare aiokafka echo fell behind at 5,000 events/s. The ingest adapters
    linger 5 ms; the default 2 ms batches one tick.

    ``broker_pid``: the embedded broker's process, whose CPU share is taken each second
    measured (``LatencyResult.broker_cpu``); ``on_measure``: called as measuring begins.
    """
    device = probe_device(partitions)
    res = LatencyResult(requested_rate=rate)
    sent_at: dict[int, tuple[int, float]] = {}  # measured seq -> (event CreateTime ms, send wall clock s)
    got: dict[int, tuple[float, float]] = {}  # seq -> (record latency ms, wall latency ms)
    measuring = False
    stop = asyncio.Event()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=linger_ms, acks=1)
    consumer = AIOKafkaConsumer(
        ALERTS, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest", fetch_max_wait_ms=50
    )

    async def consume() -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for records in batch.values():
                for r in records:
                    alert = orjson.loads(r.value)
                    if alert["rule_id"] != PROBE_RULE:
                        res.other_alerts += 1
                        continue
                    seq = abs(int(alert["values"]["value"]))
                    res.not_create_time += r.timestamp_type != 0
                    if alert["status"] != ("firing" if seq % 2 else "resolved"):
                        res.wrong_status += 1
                    if seq in sent_at and seq not in got:
                        ts, wall = sent_at[seq]
                        got[seq] = (r.timestamp - ts, (now - wall) * 1000)
                    elif seq not in sent_at:
                        got.setdefault(seq, (math.nan, math.nan))  # a readiness or warm-up probe

    seq = 0
    clock_ms = next((b.ts_ms for b in background if b.source == "sensors"), 1_700_000_000_000)

    async def send_probe() -> None:
        nonlocal seq
        seq += 1
        now = time.time()
        ts = int(now * 1000)
        body = {"device_id": device, "ts": format_ts(clock_ms), "value": float(seq if seq % 2 else -seq)}
        if measuring:
            sent_at[seq] = (ts, now)
        await producer.send(SENSORS, orjson.dumps(body), key=device.encode(), timestamp_ms=ts)

    await producer.start()
    await consumer.start()
    reader = asyncio.create_task(consume())
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not got and time.monotonic() < deadline and alive() and not reader.done():
            await send_probe()
            await asyncio.sleep(0.25)
        if not got:
            print(f"latency: no probe alert within {ready_timeout_s:.0f} s (or the worker exited)")
            return res
        sent = measured = 0
        cpu_mark = (0.0, 0.0)  # (when, the broker's CPU seconds then)
        t0 = time.monotonic()
        res.ready_s = t0 - (deadline - ready_timeout_s)
        start, end = t0 + warmup_s, t0 + warmup_s + seconds
        bg = iter(background)
        while (now := time.monotonic()) < end:
            if not measuring and now >= start:
                measuring, measured, start = True, 0, now
                if on_measure is not None:
                    on_measure()
                cpu_mark = (now, (cpu_seconds(broker_pid) or 0.0) if broker_pid is not None else 0.0)
            if measuring and broker_pid is not None and now - cpu_mark[0] >= 1.0:
                cpu = cpu_seconds(broker_pid) or 0.0
                res.broker_cpu.append(100 * (cpu - cpu_mark[1]) / (now - cpu_mark[0]))
                cpu_mark = (now, cpu)
            due = int(rate * (now - t0))
            while sent < due:
                if sent % PROBE_EVERY == 0:
                    await send_probe()
                else:
                    item = next(bg)
                    if item.source == "sensors":
                        clock_ms = max(clock_ms, item.ts_ms)  # the series steps back at places
                    await producer.send(SOURCE_TOPICS[item.source], item.value, key=item.key)
                sent += 1
                measured += measuring
            await asyncio.sleep(TICK_S)
        res.seconds = time.monotonic() - start
        res.sent = seq + sent - (sent + PROBE_EVERY - 1) // PROBE_EVERY
        res.achieved_rate = measured / res.seconds
        measuring = False
        await asyncio.wait_for(producer.flush(), drain_s)
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and not set(sent_at) <= set(got):
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait({reader}, timeout=2)
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            print(f"latency: the alert reader failed: {reader.exception()!r}")
        reader.cancel()
        await producer.stop()
        await consumer.stop()
    for s in sorted(sent_at):
        record, wall = got.get(s, (math.inf, math.inf))
        res.record_ms.append(record)
        res.wall_ms.append(wall)
    res.missing = sum(1 for s in sent_at if s not in got)
    return res


#: The floor of the latency run: a bare aiokafka consumer and producer that answer each probe
#: event with its alert at once (no Faust, no rules, no decoding of other events), on the same
#: broker and host. Its figures are what the broker, the clients and the CPUs cost by themselves.
ECHO_WORKER = f"""
import asyncio, os, orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
async def main():
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    topics = {sorted(SOURCE_TOPICS.values())!r}
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, group_id="bench-echo",
                                auto_offset_reset="earliest", fetch_max_wait_ms=5)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1)
    await consumer.start()
    await producer.start()
    while True:
        for records in (await consumer.getmany(timeout_ms=1000)).values():
            for r in records:
                ev = orjson.loads(r.value)
                if str(ev.get("device_id", "")).startswith("probe-"):
                    value = ev["value"]
                    status = "firing" if value > 0 else "resolved"
                    alert = {{"rule_id": {PROBE_RULE!r}, "status": status, "values": {{"value": value}}}}
                    await producer.send({ALERTS!r}, orjson.dumps(alert), key=b"probe")
asyncio.run(main())
"""


def report_latency(res: LatencyResult, target_ms: float = 20.0) -> None:
    print(
        f"latency run: {res.requested_rate:,.0f} events/s requested, {res.achieved_rate:,.0f} achieved "
        f"over {res.seconds:.1f} s; 1 event in {PROBE_EVERY} a probe: {len(res.record_ms):,} measured, "
        f"{res.missing} without alert, {res.wrong_status} with a wrong status; "
        f"{res.other_alerts:,} alerts of the other rules; worker ready after {res.ready_s:.1f} s"
    )
    for what, values in (
        ("record CreateTime, event -> alert", res.record_ms),
        ("wall clock, bench send -> bench receipt", res.wall_ms),
    ):
        if res.missing:
            what += ", a missing alert counts as inf"
        p50, p95, p99, top = percentiles(values)
        print(
            f"event-to-alert latency ({what}): p50 {p50:.0f} ms, p95 {p95:.0f} ms, p99 {p99:.0f} ms, "
            f"max {top:.0f} ms (target p99 <= {target_ms:.0f} ms)"
        )
    quarter = len(res.record_ms) // 4
    if quarter:
        head, tail = percentiles(res.record_ms[:quarter])[0], percentiles(res.record_ms[-quarter:])[0]
        if math.isinf(head):
            trend = "no alert came back: the worker is behind the input"
        elif tail < max(2 * head, head + target_ms):
            trend = "steady"
        else:
            trend = "growing: the path falls behind"
        print(
            f"  p50 over the first quarter of the probes {head:.0f} ms, over the last {tail:.0f} ms ({trend})"
        )
    if len(res.broker_cpu) >= 2:
        n = min(5, len(res.broker_cpu) // 2)
        first, last = sum(res.broker_cpu[:n]) / n, sum(res.broker_cpu[-n:]) / n
        print(
            f"  the broker's CPU share: {first:.0f} % in the first {n} s measured, {last:.0f} % in the last"
        )
    if res.not_create_time:
        print(f"  warning: {res.not_create_time} alert records carry the broker's time, not CreateTime")
    arrived = [v for v in res.record_ms if v != math.inf]
    if res.missing and arrived:
        p50, p95, p99, top = percentiles(arrived)
        print(
            f"  of the {len(arrived):,} probes whose alert arrived (record CreateTime): p50 {p50:.0f} ms, "
            f"p95 {p95:.0f} ms, p99 {p99:.0f} ms, max {top:.0f} ms"
        )
