"""APP_PROCESSING_GUARANTEE without a broker: the setting, the commit hooks of each mode, and
where the outbox sends a partition's outputs (Faust's producer at least once, the partition's
transactional producer exactly once). The broker-level tests are in test_exactly_once.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agents.outbox import Outbox, commit_hooks
from agents.transactions import PartitionTransactions
from app.errors import ConfigError
from app.kafka.clients import CachedPartitioner
from app.runtime.settings import ENV_DOCS, Settings


def test_the_setting_defaults_to_at_least_once_and_is_validated(tmp_path: Path) -> None:
    assert ENV_DOCS["APP_PROCESSING_GUARANTEE"][0] == "at_least_once"
    assert not Settings.from_env({}).exactly_once
    assert Settings.from_env({"APP_PROCESSING_GUARANTEE": "Exactly_Once"}).exactly_once
    with pytest.raises(ConfigError, match="expected at_least_once or exactly_once"):
        Settings.from_env({"APP_PROCESSING_GUARANTEE": "exactly-once"})
    with pytest.raises(ConfigError, match="needs APP_KAFKA_IDEMPOTENCE=on"):
        Settings.from_env({"APP_PROCESSING_GUARANTEE": "exactly_once", "APP_KAFKA_IDEMPOTENCE": "off"})


def test_exactly_once_commits_without_the_flush_the_transactions_do_it() -> None:
    outbox = Outbox(SimpleNamespace(), CachedPartitioner())  # type: ignore[arg-type]

    async def flush() -> None: ...

    at_least_once = commit_hooks(outbox, [], flush)
    assert (len(at_least_once.snapshot), len(at_least_once.delivery)) == (2, 1)  # check, states; flush
    exactly_once = commit_hooks(outbox, [], flush, exactly_once=True)
    assert (len(exactly_once.snapshot), exactly_once.delivery) == (2, ())  # the transactions flush


class _FaustProducer:
    def __init__(self) -> None:
        self.aiokafka = object()

    def _ensure_producer(self) -> Any:
        return self.aiokafka


def test_the_outbox_sends_a_partitions_outputs_into_its_transaction() -> None:
    faust_producer = _FaustProducer()
    at_least_once = Outbox(SimpleNamespace(producer=faust_producer), CachedPartitioner())  # type: ignore[arg-type]
    assert at_least_once.producer_for(0) is faust_producer.aiokafka
    assert at_least_once.producer_for(3) is faust_producer.aiokafka

    transactions = PartitionTransactions("g", lambda tid: object())
    mine = {0: object(), 1: object()}
    transactions.producers = mine
    exactly_once = Outbox(
        SimpleNamespace(producer=faust_producer, transactions=transactions),  # type: ignore[arg-type]
        CachedPartitioner(),
    )
    with pytest.raises(RuntimeError, match="no open transaction"):
        exactly_once.producer_for(0)  # between a revocation's commit and the next assignment
    transactions.open = True
    assert exactly_once.producer_for(0) is mine[0] and exactly_once.producer_for(1) is mine[1]
    with pytest.raises(RuntimeError, match="not assigned"):
        exactly_once.producer_for(2)
    assert transactions.transactional_id(1) == "g-eos-1"
