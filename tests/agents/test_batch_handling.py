"""agents.transport: a batch handler's call and the offsets it covers go together, even when a
stop cancels the fetch loop while the handler awaits (it sends its outputs after it has changed
the states); a batch that cannot finish keeps every later commit from writing the states."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from agents import transport
from agents.transport import BatchConsumer

SOURCE = TP("events.sensors", 1)


def records(*offsets: int) -> list[Any]:
    return [SimpleNamespace(offset=o, timestamp=0) for o in offsets]


def consumer(hooks: list[str]) -> BatchConsumer:
    """A BatchConsumer with only what handling batches and an at-least-once commit use (no Faust
    app); its commit hooks append their names to ``hooks``."""
    c = object.__new__(BatchConsumer)
    c.app = SimpleNamespace(
        consumer_generation_id=1, batch_size=500, monitor=None,
        commit_snapshot=(lambda: hooks.append("snapshot"),),
        commit_delivery=(lambda: hooks.append("delivery"),),
    )  # fmt: skip
    c.flow_active = True
    c._stopped, c._crashed = asyncio.Event(), asyncio.Event()
    c._read_offset, c._acked, c._batch_acked = defaultdict(lambda: None), {}, {}
    c._buffered_partitions = set()
    c._committed_offset = defaultdict(lambda: None)
    return c


def deliver(c: BatchConsumer, handlers: dict[str, Any], fetched: dict[TP, list[Any]]) -> Any:
    """What the fetch loop does with a fetch's records: hand them to the batch agents' handlers."""
    c.app.batch_handlers = handlers
    return c._deliver(fetched, None)


def test_a_stop_that_cancels_the_fetch_loop_mid_batch_lets_the_batch_finish() -> None:
    """The handler counted the batch in the states, then waited on the producer's queue as the
    stop cancelled the fetch loop. Before, its offsets were never taken as handled while the
    states it changed were written by the stop's commit: the restart counted it twice."""
    steps: list[str] = []

    async def scenario() -> BatchConsumer:
        c = consumer([])
        sent = asyncio.Event()

        async def handler(tp: TP, batch: list[Any]) -> None:
            steps.append("counted")  # the states change
            await sent.wait()  # the outputs' send waits for the partition's queue
            steps.append("sent")

        fetch = asyncio.ensure_future(deliver(c, {SOURCE.topic: handler}, {SOURCE: records(0, 1, 2)}))
        await asyncio.sleep(0.01)
        assert steps == ["counted"]
        fetch.cancel()  # the stop: Faust's Fetcher cancels the task of its fetch loop
        await asyncio.sleep(0.01)
        assert not fetch.done()  # waiting for the batch, not gone
        sent.set()
        with pytest.raises(asyncio.CancelledError):
            await fetch
        return c

    c = asyncio.run(scenario())
    assert steps == ["counted", "sent"]
    assert c._batch_acked == {SOURCE: 3}  # the commit at the stop covers the batch the states count
    assert c._torn is None


def test_a_round_cancelled_mid_way_finishes_and_takes_every_partition_as_handled() -> None:
    p0 = TP("events.sensors", 0)
    steps: list[str] = []

    async def scenario() -> BatchConsumer:
        c = consumer([])
        c.assignment = lambda: {p0, SOURCE}
        c._merges = {}
        sent = asyncio.Event()

        async def handler(parts: list[tuple[TP, list[Any]]]) -> None:
            steps.append(f"counted {sorted(tp.partition for tp, _ in parts)}")
            await sent.wait()

        c.app.round_handlers = {SOURCE.topic: handler}
        fetch = asyncio.ensure_future(c._deliver({p0: records(0), SOURCE: records(0, 1)}, None))
        await asyncio.sleep(0.01)
        fetch.cancel()
        await asyncio.sleep(0.01)
        sent.set()
        with pytest.raises(asyncio.CancelledError):
            await fetch
        return c

    c = asyncio.run(scenario())
    assert steps == ["counted [0, 1]"]
    assert c._batch_acked == {p0: 1, SOURCE: 2}


def test_a_batch_that_does_not_finish_after_the_stop_keeps_the_states_unwritten(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Memory then counts part of a batch no offset covers: the stop's commit writes neither
    the states nor the offsets, and the restart reads again from the last commit."""
    monkeypatch.setattr(transport, "FINISH_BATCH_S", 0.05)
    hooks: list[str] = []

    async def scenario() -> tuple[BatchConsumer, bool]:
        c = consumer(hooks)
        c._batch_acked = {TP("events.sensors", 0): 7}  # an earlier batch, not committed yet

        async def handler(tp: TP, batch: list[Any]) -> None:
            await asyncio.Event().wait()  # a broker that never answers

        fetch = asyncio.ensure_future(deliver(c, {SOURCE.topic: handler}, {SOURCE: records(0)}))
        await asyncio.sleep(0.01)
        fetch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fetch
        return c, await c._commit_at_least_once(start_new_transaction=False, always=True)

    c, committed = asyncio.run(scenario())
    assert committed is False and hooks == []
    assert SOURCE not in c._batch_acked
    assert "a batch did not finish within 0 s of the stop" in caplog.text


def test_a_handler_that_fails_keeps_the_states_unwritten() -> None:
    hooks: list[str] = []

    async def scenario() -> bool:
        c = consumer(hooks)

        async def handler(tp: TP, batch: list[Any]) -> None:
            raise RuntimeError("a rule's bug, half-way through a batch")

        with pytest.raises(RuntimeError, match="half-way"):
            await deliver(c, {SOURCE.topic: handler}, {SOURCE: records(0, 1)})
        return await c._commit_at_least_once(start_new_transaction=False, always=True)

    assert asyncio.run(scenario()) is False
    assert hooks == []


def test_a_batch_that_finishes_is_committed_with_its_states(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard: without a stop, the handled batch's offsets and the states go out together."""
    hooks: list[str] = []
    committed: list[dict[TP, int]] = []

    async def commit_offsets(self: Any, offsets: dict[TP, int], start_new_transaction: bool = True) -> bool:
        committed.append(dict(offsets))
        return True

    async def nothing_attached(self: Any, offsets: Any) -> None:
        return None

    monkeypatch.setattr(transport.Consumer, "_commit_offsets", commit_offsets)  # Faust's: to the broker
    monkeypatch.setattr(transport.Consumer, "_handle_attached", nothing_attached)

    async def scenario() -> bool:
        c = consumer(hooks)

        async def handler(tp: TP, batch: list[Any]) -> None:
            await asyncio.sleep(0)

        await deliver(c, {SOURCE.topic: handler}, {SOURCE: records(4, 5)})
        return await c._commit_at_least_once(start_new_transaction=False)

    assert asyncio.run(scenario()) is True
    assert hooks == ["snapshot", "delivery"]
    assert committed == [{SOURCE: 6}]


def test_offsets_a_rebalance_refused_are_taken_again_by_the_next_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Faust returns False without a word when the group rebalanced under a commit, and records
    the offsets as committed all the same. The revocation's commit then found nothing to do, the
    rebalance was taken as clean, and the partitions kept were read again from the old offsets on
    top of states that count them."""
    hooks: list[str] = []
    answers = [False, True]
    sent: list[dict[TP, int]] = []

    async def faust_commit(self: Any, offsets: dict[TP, int], start_new_transaction: bool = True) -> bool:
        sent.append(dict(offsets))
        self._committed_offset.update(offsets)  # as Faust does, whatever the answer
        return answers.pop(0)

    async def nothing_attached(self: Any, offsets: Any) -> None:
        return None

    monkeypatch.setattr(transport.Consumer, "_commit_offsets", faust_commit)
    monkeypatch.setattr(transport.Consumer, "_handle_attached", nothing_attached)

    async def scenario() -> tuple[bool, bool]:
        c = consumer(hooks)

        async def handler(tp: TP, batch: list[Any]) -> None:
            return None

        await deliver(c, {SOURCE.topic: handler}, {SOURCE: records(0, 1, 2)})
        first = await c._commit_at_least_once(start_new_transaction=False)
        second = await c._commit_at_least_once(start_new_transaction=False, always=True)  # the revocation's
        return first, second

    assert asyncio.run(scenario()) == (False, True)
    assert sent == [{SOURCE: 3}, {SOURCE: 3}]
