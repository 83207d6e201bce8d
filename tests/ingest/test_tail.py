"""The tailer against the real broker: restarts across rotation lose and repeat nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from app import topics
from app.kafka.broker import KafkaBroker
from app.runtime.settings import PROJECT_ROOT, Settings
from ingest.tail.state import load_state
from ingest.tail.tailer import TailOptions, tail
from tests.conftest import child_env
from tests.ingest.conftest import stop_task, until_count
from tests.kafka_helpers import consume_json

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _line(i: int) -> str:
    return f"[INFO] [req-{i}] [2024/05/01 12:00:00 {i % 1000:03d}] [Api {i}] seq={i}\n"


def _append(path: Path, first: int, last: int) -> None:
    with open(path, "a") as f:
        f.write("".join(_line(i) for i in range(first, last)))


def _seqs(bootstrap: str, n: int) -> Counter[int]:
    events = consume_json(bootstrap, topics.LOGS, min_count=n, timeout_s=15)
    return Counter(int(e["message"].split("seq=")[1].split("\n")[0]) for e in events)


def _opts(log: Path, tmp_path: Path) -> TailOptions:
    return TailOptions(
        str(log), "applog", tmp_path / "tail.state", host="app-1", poll_interval_s=0.05, rotate_wait_s=0.2,
        multiline_wait_s=0.2, save_interval_s=0.1,
    )  # fmt: skip


async def _run_until(settings: Settings, opts: TailOptions, total: int) -> dict[str, object]:
    stop = asyncio.Event()
    task = asyncio.create_task(tail(settings, opts, stop))
    await until_count(settings.bootstrap_servers, topics.LOGS, total)
    summary = await stop_task(stop, task)
    return orjson.loads(summary.to_json())


@pytest.mark.timeout(60)
def test_restart_with_rotation_while_stopped_loses_and_repeats_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "app.log"
    _append(log, 0, 300)
    first = asyncio.run(_run_until(settings, _opts(log, tmp_path), 300))
    assert (first["published"], first["dlq"], first["failed"]) == (300, 0, 0)
    assert load_state(tmp_path / "tail.state") is not None

    _append(log, 300, 350)  # written to the old file after the tailer stopped
    os.rename(log, tmp_path / "app.log.1")
    _append(log, 350, 400)  # the new file
    second = asyncio.run(_run_until(settings, _opts(log, tmp_path), 400))

    assert second["published"] == 100
    seqs = _seqs(settings.bootstrap_servers, 400)
    assert sorted(seqs) == list(range(400))
    assert set(seqs.values()) == {1}, "a line was published twice"


@pytest.mark.timeout(60)
def test_stack_traces_join_and_bad_lines_go_to_the_dlq_with_their_offset(
    settings: Settings, tmp_path: Path
) -> None:
    log = tmp_path / "app.log"
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad\n'
    log.write_text(_line(0) + trace + "not a log line\n" + _line(1))
    summary = asyncio.run(_run_until(settings, _opts(log, tmp_path), 2))

    assert (summary["published"], summary["dlq"]) == (2, 1)
    events = consume_json(settings.bootstrap_servers, topics.LOGS, min_count=2)
    assert events[0]["message"] == "seq=0\n" + trace.rstrip("\n")
    assert events[0]["request_id"] == "req-0"
    (dead,) = consume_json(settings.bootstrap_servers, topics.DLQ, min_count=1)
    offset = len((_line(0) + trace).encode())
    assert dead["reason"].startswith(f"{log} byte {offset}: expected [LEVEL]")
    assert dead["raw"] == "not a log line"


@pytest.mark.timeout(90)
def test_kill_9_then_restart_loses_nothing_and_sigterm_prints_the_summary(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    log, state = tmp_path / "app.log", tmp_path / "tail.state"
    _append(log, 0, 3000)
    env = child_env(KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap)
    args = [sys.executable, "-m", "ingest", "tail", str(log), "--format", "applog", "--host", "app-1",
            "--state", str(state), "--poll", "0.05"]  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    proc = start()
    try:
        asyncio.run(until_count(broker.bootstrap, topics.LOGS, 500, timeout_s=30))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    _append(log, 3000, 3100)
    proc = start()
    try:
        asyncio.run(until_count(broker.bootstrap, topics.LOGS, 3100, timeout_s=30))
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    summary = orjson.loads(stdout.splitlines()[-1])
    assert (summary["adapter"], summary["topic"], summary["failed"]) == ("tail-applog", topics.LOGS, 0)
    seqs = _seqs(broker.bootstrap, 3100)
    assert sorted(seqs) == list(range(3100)), "a line was lost"
    saved = load_state(state)
    assert saved is not None and saved.offset == log.stat().st_size
