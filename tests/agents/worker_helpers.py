"""Helpers of the rule-worker tests: a role's environment, the real NAB series as records, the
group's committed offsets, whether /metrics answers, the state API's answers, and a stand-in
for a Faust table."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
from aiokafka.structs import TopicPartition

from agents.transport import committed_ends
from app.kafka.broker import KafkaBroker
from app.placement import partition_for
from bench.worker_runs import committed_offsets as group_offsets
from ingest.adapters.nab import nab_events
from tests.conftest import NAB_MACHINE_TEMP, child_env, require_dataset
from tests.procs import http_ok

#: the rule worker's consumer group (its Faust app id)
WORKER_GROUP = "streamalert-rules"


def role_env(broker: KafkaBroker, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a role under test against ``broker`` (the fixture's 2 partitions)."""
    return child_env(
        KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
        APP_DATA_DIR=str(tmp_path / "data"),
        APP_PARTITIONS="2",
        **extra,
    )


def nab_lines(n: int | None = None, device: str = "machine-temp-1") -> list[bytes]:
    """The first ``n`` readings (all: None) of the real NAB machine-temperature series, as
    ``device``'s sensor events (JSON)."""
    path = require_dataset(NAB_MACHINE_TEMP)
    rows = list(islice(nab_events(str(path), device=device, field="temperature"), n))
    assert all(isinstance(r, dict) for r in rows)
    return [orjson.dumps(r) for r in rows]


def committed_offsets(bootstrap: str, group: str = WORKER_GROUP) -> dict[TopicPartition, int]:
    """The offsets ``group`` has committed (transactional commits once their transaction commits)."""
    return asyncio.run(group_offsets(bootstrap, group))


def consumed(bootstrap: str, topics: list[str], partitions: int = 2) -> bool:
    """The worker group committed offsets past every committed record of ``topics`` (the
    fixture's 2 partitions each)."""
    done = committed_offsets(bootstrap)
    tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
    ends = asyncio.run(committed_ends(bootstrap, tps))
    return all(done.get(tp, 0) >= end for tp, end in ends.items())


#: the worker's rule-state table's changelog topic (of the sensors source)
TOPIC = "streamalert-rules-rule-state-sensors-changelog"

#: the broker fixture's partition count, which the worker tests run their workers with
PARTITIONS = 2


def keys_on(partition: int, prefix: str, count: int = 1) -> list[str]:
    """The first ``count`` keys ``<prefix><n>`` that Kafka's partitioner puts on ``partition`` (of
    :data:`PARTITIONS`)."""
    names = (f"{prefix}{i}" for i in range(1000))
    return [k for k in names if partition_for(k.encode(), PARTITIONS) == partition][:count]


def worker_ready(log: Path, count: int = 1) -> bool:
    """Whether the worker logging to ``log`` said "Worker ready" ``count`` times (once per start)."""
    return log.exists() and log.read_text(errors="replace").count("Worker ready") >= count


def fake_table(data: dict[str, Any] | None = None) -> Any:
    """What TableStore uses of a Faust table: its name, its changelog topic's name and its
    memory store's dict (``table.data.data``)."""
    return SimpleNamespace(
        name="rule-state-sensors",
        changelog_topic=SimpleNamespace(
            get_topic_name=lambda: "streamalert-rules-rule-state-sensors-changelog"
        ),
        data=SimpleNamespace(data={} if data is None else data),
    )


def worker_env(broker: KafkaBroker, tmp_path: Path, rules_dir: Path) -> dict[str, str]:
    """The rule worker's environment against ``broker``, with the rules of ``rules_dir``."""
    return child_env(
        KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
        APP_DATA_DIR=str(tmp_path / "data"),
        APP_PARTITIONS=str(PARTITIONS),
        APP_RULES_DIR=str(rules_dir),
    )


def metrics_answer(port: int) -> bool:
    """Whether a role's /metrics endpoint on ``port`` answers 200."""
    return http_ok(f"http://127.0.0.1:{port}/metrics")


def state_get(url: str, token: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    """A worker's state API (``agents.state_server``) at ``url``, asked with ``token``: the
    status code, the JSON body and the headers, an error's included."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, orjson.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read() or b"{}"), dict(exc.headers)
