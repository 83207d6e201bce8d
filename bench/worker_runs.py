"""Benchmark runs of a worker subprocess: its throughput from its progress, and its metrics.

Used by ``bench_rules.py`` and ``latency_runs.py``. Every function here is bounded: a
worker process is terminated (then killed) when its ``with`` block ends, and every wait
has a deadline. Times are on this host's clock; the broker, the worker and this process
share its CPUs, so the figures include that contention.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from app.kafka.clients import end_offsets, topic_records

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


def cpu_seconds(pid: int) -> float:
    """The user and system CPU seconds of process ``pid`` so far (its own, not its children's;
    Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    timeout_s: float = 60.0,
    outputs: Callable[[], float] | None = None,
) -> Progress:
    """Start a worker and measure its events/s through a pre-filled topic.

    ``progress`` returns a count that grows with the events handled (an output
    topic's end offset, or a worker counter). The rate runs from its first
    non-zero reading (start-up and group join excluded) until it reaches
    ``expect``; if the worker exits or ``timeout_s`` passes first, the rate so
    far, with ``done`` false (0.0 when nothing was handled). ``outputs``: an output topic's
    end offset; once ``expect`` is reached the worker runs on until it stops growing
    (:func:`settle`), so its last outputs are out before it is stopped.
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
                if outputs is not None:
                    settle(outputs)
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


async def read_all(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed record value of ``topic``, from its start to its end as of now. Read
    committed: under exactly-once an aborted transaction's alerts reached no reader (and its
    markers take offsets, so the count of values never reaches the end offset)."""
    return [r.value async for r in topic_records(bootstrap, [topic]) if r.value is not None]


async def create_topics(bootstrap: str, topics: dict[str, tuple[int, dict[str, str]]]) -> None:
    """Create each topic (name: partitions, topic configs) before ``ensure_topics`` would create
    it without configs: the bench's own settings of some of the app's topics."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, n, 1, topic_configs=c) for name, (n, c) in topics.items()])
    finally:
        await admin.close()


async def fill_many(bootstrap: str, records: list[tuple[str, bytes, bytes]]) -> None:
    """Produce ``(topic, key, value)`` records in order and wait for every ack."""
    await wait_for_leaders(bootstrap, {topic for topic, _k, _v in records})
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=512 * 1024)
    await p.start()
    try:
        futs = [await p.send(topic, v, key=k) for topic, k, v in records]
        await asyncio.gather(*futs)
    finally:
        await p.stop()


async def committed_offsets(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    """The offsets ``group`` has committed (a transactional commit once its transaction commits)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp: meta.offset for tp, meta in found.items() if meta.offset >= 0}


async def close_probe(
    stop: asyncio.Event, reader: asyncio.Task[None], producer: AIOKafkaProducer, consumer: AIOKafkaConsumer
) -> None:
    """End a paced run: stop its reader task (2 s to finish, then cancelled; its failure is
    printed), then its producer and consumer."""
    stop.set()
    await asyncio.wait({reader}, timeout=2)
    if reader.done() and not reader.cancelled() and reader.exception() is not None:
        print(f"the reader failed: {reader.exception()!r}")
    reader.cancel()
    await producer.stop()
    await consumer.stop()


async def wait_for_leaders(bootstrap: str, topics: Iterable[str], timeout_s: float = 30.0) -> None:
    """Return once each of ``topics`` has a leader for every partition in the broker's metadata
    (at most ``timeout_s``): a produce right after ``create_topics`` may otherwise find the topic
    missing."""
    wanted = set(topics)
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            cluster = await client.fetch_all_metadata()
            if all(
                cluster.partitions_for_topic(t)
                and cluster.available_partitions_for_topic(t) == cluster.partitions_for_topic(t)
                for t in wanted
            ):
                return
            await asyncio.sleep(0.1)
    finally:
        await client.close()


def settle(progress: Callable[[], float], quiet_s: float = 1.0, timeout_s: float = 15.0) -> None:
    """Return once ``progress`` (an output topic's end offset) has not grown for ``quiet_s``, at
    most ``timeout_s``: a worker's last outputs may still be on their way when its input count
    is reached."""
    last, since, deadline = progress(), time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(POLL_S)
        now = progress()
        if now != last:
            last, since = now, time.monotonic()


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


# -- a worker's histograms and percentiles --------------------------------------------------------


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
