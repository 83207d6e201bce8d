"""Kafka helpers against the real embedded broker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.kafka.broker import KafkaBroker
from app.kafka.clients import end_offsets
from app.runtime.settings import PROJECT_ROOT
from tests.conftest import reset_topics
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
