"""Kafka helpers against the real embedded broker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.errors import BrokerError
from app.kafka.broker import KafkaBroker
from app.kafka.clients import commit_for_monitoring, end_offsets, read_to_end
from app.runtime.settings import PROJECT_ROOT
from app.topics import SENSORS
from tests.conftest import reset_topics
from tests.kafka_helpers import produce
from tests.procs import wait_for

pytestmark = [pytest.mark.integration]


def test_end_offsets_count_every_record_even_in_multi_record_batches(broker: KafkaBroker) -> None:
    async def produce() -> None:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=50)
        await p.start()
        try:
            for n in (300, 50):  # two multi-record batches
                futs = [await p.send("events.logs", value=b"x", partition=0) for _ in range(n)]
                await asyncio.gather(*futs)
            await (await p.send("events.logs", value=b"y", partition=1))
        finally:
            await p.stop()

    asyncio.run(produce())
    counts = asyncio.run(end_offsets(broker.bootstrap, ["events.logs", "events.finance", "no.such.topic"]))
    assert counts == {"events.logs": 351, "events.finance": 0, "no.such.topic": 0}


def test_the_embedded_broker_dies_with_its_owner_even_on_kill_9(tmp_path: Path) -> None:
    """A killed test run or `make run` must not leave a broker behind."""
    pid_file = tmp_path / "pid"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from app.kafka.broker import KafkaBroker\n"
        f"b = KafkaBroker(Path({str(tmp_path / 'kafka')!r})).start()\n"
        f"open({str(pid_file)!r}, 'w').write(str(b.pid))\n"
        "time.sleep(60)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], cwd=PROJECT_ROOT, start_new_session=True)
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout_s=120, what="the broker's pid")
        broker_pid = int(pid_file.read_text())
        assert Path(f"/proc/{broker_pid}").exists()
        owner.kill()
        owner.wait(10)
        wait_for(lambda: not _alive(broker_pid), timeout_s=10, what="the orphaned broker to exit")
    finally:
        if owner.poll() is None:
            owner.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_a_reset_forgets_committed_offsets(broker: KafkaBroker) -> None:
    """The per-test reset (tests/conftest.py) leaves no committed offset behind: a group that
    committed before the reset starts from the beginning after it."""

    async def commit_then_read_position() -> tuple[int | None, int | None]:
        tp = TopicPartition("events.logs", 0)
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await p.start()
        await (await p.send("events.logs", value=b"x", partition=0))
        await p.stop()
        c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="g-reset", enable_auto_commit=False)
        await c.start()
        c.assign([tp])
        await c.commit({tp: 1})
        before = await c.committed(tp)
        await c.stop()
        await reset_topics(broker.bootstrap)
        c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="g-reset", enable_auto_commit=False)
        await c.start()
        after = await c.committed(tp)
        await c.stop()
        return before, after

    assert asyncio.run(commit_then_read_position()) == (1, None)


def empty_polls(monkeypatch: pytest.MonkeyPatch, empty: Callable[[int], bool]) -> list[int]:
    """Make the ``n``-th ``getmany`` of every consumer bring nothing when ``empty(n)`` (from 1):
    a fetch that a starved host or a busy broker answers after the poll's timeout."""
    real, calls = AIOKafkaConsumer.getmany, [0]

    async def getmany(self: AIOKafkaConsumer, *tps: TopicPartition, **kw: Any) -> Any:
        calls[0] += 1
        if empty(calls[0]):
            await asyncio.sleep(kw.get("timeout_ms", 0) / 1000)
            return {}
        return await real(self, *tps, **kw)

    monkeypatch.setattr(AIOKafkaConsumer, "getmany", getmany)
    return calls


def test_a_topic_backtest_reads_past_a_poll_that_brings_nothing(
    broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Faust engine's topic backtest ended its read at the first empty poll, and went on
    with a part of the topic as if it were all of it."""
    from app.backtest import read_topics

    records = [(f"d{i % 7}".encode(), b'{"n": %d}' % i) for i in range(600)]
    produce(broker.bootstrap, SENSORS, records)
    calls = empty_polls(monkeypatch, lambda n: n == 1)
    got = asyncio.run(read_topics(broker.bootstrap, [SENSORS]))
    assert calls[0] >= 2
    assert sorted(v for *_, v in got) == sorted(v for _, v in records)


def test_a_read_to_the_end_that_stalls_says_where_each_partition_stands(
    broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    produce(broker.bootstrap, SENSORS, [(b"k", b"x")] * 10)
    empty_polls(monkeypatch, lambda _n: True)

    async def read() -> list[object]:
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed")
        await consumer.start()
        try:
            tps = [TopicPartition(SENSORS, p) for p in (0, 1)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            return [r async for r in read_to_end(consumer, ends, stall_s=0.5, poll_ms=100)]
        finally:
            await consumer.stop()

    with pytest.raises(
        BrokerError, match=r"no record came for 0.5 s before the end of events\.sensors:\d at 0 of 10"
    ):
        asyncio.run(asyncio.wait_for(read(), 30))


class _CoordinatorGone:
    """A consumer whose commit waits for a group coordinator that never answers, as aiokafka's
    does once the broker is gone."""

    def __init__(self) -> None:
        self.asked: list[dict[TopicPartition, int]] = []

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.asked.append(offsets)
        await asyncio.Event().wait()


def test_a_commit_for_monitoring_gives_up_in_its_time_and_skips_nothing_to_commit() -> None:
    consumer = _CoordinatorGone()
    tp = TopicPartition(SENSORS, 0)

    async def main() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        done = await commit_for_monitoring(consumer, {tp: 5}, timeout_s=0.2)  # type: ignore[arg-type]
        return done, loop.time() - started

    done, took = asyncio.run(asyncio.wait_for(main(), 10))
    assert not done and took < 5 and consumer.asked == [{tp: 5}]
    assert not asyncio.run(commit_for_monitoring(consumer, {}))  # type: ignore[arg-type]
    assert len(consumer.asked) == 1  # aiokafka refuses an empty commit: none is made
