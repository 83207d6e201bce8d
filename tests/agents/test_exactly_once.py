"""Exactly-once in the rule worker (``APP_PROCESSING_GUARANTEE=exactly_once``) on the real broker.

A kill -9 of the worker in the middle of a replay of the real NAB series, caught with a
transaction open: after a restart, the committed ``alerts`` hold every alert id exactly once
and the same ids as the backtest, and the regroup topic holds every regrouped event exactly
once, while the aborted transaction's records are still in the log, invisible to
``read_committed`` readers. The at-least-once path is the one every other worker test runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from agents.topics import regroup_topic
from app.alerts import Alert
from app.backtest import BacktestReport, backtest, read_events
from app.kafka.broker import KafkaBroker
from app.kafka.clients import topic_records
from app.placement import partition_for
from app.rules.loader import load_rules
from app.runtime.settings import PROJECT_ROOT
from app.topics import ALERTS, SENSORS
from bench.worker_runs import committed_offsets as group_offsets
from tests.agents.worker_helpers import WORKER_GROUP, committed_offsets, consumed, nab_lines, role_env
from tests.procs import role, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PARTITIONS = 2
#: two machines reporting the same real series, one per partition of the source topic and, swapped,
#: one per partition of the regroup topic, so each partition's input comes from one partition
#: (as in the backtest, whatever the interleaving): checked in the test
DEVICES = ("machine-temp-1", "machine-temp-7")
REGROUP = regroup_topic("sensors")
#: rules grouped by other fields than the topic key: every event is re-keyed to the regroup
#: topic, a second hop whose records are outputs of the first. ``crowded-hours`` counts every
#: reading: the series has 12 an hour, so one counted twice gives an alert the backtest lacks
REGROUPED_RULE = """rules:
  - id: hot-hours
    description: Hours with six or more readings above 90 (regrouped by device and kind)
    source: sensors
    where: temperature > 90
    group_by: [device_id, kind]
    window: {type: tumbling, size: 1h}
    aggregate: {n: count(*)}
    having: n >= 6
  - id: crowded-hours
    description: Hours with more than 12 readings (one every 5 minutes is 12)
    source: sensors
    group_by: [device_id, kind]
    window: {type: tumbling, size: 1h}
    aggregate: {n: count(*)}
    having: n > 12
"""
CHUNK = 1000  # records per produce call while replaying: the replay takes several seconds


def rules_dir(tmp_path: Path) -> Path:
    """The shipped rule packs plus :data:`REGROUPED_RULE`."""
    rules = tmp_path / "rules"
    rules.mkdir()
    for pack in (PROJECT_ROOT / "rules").glob("*.yaml"):
        shutil.copy(pack, rules / pack.name)
    (rules / "regrouped.yaml").write_text(REGROUPED_RULE)
    return rules


def replay_and_backtest(tmp_path: Path) -> tuple[list[tuple[bytes, bytes]], Path, list[Alert]]:
    """The replay (the whole real series of both machines, ~22,700 readings each, reporting
    together, as ``(key, value)`` records), the rules directory, and the alerts a backtest of
    that replay raises."""
    series = {d: nab_lines(None, device=d) for d in DEVICES}
    pairs = zip(*series.values(), strict=True)
    records = [(d.encode(), v) for pair in pairs for d, v in zip(DEVICES, pair, strict=True)]
    rules = rules_dir(tmp_path)
    report = BacktestReport()
    with (tmp_path / "expected.jsonl").open("w") as out:
        expected = backtest(load_rules([rules]), read_events([v for _, v in records], "nab", report), out,
                            report, partitions=PARTITIONS)  # fmt: skip
    return records, rules, expected


async def _freeze_in_transaction(bootstrap: str, topic: str, pid: int, timeout_s: float) -> bool:
    """Stop (SIGSTOP) the worker's process group at a moment some partition of ``topic`` has an
    open transaction holding records: its last stable offset (what read_committed sees) below its
    high watermark. Seeing one and then killing is a race: the worker may commit it in between
    (a CI run lost it once). So: see one, stop the worker, let its requests in flight land, and
    keep it stopped only if the transaction is still open and the log no longer moves; else let
    it go on and try again. False if no such moment came within ``timeout_s``."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    committed = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    everything = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await committed.start()
    await everything.start()

    async def open_ends() -> dict[TopicPartition, tuple[int, int]]:
        stable, high = await asyncio.gather(committed.end_offsets(tps), everything.end_offsets(tps))
        return {tp: (stable[tp], high[tp]) for tp in tps if stable[tp] < high[tp]}

    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not await open_ends():
                await asyncio.sleep(0.01)
                continue
            os.killpg(pid, signal.SIGSTOP)
            await asyncio.sleep(0.5)  # a commit already sent completes without the worker
            settled = await open_ends()
            await asyncio.sleep(0.3)
            if settled and await open_ends() == settled:
                return True
            os.killpg(pid, signal.SIGCONT)
        return False
    finally:
        await committed.stop()
        await everything.stop()


def read_all(bootstrap: str, topic: str, isolation_level: str) -> list[Any]:
    """Every record of ``topic`` that a reader with ``isolation_level`` gets, to the end of each partition."""

    async def run() -> list[Any]:
        return [r async for r in topic_records(bootstrap, [topic], isolation_level=isolation_level)]

    return asyncio.run(run())


async def replay_and_kill(
    bootstrap: str, records: list[tuple[bytes, bytes]], pid: int, *, transaction: bool = True
) -> int:
    """Replay ``records`` to the sensors topic in chunks; once a quarter of them is committed
    (and, with ``transaction``, the worker is stopped with a transaction holding records open on
    the regroup topic, to which every event is regrouped), kill -9 the worker (process group
    ``pid``), and finish the replay. Returns how many were sent at the kill. One event loop, no
    thread: the test process stays single-threaded."""
    sent = 0

    async def replay() -> None:
        nonlocal sent
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            for start in range(0, len(records), CHUNK):
                chunk = records[start : start + CHUNK]
                await asyncio.gather(*[await producer.send(SENSORS, v, key=k) for k, v in chunk])
                sent = start + len(chunk)
                await asyncio.sleep(0.1)  # ~5 s of replay
        finally:
            await producer.stop()

    task = asyncio.create_task(replay())
    try:
        deadline = time.monotonic() + 60
        while await committed_total(bootstrap, SENSORS) < len(records) // 4:
            assert time.monotonic() < deadline and not task.done(), "a quarter of the replay not committed"
            await asyncio.sleep(0.1)
        if transaction:
            assert await _freeze_in_transaction(bootstrap, REGROUP, pid, 20), "no open transaction caught"
        os.killpg(pid, signal.SIGKILL)
        killed_at = sent
    finally:
        await asyncio.wait_for(task, 120)
    return killed_at


def forwards(records: list[Any]) -> list[Any]:
    """The forwarded events of regroup records, without the source partitions' progress
    markers (``agents.merge.RegroupMerge``)."""
    return [r for r in records if "m" not in orjson.loads(r.value)]


async def committed_total(bootstrap: str, topic: str) -> int:
    return sum(n for tp, n in (await group_offsets(bootstrap, WORKER_GROUP)).items() if tp.topic == topic)


def test_a_kill_9_mid_replay_leaves_every_alert_committed_once(broker: KafkaBroker, tmp_path: Path) -> None:
    assert {partition_for(d.encode(), PARTITIONS) for d in DEVICES} == set(range(PARTITIONS))
    assert {partition_for(f"{d}\x1f".encode(), PARTITIONS) for d in DEVICES} == set(range(PARTITIONS))
    records, rules, expected = replay_and_backtest(tmp_path)
    assert len(expected) > 500 and len({a.alert_id for a in expected}) == len(expected)

    env = role_env(broker, tmp_path, APP_RULES_DIR=str(rules), APP_PROCESSING_GUARANTEE="exactly_once")
    log1, log2 = tmp_path / "w1.log", tmp_path / "w2.log"
    with role(["agents", "worker", "-l", "info"], env, log1) as w1:
        wait_for(lambda: "Worker ready" in log1.read_text(errors="replace"), 60, what="worker ready")
        killed_at = asyncio.run(replay_and_kill(broker.bootstrap, records, w1.pid))
        w1.wait(10)
    assert killed_at < len(records), "the replay ended before the kill"
    assert "transactional producers started" in log1.read_text(errors="replace")

    with role(["agents", "worker", "-l", "info"], env, log2):
        wait_for(lambda: consumed(broker.bootstrap, [SENSORS, REGROUP]), 90, what="the input consumed")
        alerts = [orjson.loads(r.value) for r in read_all(broker.bootstrap, ALERTS, "read_committed")]
    # every alert id once, and the backtest's
    ids = Counter(a["alert_id"] for a in alerts)
    assert [i for i, n in ids.items() if n > 1] == []
    assert set(ids) == {a.alert_id for a in expected}
    assert len(alerts) == len(expected)
    # every regrouped event once: the regroup topic is an output too
    regrouped = forwards(read_all(broker.bootstrap, REGROUP, "read_committed"))
    assert len(regrouped) == len(records)
    # the killed worker's open transaction is in the log, aborted: a read_uncommitted reader sees more
    assert len(forwards(read_all(broker.bootstrap, REGROUP, "read_uncommitted"))) > len(regrouped)
    log = log2.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def test_at_least_once_a_kill_9_mid_replay_sends_only_the_backtests_alerts(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    """At least once, the same kill -9: the restarted worker reads again what was not committed,
    from the states of the last commit, which count exactly the batches its offsets cover. So
    every alert sent is one of the backtest's, byte for byte (some twice: receivers dedup by
    id), and none is missing. The regrouped rule too: the restarted worker forwards the replayed
    events to the regroup topic a second time, beside the first copies, which were delivered
    but not committed there either; the regroup side drops the copies
    (``agents.wiring.first_forwards``), which it counted twice before."""
    records, rules, expected = replay_and_backtest(tmp_path)
    want = {a.alert_id: orjson.loads(a.to_json()) for a in expected}
    assert len(want) > 500
    assert sum(a.rule_id == "hot-hours" for a in expected) > 50

    env = role_env(broker, tmp_path, APP_RULES_DIR=str(rules), APP_PROCESSING_GUARANTEE="at_least_once")
    log1, log2 = tmp_path / "w1.log", tmp_path / "w2.log"
    with role(["agents", "worker", "-l", "info"], env, log1) as w1:
        wait_for(lambda: "Worker ready" in log1.read_text(errors="replace"), 60, what="worker ready")
        killed_at = asyncio.run(replay_and_kill(broker.bootstrap, records, w1.pid, transaction=False))
        w1.wait(10)
    assert killed_at < len(records), "the replay ended before the kill"
    with role(["agents", "worker", "-l", "info"], env, log2):
        wait_for(lambda: consumed(broker.bootstrap, [SENSORS, REGROUP]), 90, what="the input consumed")
        time.sleep(2)  # the last commit's alerts reach the topic before its offsets
        sent = [orjson.loads(r.value) for r in read_all(broker.bootstrap, ALERTS, "read_uncommitted")]
    got: dict[str, list[dict[str, Any]]] = {}
    for a in sent:
        got.setdefault(a["alert_id"], []).append(a)
    assert set(got) == set(want), "every alert of the backtest, and no other"
    differ = {i: (copies, want[i]) for i, copies in got.items() if any(c != want[i] for c in copies)}
    assert not differ, f"{len(differ)} alerts differ from the backtest's, e.g. {next(iter(differ.items()))}"


def test_the_new_owner_of_a_partition_fences_the_previous_one(broker: KafkaBroker) -> None:
    """The zombie story at the producers' level: worker A owns partition 0 and has a transaction
    open when worker B is given partition 0 (A was paused past its session, say). B's producer
    starts with the same transactional id, which aborts A's open transaction; A's commit then
    fails (fenced), and readers see B's records only."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    from agents.transactions import PartitionTransactions

    def new_producer(tid: str) -> AIOKafkaProducer:
        return AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=tid, acks="all")

    async def run() -> None:
        a = PartitionTransactions("g-zombie", new_producer)
        b = PartitionTransactions("g-zombie", new_producer)
        try:
            await a.assign({0, 1})
            await (await a.producer(0).send(ALERTS, b"from-a", key=b"k", partition=0))
            await b.assign({0})  # fences a's producer of partition 0, aborting its transaction
            await (await b.producer(0).send(ALERTS, b"from-b", key=b"k", partition=0))
            with pytest.raises(KafkaError):
                await a.commit({TopicPartition(SENSORS, 0): 10}, begin=False)
            assert a.failed is not None
            await b.commit({TopicPartition(SENSORS, 0): 20}, begin=True)
        finally:
            await a.close()
            await b.close()

    asyncio.run(run())
    values = [r.value for r in read_all(broker.bootstrap, ALERTS, "read_committed")]
    assert values == [b"from-b"]
    assert committed_offsets(broker.bootstrap, "g-zombie") == {TopicPartition(SENSORS, 0): 20}
