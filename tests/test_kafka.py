"""Kafka helpers against the real embedded broker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from app.broker import EmbeddedBroker
from app.config import PROJECT_ROOT
from app.kafka import end_offsets
from tests.procs import wait_for

pytestmark = [pytest.mark.integration]


def test_end_offsets_count_every_record_even_in_multi_record_batches(broker: EmbeddedBroker) -> None:
    async def produce() -> None:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=50)
        await p.start()
        try:
            for n in (300, 50):  # two batches; Tansu's ListOffsets alone would say 301
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
        "from app.broker import EmbeddedBroker\n"
        "b = EmbeddedBroker().start()\n"
        f"open({str(pid_file)!r}, 'w').write(str(b.pid))\n"
        "time.sleep(60)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], cwd=PROJECT_ROOT, start_new_session=True)
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout_s=30, what="the broker's pid")
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
