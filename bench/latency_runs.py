"""Event-to-alert latency under paced traffic, and its floor: a bare aiokafka echo.

Used by ``bench_rules.py``. A run paces events at a running consumer (the rule worker or
:data:`ECHO_WORKER`) and times each probe event to the record that answers it on the
``alerts`` topic:

* **append**: the answer's broker append time minus the event's produce timestamp. The
  bench creates ``alerts`` with ``message.timestamp.type=LogAppendTime``
  (:func:`log_append_time_alerts`),
  so the broker stamps each alert as it appends it; the event's timestamp is its CreateTime,
  stamped by this process at ``send``. One host, one clock;
* **wall**: this process's receipt of the answer minus its ``send`` of the event (the
  reader's consume time: the first figure plus the reader's fetch).

Every wait here has a deadline; nothing outlives the call.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from worker_runs import Item, close_probe, create_topics, percentiles

from app.events import format_ts
from app.placement import partition_for
from app.runtime.settings import Settings
from app.topics import ALERTS, SENSORS, SOURCE_TOPICS

logger = logging.getLogger(__name__)

PROBE_RULE = "latency-probe"


def probe_rules(rule_id: str) -> str:
    """The rule file of the latency probe: fires on odd and resolves on even sequence numbers."""
    return f"""rules:
  - id: {rule_id}
    description: Benchmark probe; fires on odd and resolves on even sequence numbers of one device
    source: sensors
    where: value > 0
    group_by: [device_id]
    severity: info
"""


PROBE_RULES = probe_rules(PROBE_RULE)
PROBE_EVERY = 5  # one event in five is a probe; the others are the pack's real traffic
TICK_S = 0.002  # the producer sends what is due every 2 ms
#: aiokafka's timestamp type of a record stamped by the broker
LOG_APPEND_TIME = 1


def probe_device(partitions: int, avoid: bytes = b"m1") -> str:
    """A device id on another sensors partition than ``avoid``, so the probes do not move its clock."""
    return next(
        f"probe-{i}"
        for i in range(1000)
        if partitions == 1
        or partition_for(f"probe-{i}".encode(), partitions) != partition_for(avoid, partitions)
    )


async def log_append_time_alerts(bootstrap: str, partitions: int) -> None:
    """Create ``alerts`` (before ``ensure_topics`` does) with the broker stamping each record
    with its append time: a bench-only setting, so the timestamps measure the path to the topic."""
    await create_topics(bootstrap, {ALERTS: (partitions, {"message.timestamp.type": "LogAppendTime"})})


def probe_answer(value: bytes) -> tuple[int, str] | None:
    """The probe sequence number and status a record on ``alerts`` answers: a probe rule's alert
    (the worker's) or the probe event itself (the echo's); None for anything else."""
    doc = orjson.loads(value)
    if doc.get("rule_id") == PROBE_RULE:
        return abs(int(doc["values"]["value"])), str(doc["status"])
    if str(doc.get("device_id", "")).startswith("probe-"):
        raw = float(doc["value"])
        return abs(int(raw)), "firing" if raw > 0 else "resolved"
    return None


@dataclass
class LatencyResult:
    """Figures of one paced run. Latencies in ms; ``math.inf`` for a probe whose answer never came."""

    requested_rate: float
    achieved_rate: float = 0.0
    seconds: float = 0.0
    sent: int = 0  # every event sent, readiness and warm-up included
    ready_s: float = 0.0  # from the first readiness probe to the first answer
    append_ms: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)
    missing: int = 0
    wrong_status: int = 0
    other_records: int = 0  # records on alerts that answer no probe (the pack's alerts, other echoes)
    not_append_time: int = 0  # answers not stamped with the broker's append time

    def summary(self) -> tuple[float, float, float]:
        """p50, p99 and max of the append-time latency (ms)."""
        p50, _p95, p99, top = percentiles(self.append_ms)
        return p50, p99, top


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
    linger_ms: int = 1,
    on_measure: Callable[[], object] | None = None,
) -> LatencyResult:
    """Pace ``rate`` events/s at a running consumer and time each probe event to its answer.

    Every ``PROBE_EVERY``-th event is a probe: device ``probe_device()``, ``value`` = +seq on
    odd and -seq on even sequence numbers, so under ``PROBE_RULES`` each probe is one
    transition (firing, then resolved) whose alert carries ``values.value``. A probe's event
    time follows the latest background sensors event, so the rules see the same clock as the
    rest of the traffic, in steps of at most the event-time bound (``APP_MAX_EVENT_SKEW``):
    where the background moved its clock 10 or 20 minutes between two probes, the bound held
    a probe for a second witness, and the run's last probe, which has none, was answered after
    3 to 4 s (the quiet release), the max of about every run.

    First one probe every 0.25 s until an answer comes back (the worker has joined and loaded
    its tables; ``ready_timeout_s``), then ``warmup_s`` of paced traffic, then ``seconds``
    measured, then up to ``drain_s`` for the last answers. Events go out every ``TICK_S``
    through one producer lingering ``linger_ms`` (1 ms, the worker's own producer's).
    ``on_measure``: called as measuring begins.
    """
    device = probe_device(partitions)
    res = LatencyResult(requested_rate=rate)
    sent_at: dict[int, tuple[int, float]] = {}  # measured seq -> (event CreateTime ms, send wall clock s)
    got: dict[int, tuple[float, float]] = {}  # seq -> (append-time latency ms, wall latency ms)
    measuring = False
    stop = asyncio.Event()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=linger_ms, acks=1)
    consumer = AIOKafkaConsumer(
        ALERTS, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )

    async def consume() -> None:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for records in batch.values():
                for r in records:
                    answer = probe_answer(r.value)
                    if answer is None:
                        res.other_records += 1
                        continue
                    seq, status = answer
                    res.not_append_time += r.timestamp_type != LOG_APPEND_TIME
                    if status != ("firing" if seq % 2 else "resolved"):
                        res.wrong_status += 1
                    if seq in sent_at and seq not in got:
                        ts, wall = sent_at[seq]
                        got[seq] = (r.timestamp - ts, (now - wall) * 1000)
                    elif seq not in sent_at:
                        got.setdefault(seq, (math.nan, math.nan))  # a readiness or warm-up probe

    seq = 0
    clock_ms = next((b.ts_ms for b in background if b.source == "sensors"), 1_700_000_000_000)
    probe_ms = clock_ms
    # the probe device is alone on its partition, so its events are that partition's clock: a
    # step further ahead than the worker's event-time bound would hold the probe for a second
    # witness, and the run's last probe has none (held 3-4 s: docs/event-time.md)
    skew = Settings.from_env().max_event_skew_ms
    step = skew if skew >= 0 else 2**62

    async def send_probe() -> None:
        nonlocal seq, probe_ms
        seq += 1
        now = time.time()
        ts = int(now * 1000)
        probe_ms = max(probe_ms, min(clock_ms, probe_ms + step))
        body = {"device_id": device, "ts": format_ts(probe_ms), "value": float(seq if seq % 2 else -seq)}
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
            print(f"latency: no answer to a probe within {ready_timeout_s:.0f} s (or the consumer exited)")
            return res
        sent = measured = 0
        t0 = time.monotonic()
        res.ready_s = t0 - (deadline - ready_timeout_s)
        start, end = t0 + warmup_s, t0 + warmup_s + seconds
        bg = iter(background)
        while (now := time.monotonic()) < end:
            if not measuring and now >= start:
                measuring, measured, start = True, 0, now
                if on_measure is not None:
                    on_measure()
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
        await close_probe(stop, reader, producer, consumer)
    for s in sorted(sent_at):
        append, wall = got.get(s, (math.inf, math.inf))
        res.append_ms.append(append)
        res.wall_ms.append(wall)
    res.missing = sum(1 for s in sent_at if s not in got)
    return res


#: The floor of the latency run: a bare aiokafka consumer and producer that consume every
#: record of the source topics and produce each one to ``alerts`` as it is (no Faust, no rules,
#: no decoding), on the same broker and host. The consumer keeps aiokafka's defaults (fetch
#: wait 500 ms); the producer has the worker's settings (linger 1 ms, acks=all, idempotent).
ECHO_WORKER = f"""
import asyncio, os
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
async def main():
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    topics = {sorted(SOURCE_TOPICS.values())!r}
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, group_id="bench-echo",
                                auto_offset_reset="earliest")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1, acks="all",
                                enable_idempotence=True)
    await consumer.start()
    await producer.start()
    while True:
        for records in (await consumer.getmany(timeout_ms=1000)).values():
            for r in records:
                await producer.send({ALERTS!r}, r.value, key=r.key)
asyncio.run(main())
"""


def report_latency(res: LatencyResult, target_ms: float = 20.0) -> None:
    print(
        f"  {res.requested_rate:,.0f} events/s requested, {res.achieved_rate:,.0f} achieved over "
        f"{res.seconds:.1f} s; 1 event in {PROBE_EVERY} a probe: {len(res.append_ms):,} measured, "
        f"{res.missing} without an answer, {res.wrong_status} with a wrong status; "
        f"{res.other_records:,} other records on alerts; first answer after {res.ready_s:.1f} s"
    )
    for what, values in (
        ("event CreateTime -> alert's broker append time", res.append_ms),
        ("bench send -> bench receipt, wall clock", res.wall_ms),
    ):
        if res.missing:
            what += "; a missing answer counts as inf"
        p50, p95, p99, top = percentiles(values)
        print(
            f"  {what}: p50 {p50:.1f} ms, p95 {p95:.1f} ms, p99 {p99:.1f} ms, max {top:.1f} ms "
            f"(target p99 <= {target_ms:.0f} ms)"
        )
    if res.append_ms:
        slowest = max(range(len(res.append_ms)), key=res.append_ms.__getitem__)
        print(f"  the slowest answer was probe {slowest + 1:,} of the {len(res.append_ms):,} measured")
    quarter = len(res.append_ms) // 4
    if quarter:
        head, tail = percentiles(res.append_ms[:quarter])[0], percentiles(res.append_ms[-quarter:])[0]
        if math.isinf(head):
            trend = "no answer came back: the consumer is behind the input"
        elif tail < max(2 * head, head + target_ms):
            trend = "steady"
        else:
            trend = "growing: the path falls behind"
        print(
            f"  p50 over the first quarter of the probes {head:.1f} ms, over the last {tail:.1f} ms ({trend})"
        )
    if res.not_append_time:
        print(f"  warning: {res.not_append_time} answers carry a CreateTime, not the broker's append time")
    arrived = [v for v in res.append_ms if v != math.inf]
    if res.missing and arrived:
        p50, p95, p99, top = percentiles(arrived)
        print(
            f"  of the {len(arrived):,} probes answered: p50 {p50:.1f} ms, p95 {p95:.1f} ms, "
            f"p99 {p99:.1f} ms, max {top:.1f} ms"
        )


def report_against_floor(worker: LatencyResult, echo: LatencyResult, target_ms: float = 20.0) -> None:
    """The worker's append-time p50/p99/max beside the echo's, their ratio and the two targets."""
    w50, w99, wmax = worker.summary()
    e50, e99, emax = echo.summary()
    ratio = w99 / e99 if e99 > 0 else math.nan
    print(
        f"latency, event -> alert on the topic, worker against the echo floor: p50 {w50:.1f} / {e50:.1f} ms, "
        f"p99 {w99:.1f} / {e99:.1f} ms, max {wmax:.1f} / {emax:.1f} ms"
    )
    print(
        f"  worker p99 {w99:.1f} ms: target <= {target_ms:.0f} ms "
        f"({'met' if w99 <= target_ms else 'NOT met'}; goal 10 ms); "
        f"{ratio:.2f}x the echo's p99: target <= 2x ({'met' if ratio <= 2 else 'NOT met'})"
    )
