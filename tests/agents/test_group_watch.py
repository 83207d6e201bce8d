"""A rule worker whose consumer group routine dies stops, saying why, and its partitions go to
the other workers (agents.transport.RulesApp.watch_group).

The fault is injected into the worker's own process: a ``sitecustomize`` module, on the
worker's ``PYTHONPATH`` only, makes aiokafka's join fail inside its group routine once a file
exists, as Faust's assignor once failed there (agents/assignor.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest

from app.kafka.broker import KafkaBroker
from tests.agents.worker_helpers import PARTITIONS, keys_on, worker_env, worker_ready
from tests.kafka_helpers import produce, wait_for_json
from tests.procs import role, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RULES = """rules:
  - id: hot
    source: sensors
    group_by: [device_id]
    where: temperature >= 30
"""

#: the injected fault: aiokafka's join completes with an error once FAULT_FILE exists
FAULT = """
import os

from aiokafka.consumer import group_coordinator

_join_complete = group_coordinator.GroupCoordinator._on_join_complete


async def _failing(self, *args, **kwargs):
    if os.path.exists(os.environ["FAULT_FILE"]):
        raise RuntimeError("injected: the join fails in the group routine")
    return await _join_complete(self, *args, **kwargs)


group_coordinator.GroupCoordinator._on_join_complete = _failing
"""


def test_a_worker_whose_first_join_dies_in_its_group_routine_stops_and_the_other_reads_everything(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    """The second worker's first join fails in its group routine, as a static member's did on
    Faust's URL assertion. No fetch was waiting then for aiokafka to wake with the error, so
    Faust's fetcher never met it: the worker stayed, with no partition. Now it stops within
    seconds, non-zero, and the first worker reads every partition."""
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "hot.yaml").write_text(RULES)
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(FAULT)
    fault = tmp_path / "fault"
    fault.touch()
    env = worker_env(broker, tmp_path, rules_dir)
    path = os.pathsep.join(filter(None, [str(inject), env.get("PYTHONPATH", "")]))
    faulty = {**env, "PYTHONPATH": path, "FAULT_FILE": str(fault)}
    logs = [tmp_path / "w1.log", tmp_path / "w2.log"]
    with role(["agents", "worker", "-l", "info"], env, logs[0]) as first:
        wait_for(lambda: worker_ready(logs[0]), timeout_s=60, what="the first worker ready")
        with role(["agents", "worker", "-l", "info"], faulty, logs[1]) as second:
            try:
                code = second.wait(90)
            except subprocess.TimeoutExpired:
                pytest.fail("the worker whose group routine died ran on")
        second_log = logs[1].read_text(errors="replace")
        assert code != 0
        assert "Unexpected error in coordinator routine" in second_log  # aiokafka's: the fault
        assert "injected: the join fails in the group routine" in second_log
        assert "the worker's consumer group routine stopped" in second_log
        devices = [keys_on(p, "dev-")[0] for p in range(PARTITIONS)]
        values = [
            orjson.dumps({"device_id": d, "ts": "2026-03-01T00:00:00Z", "temperature": 31.0}) for d in devices
        ]
        produce(
            broker.bootstrap,
            "events.sensors",
            [(d.encode(), v) for d, v in zip(devices, values, strict=True)],
        )
        alerts = wait_for_json(broker.bootstrap, "alerts", len(devices), timeout_s=120, what="alerts")
        assert first.poll() is None, "the first worker runs"
    assert {a["labels"]["device_id"] for a in alerts} == set(devices), "every partition is read"
