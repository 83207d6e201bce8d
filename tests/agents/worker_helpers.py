"""Helpers of the rule-worker tests on the real broker: a role's environment, the real NAB
series as records, and the group's committed offsets."""

from __future__ import annotations

import asyncio
from itertools import islice
from pathlib import Path

import orjson
from aiokafka.structs import TopicPartition

from app.kafka.broker import KafkaBroker
from bench.worker_runs import committed_offsets as group_offsets
from ingest.adapters.nab import nab_events
from tests.conftest import NAB_MACHINE_TEMP, child_env, require_dataset

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
