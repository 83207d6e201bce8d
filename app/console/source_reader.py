"""Read an alert's group's readings from its rule's source topic, bounded, for the console.

:func:`read_readings` is the Kafka half of :mod:`app.console.readings`. It connects as the
console does (``target``: the console's settings, so its TLS/SASL principal, which the ACLs
let read ``events.*``; no consumer group: partitions are assigned, nothing is committed) and,
per partition it reads:

1. starts at ``offsets_for_times`` of the window's start (record time);
2. checks the first record of the group from there: when its event time is before the
   window (the record timestamps run ahead of event time: a replay of history keeps its
   event times, the records are stamped when produced), it searches the partition by
   bisection on the event time of the group's records (each probe reads to the next record
   of the group), so the read starts at the window whatever the record timestamps say;
3. reads forward, offering each record to the :class:`~app.console.readings.Collector`,
   until the partition's end offset (taken at the start), or the collector has seen the
   group pass the window's end.

Bounds: at most ``max_records`` records read in all (probes included), at most
``budget_s`` seconds (connecting included); the report says which one stopped the read.
Retention: when the read starts at a partition's first retained offset (not 0) and the
group's first reading there is already inside the window, the window's start was deleted;
the report gives the event time from which readings are retained. Never raises: a broker
that does not answer, or a refusal, is the report's ``error``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from app.console.readings import BUDGET_S, MAX_RECORDS, Collector, ReadingsPlan, ReadReport
from app.kafka.clients import Target, connection, stop_consumer, topic_partitions
from app.placement import partition_for

logger = logging.getLogger(__name__)

#: records read at most per poll
_CHUNK = 500
#: records a probe reads at most looking for the group's next record
_PROBE_RECORDS = 2_000
#: records a probe takes per poll (the group's next record is usually close)
PROBE_CHUNK = 50


class _Budget:
    """The read's bounds: records read and the deadline."""

    def __init__(self, max_records: int, budget_s: float) -> None:
        self.max_records = max_records
        self.left = max_records
        self.deadline = time.monotonic() + budget_s
        self.hit = ""

    def spent(self) -> bool:
        if self.left <= 0:
            self.hit = "records"
        elif time.monotonic() >= self.deadline:
            self.hit = "time"
        return bool(self.hit)

    @property
    def read(self) -> int:
        """Records read so far."""
        return self.max_records - self.left

    def seconds(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


async def _poll(consumer: Any, tp: Any, budget: _Budget, limit: int) -> list[Any]:
    """Up to ``limit`` records of ``tp`` from the consumer's position (counted)."""
    wait_ms = int(min(500.0, budget.seconds() * 1000))
    got = await consumer.getmany(tp, timeout_ms=max(1, wait_ms), max_records=max(1, min(limit, budget.left)))
    records = got.get(tp, [])
    budget.left -= len(records)
    return records


async def _next_of_group(
    consumer: Any, tp: Any, at: int, end: int, collect: Collector, budget: _Budget
) -> tuple[int, int] | None:
    """(offset, event time) of the group's first record at or after offset ``at`` (before
    ``end``); None when there is none within :data:`_PROBE_RECORDS` records or the bounds."""
    consumer.seek(tp, at)
    scanned = 0
    while at < end and scanned < _PROBE_RECORDS and not budget.spent():
        if await consumer.position(tp) >= end:  # (a poll at the end would wait for records)
            return None
        records = await _poll(consumer, tp, budget, PROBE_CHUNK)
        if not records:
            continue
        for rec in records:
            if rec.offset >= end:
                return None
            ts = collect.event_time(rec.key, rec.value)
            if ts is not None:
                return rec.offset, ts
        scanned += len(records)
        at = records[-1].offset + 1
    return None


async def _start_offset(
    consumer: Any, tp: Any, lo: int, end: int, collect: Collector, budget: _Budget
) -> tuple[int, int | None]:
    """The first offset in [``lo``, ``end``) after which the group's records reach the
    window's start (the bisection of the module docstring, step 2), and the event time of
    the group's first record at ``lo`` when the read starts there (None: none found)."""
    first = await _next_of_group(consumer, tp, lo, end, collect, budget)
    if first is None or first[1] >= collect.plan.start_ms:
        return lo, None if first is None else first[1]
    lo, hi = first[0] + 1, end  # the group's record at first[0] is before the window
    while lo < hi and not budget.spent():
        mid = (lo + hi) // 2
        found = await _next_of_group(consumer, tp, mid, end, collect, budget)
        if found is None or found[1] >= collect.plan.start_ms:
            hi = mid
        else:
            lo = found[0] + 1
    return lo, None


async def _read(target: Target, plan: ReadingsPlan, collect: Collector, budget: _Budget) -> ReadReport:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    report = ReadReport()
    found = await topic_partitions(target, [plan.topic], timeout_s=budget.seconds())
    numbers = found.get(plan.topic)
    if not numbers:
        report.error = f"the topic {plan.topic} does not exist, or the console's principal may not read it"
        return report
    if plan.key is not None:
        numbers = [partition_for(plan.key, len(numbers))]
    report.partitions = tuple(numbers)
    tps = [TopicPartition(plan.topic, p) for p in numbers]
    consumer = AIOKafkaConsumer(
        **connection(target), enable_auto_commit=False, isolation_level="read_committed",
        request_timeout_ms=max(1000, int(budget.seconds() * 1000)),
    )  # fmt: skip
    await asyncio.wait_for(consumer.start(), budget.seconds())
    try:
        consumer.assign(tps)
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        at_time = await consumer.offsets_for_times({tp: max(0, plan.start_ms) for tp in tps})
        for tp in tps:
            begin, end = begins[tp], ends[tp]
            if begin >= end:
                if end > 0:  # records were written, and every one was deleted since
                    report.retained_from_ms = plan.end_ms
                continue
            stamped = at_time.get(tp)
            lo = end if stamped is None else stamped.offset
            start, first_ts = await _start_offset(consumer, tp, lo, end, collect, budget)
            if start == begin and begin > 0 and first_ts is not None and first_ts > plan.start_ms:
                report.retained_from_ms = first_ts
            consumer.seek(tp, start)
            while not budget.spent() and await consumer.position(tp) < end:
                records = await _poll(consumer, tp, budget, _CHUNK)
                wanted = [r for r in records if r.offset < end]
                if not all(collect.offer(r.key, r.value) for r in wanted) or len(wanted) < len(records):
                    break
            if budget.hit:
                break
    finally:
        await stop_consumer(consumer)
    report.records = budget.read
    report.bound = budget.hit
    return report


def read_readings(
    target: Target,
    plan: ReadingsPlan,
    *,
    max_records: int = MAX_RECORDS,
    budget_s: float = BUDGET_S,
) -> tuple[Collector, ReadReport]:
    """The group's readings of ``plan`` (the collector) and what the read met (the report),
    within ``max_records`` records and ``budget_s`` seconds; see the module docstring. Runs
    its own event loop: call it from a thread that has none (a console refresh)."""
    collect = Collector(plan)
    budget = _Budget(max_records, budget_s)
    try:
        report = asyncio.run(asyncio.wait_for(_read(target, plan, collect, budget), budget_s + 5.0))
    except Exception as exc:  # the broker is down, slow or refuses: say so under the chart
        logger.warning("reading %s for the console failed: %r", plan.topic, exc)
        return collect, ReadReport(error=f"{plan.topic} could not be read ({type(exc).__name__}: {exc})")
    return collect, report
