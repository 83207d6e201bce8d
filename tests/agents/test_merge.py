"""agents.merge: a source topic's partitions merged by record time, waiting for the partitions
that may still bring earlier records; and the regroup side's order and its drop of replayed forwards."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from prometheus_client import CollectorRegistry, Counter

from agents.merge import BACKLOG_RECORDS, TimeMerge, split_catch_up
from agents.wiring import first_forwards, forward, in_forward_order
from app.rules.evaluator import DictStore
from app.rules.statekey import forwarded_key

P0, P1 = ("events.logs", 0), ("events.logs", 1)


def recs(*pairs: tuple[int, int]) -> list[Any]:
    """Records of (offset, timestamp)."""
    return [SimpleNamespace(offset=o, timestamp=t) for o, t in pairs]


def taken(parts: list[tuple[Any, list[Any]]]) -> dict[Any, list[int]]:
    return {tp: [r.offset for r in chunk] for tp, chunk in parts}


def test_a_round_takes_every_partition_up_to_the_batchs_cut_and_never_splits_a_time() -> None:
    merge = TimeMerge()
    merge.add(P0, recs((0, 10), (1, 20), (2, 30), (3, 40)), now=0.0)
    merge.add(P1, recs((0, 15), (1, 20), (2, 35)), now=0.0)
    # caught up (nothing lagging): rounds of about 3 records, cut at the 3rd earliest time (20),
    # and both records at 20 go together
    assert taken(merge.take(3, lagging=(), now=0.0)) == {P0: [0, 1], P1: [0, 1]}
    assert taken(merge.take(3, lagging=(), now=0.0)) == {P0: [2, 3], P1: [2]}
    assert merge.waiting == 0 and merge.take(3, lagging=(), now=0.0) == []


def test_records_wait_for_a_lagging_partition_until_it_shows_their_time() -> None:
    merge = TimeMerge(hold_s=5.0)
    merge.add(P0, recs((0, 100), (1, 200), (2, 300)), now=0.0)
    merge.add(P1, recs((0, 50), (1, 150)), now=0.0)
    # both lagging: nothing past the earlier of what they have shown (150) leaves
    assert taken(merge.take(100, lagging=(P0, P1), now=0.1)) == {P0: [0], P1: [0, 1]}
    assert merge.take(100, lagging=(P0, P1), now=0.2) == []
    merge.add(P1, recs((2, 250)), now=0.3)
    # up to 250: P1 has shown it, and P0 brings nothing before 300
    assert taken(merge.take(100, lagging=(P0, P1), now=0.3)) == {P0: [1], P1: [2]}
    merge.add(P1, recs((3, 400)), now=0.4)
    assert taken(merge.take(100, lagging=(P0, P1), now=0.4)) == {P0: [2]}
    assert merge.take(100, lagging=(P0, P1), now=0.5) == []  # P0 may still bring 300..400
    # P0 caught up: it brings nothing earlier
    assert taken(merge.take(100, lagging=(P1,), now=0.6)) == {P1: [3]}
    assert merge.forced == 0  # every record left in time order
    assert merge.next_offset(P0) is None


def test_a_lagging_partition_that_showed_nothing_holds_the_others_at_most_hold_s() -> None:
    merge = TimeMerge(hold_s=1.0)
    merge.add(P0, recs((0, 10), (1, 20)), now=0.0)
    assert merge.take(10, lagging=(P1,), now=0.5) == []
    merge.add(P0, recs((2, 30)), now=0.8)
    # the first fetch's records waited their second; the later one waits on
    assert taken(merge.take(10, lagging=(P1,), now=1.2)) == {P0: [0, 1]}
    assert taken(merge.take(10, lagging=(P1,), now=1.9)) == {P0: [2]}
    assert merge.forced == 3  # each let go before P1 showed its time: counted for the metric


def test_past_max_held_the_oldest_leave_without_waiting() -> None:
    merge = TimeMerge(hold_s=60.0, max_held=3)
    merge.add(P0, recs((0, 1), (1, 2), (2, 3)), now=0.0)
    merge.add(P1, recs((0, 1), (1, 5)), now=0.0)
    parts = taken(merge.take(10, lagging=(P0, P1, ("events.logs", 2)), now=0.0))
    assert parts == {P0: [0], P1: [0]} and merge.waiting == 3 and merge.forced == 2


def test_a_paused_partition_neither_leaves_nor_holds_the_others() -> None:
    merge = TimeMerge(hold_s=60.0)
    merge.add(P0, recs((0, 10)), now=0.0)
    merge.add(P1, recs((0, 5)), now=0.0)
    assert taken(merge.take(10, lagging=(P1,), now=0.0, skip=(P1,))) == {P0: [0]}
    assert merge.next_offset(P1) == 1
    merge.drop([P1])
    assert merge.waiting == 0 and merge.next_offset(P1) is None


def test_a_partitions_records_keep_their_offset_order_when_a_timestamp_goes_back() -> None:
    """Record timestamps are the producers' clocks: one may go back. The merge time is their
    running maximum along the partition, so no partition's records change order."""
    merge = TimeMerge()
    merge.add(P0, recs((0, 100), (1, 90), (2, 95), (3, 120)), now=0.0)
    merge.add(P1, recs((0, 99)), now=0.0)
    # P0's 90 and 95 count as 100, so they stay behind its offset 0, and P1's 99 goes before all three
    assert taken(merge.take(1, lagging=(), now=0.0)) == {P1: [0]}
    assert taken(merge.take(1, lagging=(), now=0.0)) == {P0: [0, 1, 2]}
    assert taken(merge.take(1, lagging=(), now=0.0)) == {P0: [3]}


def test_compaction_keeps_what_waits() -> None:
    merge = TimeMerge()
    merge.add(P0, recs(*((o, o) for o in range(10_000))), now=0.0)
    got: list[int] = []
    while parts := merge.take(3000, lagging=(), now=0.0):
        got += taken(parts)[P0]
    assert got == list(range(10_000))
    merge.add(P0, recs((10_000, 10_000)), now=0.0)
    assert merge.next_offset(P0) == 10_001


class _Outbox:
    """What ``agents.wiring.forward`` uses of an Outbox: ``exactly_once`` and ``send_all``."""

    def __init__(self, transactions: object | None) -> None:
        self.exactly_once = transactions is not None
        self.sent: list[tuple[int, list[Any]]] = []

    async def send_all(self, records: list[Any], source_partition: int = 0) -> None:
        self.sent.append((source_partition, list(records)))


def test_a_rounds_forwards_go_merged_by_arrival_then_event_time_through_one_producer() -> None:
    a0, a1, b0, b1 = (("streamalert-rules-logs-regroup", k.encode(), b"{}") for k in ("a0", "a1", "b0", "b1"))
    forwards = [
        (0, [((5, 100, 0, 0), a0), ((7, 100, 0, 1), a1)]),
        (1, [((5, 90, 1, 0), b0), ((6, 300, 1, 1), b1)]),
    ]
    at_least_once = _Outbox(None)
    asyncio.run(forward(cast("Any", at_least_once), forwards))
    # same arrival (5): the earlier event time first; then arrival order
    assert at_least_once.sent == [(0, [b0, a0, b1, a1])]
    exactly_once = _Outbox(object())  # each partition's into its own transaction, in its order
    asyncio.run(forward(cast("Any", exactly_once), forwards))
    assert exactly_once.sent == [(0, [a0, a1]), (1, [b0, b1])]


def test_a_regroup_batch_is_sorted_by_the_order_its_forwards_carry_when_all_carry_one() -> None:
    """Exactly-once forwards carry their merge order ("o"); a batch holding two source
    partitions' transactions one after the other is merged again, each partition's in its order."""
    p0 = [{"s": "x", "e": {"n": n}, "o": [10 * n, 0, 0, n]} for n in range(3)]
    p1 = [{"s": "x", "e": {"n": 10 + n}, "o": [10 * n + 5, 0, 1, n]} for n in range(3)]
    merged = in_forward_order([*p0, *p1])
    assert [m["e"]["n"] for m in merged] == [0, 10, 1, 11, 2, 12]
    # at least once, or a batch with an older worker's forwards: as they came
    plain = [{"s": "x", "e": {"n": 1}}, {"s": "x", "e": {"n": 0}, "o": [0, 0, 0, 0]}]
    assert in_forward_order(list(plain)) == plain


def test_a_regroup_partition_evaluates_each_forwarded_source_offset_once() -> None:
    """After a crash the source partitions are read again from their committed offsets and their
    events forwarded a second time, beside the first copies: each regrouped stream partition
    keeps, per source partition, the last offset it evaluated, in its state store, and drops
    the copies (per stream: one event forwarded to two streams is two forwards)."""
    store = DictStore({}, {})
    registry = CollectorRegistry()
    replayed = Counter("test_replayed", "test", registry=registry)

    def fwd(stream: str, source: int, offset: int) -> dict[str, Any]:
        return {"s": stream, "e": {"n": offset}, "f": [source, offset]}

    first = [fwd("ip", 0, 5), fwd("all", 0, 5), fwd("ip", 1, 2), fwd("ip", 0, 6)]
    assert list(first_forwards(store, 1, first, replayed)) == first
    assert store.get(forwarded_key("ip", 1, 0)) == {"partition": 1, "offset": 6}
    assert store.changed == {forwarded_key(s, 1, p): 1 for s, p in (("ip", 0), ("all", 0), ("ip", 1))}
    # the replay: offsets 5 and 6 of source partition 0 again, then new ones; 2 of partition 1
    again = [fwd("ip", 0, 5), fwd("all", 0, 5), fwd("ip", 0, 6), fwd("all", 0, 6)]
    again += [fwd("ip", 1, 2), fwd("ip", 0, 7)]
    kept = list(first_forwards(store, 1, again, replayed))
    assert [(m["s"], m["f"]) for m in kept] == [("all", [0, 6]), ("ip", [0, 7])]
    assert registry.get_sample_value("test_replayed_total") == 4
    # another regroup partition keeps its own; an older worker's forward (no "f") is taken
    assert list(first_forwards(store, 0, [fwd("ip", 0, 5), {"s": "ip", "e": {}}], replayed)) == [
        fwd("ip", 0, 5),
        {"s": "ip", "e": {}},
    ]


def test_a_catch_up_with_only_some_of_a_sources_partitions_is_told_apart() -> None:
    """The worker warns when it catches up a backlog of a regrouped source while other workers own
    some of its partitions (their forwards then meet out of time order): not when it owns them
    all, owns none, or is within a fetch of the end."""
    assert split_catch_up(1, 2, [BACKLOG_RECORDS])
    assert split_catch_up(2, 4, [0, BACKLOG_RECORDS * 20])
    assert not split_catch_up(2, 2, [BACKLOG_RECORDS * 20])  # one worker merges them all
    assert not split_catch_up(1, 2, [BACKLOG_RECORDS - 1])  # live: within a fetch of the end
    assert not split_catch_up(0, 2, [])
    # where the records still to process start: the first waiting one
    merge = TimeMerge()
    merge.add(P0, recs((7, 1), (8, 2)), 0.0)
    assert (merge.first_offset(P0), merge.first_offset(P1)) == (7, None)
    merge.take(1, [], 0.0)
    assert merge.first_offset(P0) == 8
