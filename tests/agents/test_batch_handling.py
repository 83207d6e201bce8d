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
from prometheus_client import REGISTRY

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
    c._merges, c._paced, c._pace_logged = {}, {}, {}
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


class Rebalance:
    """A fetch under way on the consumer thread that waits for aiokafka's new assignment (as
    ``fetched_records`` does once a rebalance began), and a revocation whose commit is recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, steps: list[str]) -> None:
        self.assigned = asyncio.Event()
        self.steps = steps

        async def faust_fetch(c: Any, timeout: float) -> tuple[dict[TP, list[Any]], set[TP]]:
            await self.assigned.wait()
            return {SOURCE: records(3, 4, 5)}, {SOURCE}

        async def faust_revoked(c: Any, revoked: set[TP]) -> None:
            steps.append("revoked")

        async def commit(c: Any) -> bool:
            steps.append("committed")
            return True

        monkeypatch.setattr(transport.Consumer, "_wait_next_records", faust_fetch)
        monkeypatch.setattr(transport.Consumer, "on_partitions_revoked", faust_revoked)

        async def seek(c: Any, tp: TP, offset: int) -> None:
            steps.append(f"seek {tp.partition} to {offset}")

        monkeypatch.setattr(BatchConsumer, "_commit_before_revoke", commit)
        monkeypatch.setattr(BatchConsumer, "_seek", seek)
        monkeypatch.setattr(BatchConsumer, "assignment", lambda c: {SOURCE})

    @staticmethod
    def consumer(handlers: dict[str, Any]) -> BatchConsumer:
        c = consumer([])
        c.app.batch_handlers = handlers
        c.can_resume_flow, c.suspend_flow = asyncio.Event(), asyncio.Event()
        c.can_resume_flow.set()
        return c


def test_a_revocation_does_not_wait_for_a_fetch_that_waits_for_the_new_assignment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fetch waited for the assignment, the assignment for the revocation, and the
    revocation for the fetch: it gave up after its drain timeout, and every partition of every
    surviving worker was restored from the changelogs at each rebalance. The revocation now
    commits at once; the fetch's records, back after the rebalance began, are neither handled
    nor passed on to Faust, and their partition goes back to the first of them: aiokafka took
    them as consumed, and a changelog's records dropped so were never restored."""
    steps: list[str] = []
    rebalance = Rebalance(monkeypatch, steps)

    async def handler(tp: TP, batch: list[Any]) -> None:
        steps.append(f"handled {[r.offset for r in batch]}")

    async def scenario() -> tuple[BatchConsumer, Any]:
        c = rebalance.consumer({SOURCE.topic: handler})
        fetch = asyncio.ensure_future(c._wait_next_records(1.0))
        await asyncio.sleep(0.01)
        await asyncio.wait_for(c.on_partitions_revoked({SOURCE}), 1.0)  # far less than REVOKE_DRAIN_S
        assert not fetch.done()
        rebalance.assigned.set()
        return c, await fetch

    c, (rest, _) = asyncio.run(scenario())
    assert steps == ["committed", "revoked", "seek 1 to 3"]
    assert c._clean_revoke
    assert rest == {}
    assert c._batch_acked == {}


def test_a_revocation_waits_for_the_batch_its_handler_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch the handler has begun counts in the states: the revocation's commit comes after
    it, so the states, the outputs and the offsets it commits cover the same records."""
    steps: list[str] = []
    rebalance = Rebalance(monkeypatch, steps)
    sent = asyncio.Event()

    async def handler(tp: TP, batch: list[Any]) -> None:
        steps.append("counted")
        await sent.wait()
        steps.append("sent")

    async def scenario() -> BatchConsumer:
        c = rebalance.consumer({SOURCE.topic: handler})
        rebalance.assigned.set()
        fetch = asyncio.ensure_future(c._wait_next_records(1.0))
        await asyncio.sleep(0.01)
        revoke = asyncio.ensure_future(c.on_partitions_revoked({SOURCE}))
        await asyncio.sleep(0.01)
        assert steps == ["counted"]  # the revocation waits
        sent.set()
        await asyncio.wait_for(revoke, 1.0)
        await fetch
        return c

    c = asyncio.run(scenario())
    assert steps == ["counted", "sent", "committed", "revoked"]
    assert c._clean_revoke


def test_a_fetch_a_rebalance_overtook_gives_its_records_back_even_once_the_flow_resumed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fetch came back after the recovery had resumed the flow, with records of a changelog
    partition the recovery waits for: Faust would skip them (that partition was not among the
    fetch's, chosen before the rebalance) after aiokafka took them as consumed, and the recovery
    waited for them for ever. They go back to be fetched again."""
    steps: list[str] = []
    rebalance = Rebalance(monkeypatch, steps)

    async def handler(tp: TP, batch: list[Any]) -> None:
        steps.append("handled")

    async def scenario() -> Any:
        c = rebalance.consumer({SOURCE.topic: handler})
        fetch = asyncio.ensure_future(c._wait_next_records(1.0))
        await asyncio.sleep(0.01)
        await c.on_partitions_revoked({SOURCE})
        c.resume_flow()  # the recovery, before the fetch is back
        rebalance.assigned.set()
        return await fetch

    rest, _ = asyncio.run(scenario())
    assert rest == {}
    assert steps == ["committed", "revoked", "seek 1 to 3"]


def test_a_fetch_back_after_the_consumer_is_gone_gives_nothing_back_and_raises_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop stops the flow and then the consumer: a fetch back after that has nowhere to give
    its records back to, and must not fail the fetch loop's last turn."""
    steps: list[str] = []
    rebalance = Rebalance(monkeypatch, steps)

    def gone(c: Any) -> set[TP]:
        raise RuntimeError("the consumer is stopped")

    monkeypatch.setattr(BatchConsumer, "assignment", gone)

    async def scenario() -> Any:
        c = rebalance.consumer({SOURCE.topic: lambda tp, batch: None})
        fetch = asyncio.ensure_future(c._wait_next_records(1.0))
        await asyncio.sleep(0.01)
        c.stop_flow()  # the stop
        rebalance.assigned.set()
        return await fetch

    rest, _ = asyncio.run(scenario())
    assert rest == {}
    assert steps == []


def test_a_fetch_a_rebalance_overtook_says_only_what_it_gave_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its line counts the records put back, of the partitions still assigned: one that left
    with the rebalance is read by its next owner from the committed offset, and is not claimed."""
    other = TP(SOURCE.topic, 2)
    steps: list[str] = []
    rebalance = Rebalance(monkeypatch, steps)

    async def fetched(c: Any, timeout: float) -> tuple[dict[TP, list[Any]], set[TP]]:
        await rebalance.assigned.wait()
        return {SOURCE: records(3, 4, 5), other: records(7, 8)}, {SOURCE, other}

    monkeypatch.setattr(transport.Consumer, "_wait_next_records", fetched)

    async def overtaken(mine: set[TP]) -> Any:
        monkeypatch.setattr(BatchConsumer, "assignment", lambda c: mine)
        rebalance.assigned.clear()
        c = rebalance.consumer({SOURCE.topic: lambda tp, batch: None})
        fetch = asyncio.ensure_future(c._wait_next_records(1.0))
        await asyncio.sleep(0.01)
        await c.on_partitions_revoked({SOURCE, other})
        rebalance.assigned.set()
        return await fetch

    async def both() -> list[Any]:
        return [(await overtaken({SOURCE}))[0], (await overtaken(set()))[0]]

    with caplog.at_level("INFO", logger=transport.__name__):
        assert asyncio.run(both()) == [{}, {}]
    said = [r.getMessage() for r in caplog.records if "given back" in r.getMessage()]
    assert said == ["a fetch that a rebalance overtook: 3 record(s) of 1 partition(s) given back"]
    assert [s for s in steps if s.startswith("seek")] == ["seek 1 to 3"]


def test_a_rebalance_after_the_first_join_is_counted_with_the_time_the_worker_evaluated_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``worker_rebalances_total`` and ``worker_rebalance_seconds``: the first join's empty
    revocation is not a rebalance; a later revocation is, until the assignment that ends it."""
    steps: list[str] = []
    rebalance = Rebalance(monkeypatch, steps)
    monkeypatch.setattr(BatchConsumer, "_member_id", lambda c: "worker-1-member")

    async def faust_assigned(c: Any, assigned: set[TP], generation_id: int = 0) -> None:
        steps.append("assigned")

    monkeypatch.setattr(transport.Consumer, "on_partitions_assigned", faust_assigned)

    def seen() -> tuple[float, float, float]:
        return (
            REGISTRY.get_sample_value("worker_rebalances_total") or 0.0,
            REGISTRY.get_sample_value("worker_rebalance_seconds_count") or 0.0,
            REGISTRY.get_sample_value("worker_rebalance_seconds_sum") or 0.0,
        )

    async def scenario() -> list[tuple[float, float, float]]:
        c = rebalance.consumer({SOURCE.topic: lambda tp, batch: None})
        counts = [seen()]
        await c.on_partitions_revoked(set())  # the first join
        await c.on_partitions_assigned({SOURCE})
        counts.append(seen())
        await c.on_partitions_revoked({SOURCE})
        await asyncio.sleep(0.2)  # the group waits for its members
        await c.on_partitions_assigned({SOURCE})
        counts.append(seen())
        return counts

    start, joined, after = asyncio.run(scenario())
    assert joined == start
    assert (after[0] - start[0], after[1] - start[1]) == (1.0, 1.0)
    assert after[2] - start[2] >= 0.2
