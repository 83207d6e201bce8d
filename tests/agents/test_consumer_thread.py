"""agents.transport.WorkerConsumerThread: Faust's livelock check of each partition, every 2.5
commit intervals, read aiokafka's fetch position where there was none yet and crashed the worker
with a bare AssertionError (two workers, a source partition never written: the rebalance gave it
to a worker, which sought it to its start and waited, paused, for that reset)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.consumer.subscription_state import TopicPartitionState
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP

from agents.transport import WorkerConsumerThread

SOURCE = TP("events.logs", 1)


def test_the_livelock_check_skips_a_partition_waiting_for_its_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[TP] = []

    def faust_check(_self: object, _now: float, tp: TP) -> None:
        checked.append(tp)

    monkeypatch.setattr(AIOKafkaConsumerThread, "verify_event_path", faust_check)

    async def check() -> None:
        state = TopicPartitionState(assignment=None)
        state.seek(0)
        state.highwater = 5  # a fetch saw its end
        state.await_reset(1)  # seek_to_beginning: waiting for the fetcher to reset it
        with pytest.raises(AssertionError):
            _ = state.position  # what Faust's check reads
        consumer: Any = SimpleNamespace(
            _subscription=SimpleNamespace(
                subscription=SimpleNamespace(assignment=SimpleNamespace(state_value=lambda _tp: state))
            )
        )
        thread = object.__new__(WorkerConsumerThread)
        thread._ensure_consumer = lambda: consumer  # type: ignore[method-assign]
        thread.verify_event_path(0.0, SOURCE)
        assert checked == []  # skipped: nothing to check before it has a position
        state.reset_to(0)
        thread.verify_event_path(0.0, SOURCE)
        assert checked == [SOURCE]  # Faust's own check, once it has one

    asyncio.run(check())
