"""agents.merge: a source topic's partitions merged by record time, waiting for the partitions
that may still bring earlier records; the regroup side's merge across workers by the source
partitions' progress, and its drop of replayed forwards."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest
from faust.types import TP
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from agents import transport
from agents.merge import (
    PACER_ROUNDS,
    PAUSED,
    REGROUP_HOLD_S,
    STALE_S,
    Pacer,
    RegroupMerge,
    TimeMerge,
    regroup_waits,
)
from agents.transport import BatchConsumer
from agents.wiring import Told, first_forwards, first_records, forward, progress_markers
from app.errors import ConfigError
from app.rules.evaluator import DictStore
from app.rules.statekey import forwarded_key
from app.runtime.settings import Settings

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


def test_strict_records_at_a_lagging_partitions_shown_time_wait_for_a_later_one() -> None:
    """The regroup side's merge: a lagging partition may still bring records at the time it has
    shown (the same millisecond, with an earlier event time), so only what is earlier leaves."""
    merge = TimeMerge(hold_s=5.0, strict=True)
    merge.add(P0, recs((0, 100), (1, 200)), now=0.0)
    merge.add(P1, recs((0, 50), (1, 100)), now=0.0)
    assert taken(merge.take(100, lagging=(P0, P1), now=0.1)) == {P1: [0]}
    merge.add(P1, recs((2, 150)), now=0.2)
    assert taken(merge.take(100, lagging=(P0, P1), now=0.2)) == {P0: [0], P1: [1]}
    assert taken(merge.take(100, lagging=(), now=0.3)) == {P0: [1], P1: [2]}
    assert merge.forced == 0


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

    async def send_all(self, records: list[Any], source_partition: int = 0, placed: Any = ()) -> None:
        self.sent.append((source_partition, [*records, *placed]))


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


def test_the_progress_markers_go_behind_the_forwards_each_in_its_partitions_transaction() -> None:
    a0 = ("streamalert-rules-logs-regroup", b"a0", b"{}")
    m0, m1 = (("streamalert-rules-logs-regroup", 0, str(p).encode(), b"m") for p in (0, 1))
    forwards = [(0, [((5, 100, 0, 0), a0)])]
    at_least_once = _Outbox(None)
    asyncio.run(forward(cast("Any", at_least_once), forwards, {0: [m0], 1: [m1]}))
    assert at_least_once.sent == [(0, [a0, m0, m1])]
    exactly_once = _Outbox(object())  # partition 1 had no record this round: its marker too
    asyncio.run(forward(cast("Any", exactly_once), forwards, {0: [m0], 1: [m1]}))
    assert exactly_once.sent == [(0, [a0, m0]), (1, [m1])]


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


def test_the_rules_on_a_source_partition_drop_the_records_they_evaluated_before_a_crash() -> None:
    """A crash after a commit's states and before its offsets: the restart reads that commit's
    batches again, and the states already count them."""
    registry = CollectorRegistry()
    reread = Counter("test_reread", "", registry=registry)
    store = DictStore({}, {})
    assert [r.offset for r in first_records(store, "sensors", 1, recs((0, 0), (1, 0), (2, 0)), reread)] == [
        0,
        1,
        2,
    ]
    assert store.get(forwarded_key("sensors", 1, 1)) == {"partition": 1, "offset": 2}
    assert store.changed == {forwarded_key("sensors", 1, 1): 1}  # written with the states at the commit
    again = recs((1, 0), (2, 0), (3, 0))  # read again from the committed offset 1
    assert [r.offset for r in first_records(store, "sensors", 1, again, reread)] == [3]
    assert first_records(store, "sensors", 1, recs((2, 0), (3, 0)), reread) == []
    assert registry.get_sample_value("test_reread_total") == 4
    assert store.get(forwarded_key("sensors", 1, 1)) == {"partition": 1, "offset": 3}
    # another partition keeps its own
    assert [r.offset for r in first_records(store, "sensors", 0, recs((2, 0)), reread)] == [2]


def test_where_the_records_still_to_process_start() -> None:
    merge = TimeMerge()
    merge.add(P0, recs((7, 1), (8, 2)), 0.0)
    merge.add(P1, recs((3, 1)), 0.0)
    assert (merge.first_offset(P0), merge.first_offset(P1)) == (7, 3)
    assert merge.first_waiting_offset() == 3
    merge.take(10, lagging=(), now=0.0)
    assert merge.first_waiting_offset() is None


def fwd(source: int, offset: int, time: int, n: int | None = None) -> dict[str, Any]:
    """A forward of source partition ``source``'s ``offset``, at record time ``time``."""
    return {
        "s": "ip",
        "e": {"n": offset if n is None else n},
        "f": [source, offset],
        "o": [time, time, source, offset],
    }


def mark(source: int, time: int, behind: bool | int, reached: int | None = None) -> dict[str, Any]:
    """A progress marker; ``reached``: the source offset it says its partition had reached."""
    return {"m": [source, time, behind]} | ({} if reached is None else {"n": reached})


def numbered(
    messages: list[dict[str, Any]], written_ms: list[int] | None = None, start: int = 0
) -> list[tuple[int, dict[str, Any], int | None]]:
    """``messages`` at offsets ``start``, ``start + 1``, ..., each with its record timestamp
    (``written_ms``; none)."""
    return [(start + i, m, written_ms[i] if written_ms else None) for i, m in enumerate(messages)]


def test_the_regroup_side_merges_two_workers_forwards_by_their_partitions_progress() -> None:
    """Two workers catch up a backlog, one source partition each; worker 0 is ahead. Its
    forwards wait until partition 1's markers show their time, then leave merged in time order."""
    merge = RegroupMerge(2, now=0.0)
    batch = [fwd(0, 0, 10), fwd(0, 1, 20), fwd(0, 2, 30), mark(0, 31, True), fwd(1, 0, 5), mark(1, 5, True)]
    assert merge.add(numbered(batch), now=0.0) == []
    # partition 1 has shown 5 only (and may bring more at 5): nothing leaves yet
    assert merge.take(100, now=0.0) == []
    assert merge.first_offset() == 0  # the commit stops before the first forward still waiting
    later = [fwd(1, 1, 15), fwd(1, 2, 25), mark(1, 26, True)]
    assert merge.add(numbered(later, start=6), now=0.1) == []
    assert [m["f"] for m in merge.take(100, now=0.1)] == [[1, 0], [0, 0], [1, 1], [0, 1], [1, 2]]
    assert merge.first_offset() == 2
    # partition 1 is caught up: it holds nothing back any more
    merge.add([(9, mark(1, 25, False), None)], now=0.2)
    assert [m["f"] for m in merge.take(100, now=0.2)] == [[0, 2]]
    assert merge.waiting == 0 and merge.first_offset() is None


def test_a_partition_heard_of_by_no_marker_holds_back_for_the_grace_only() -> None:
    merge = RegroupMerge(2, now=0.0, grace_s=2.0)
    merge.add(numbered([fwd(0, 0, 10), mark(0, 10, False)]), now=0.0)
    assert merge.take(100, now=1.0) == []  # partition 1 may still be starting
    assert [m["f"] for m in merge.take(100, now=2.5)] == [[0, 0]]


def test_a_lagging_partition_whose_time_stopped_moving_holds_nothing_back() -> None:
    """Its worker stopped or hangs (no marker), or cannot fetch (the same time again and again)."""
    merge = RegroupMerge(2, now=0.0, grace_s=0.0, stale_s=3.0)
    merge.add(numbered([mark(1, 5, True), fwd(0, 0, 10), fwd(0, 1, 20)]), now=0.0)
    assert merge.take(100, now=2.0) == []
    merge.add([(3, mark(1, 5, True), None)], now=2.5)  # behind, at the same time
    assert [m["f"] for m in merge.take(100, now=3.5)] == [[0, 0], [0, 1]]
    # one whose time moves on holds back as long as it does
    merge.add([(4, mark(1, 8, True), None), (5, fwd(0, 2, 30), None)], now=4.0)
    merge.add([(6, mark(1, 12, True), None)], now=6.5)
    assert merge.take(100, now=8.0) == []
    assert [m["f"] for m in merge.take(100, now=9.6)] == [[0, 2]]


def test_a_forward_waits_at_most_the_hold_and_an_older_workers_goes_as_it_came() -> None:
    merge = RegroupMerge(2, now=0.0, grace_s=0.0, stale_s=100.0, hold_s=30.0)
    old = {"s": "ip", "e": {"n": 1}}  # no merge order: an older worker's
    assert merge.add(numbered([mark(1, 5, True), fwd(0, 0, 10), old]), now=0.0) == [old]
    assert merge.take(100, now=1.0) == []
    merge.add([(3, mark(1, 5, True), None)], now=29.0)  # partition 1 still lagging, still at 5
    assert merge.take(100, now=29.0) == []
    assert [m["f"] for m in merge.take(100, now=30.5)] == [[0, 0]]
    assert merge.forced == 1


def test_a_replayed_partition_does_not_move_its_shown_time_back() -> None:
    """A worker restarted behind a crash forwards a partition's last events again, from older
    times, and says so in its markers: what its partition had shown still holds."""
    merge = RegroupMerge(2, now=0.0, grace_s=0.0)
    merge.add(numbered([mark(0, 50, True), fwd(1, 0, 40), mark(1, 41, True)]), now=0.0)
    assert [m["f"] for m in merge.take(100, now=0.0)] == [[1, 0]]
    merge.add([(3, mark(0, 20, True), None), (4, fwd(1, 1, 45), None), (5, mark(1, 46, True), None)], now=0.1)
    assert [m["f"] for m in merge.take(100, now=0.1)] == [[1, 1]]


def test_a_copy_of_a_forward_taken_in_already_is_dropped_as_it_arrives() -> None:
    """Partition 0's worker died; its new owner reads it again from the committed offset and
    forwards its events again. Held, the copies counted towards ``max_held``, whose forced
    release then let partition 1's forwards go before partition 0's next ones."""
    merge = RegroupMerge(2, now=0.0, grace_s=0.0, max_held=4)
    first = [fwd(0, 0, 10), fwd(0, 1, 11), fwd(0, 2, 12), mark(0, 13, True),
             fwd(1, 0, 20), fwd(1, 1, 21), mark(1, 22, True)]  # fmt: skip
    merge.add(numbered(first), now=0.0)
    assert [m["f"] for m in merge.take(100, now=0.0)] == [[0, 0], [0, 1], [0, 2]]
    again = [fwd(0, 0, 10), fwd(0, 1, 11), fwd(0, 2, 12), fwd(0, 3, 25), mark(0, 26, True)]
    merge.add(numbered(again, start=7), now=0.1)
    assert merge.copies == 3
    assert [m["f"] for m in merge.take(100, now=0.1)] == [[1, 0], [1, 1]]
    assert merge.forced == 0 and merge.waiting == 1


def test_a_commit_never_passes_the_forwards_a_seek_dropped() -> None:
    """Faust's fetch loop seeks back when a fetch returns during a rebalance, and the seek drops
    the regroup side's waiting forwards before the commit that hands the partitions over. That
    commit took the whole batches as handled, and the dropped forwards were lost."""
    regroup = TP("streamalert-rules-logs-regroup", 0)
    held = {regroup: 200}  # the first waiting forward's offset; batches handled up to 300
    consumer = object.__new__(BatchConsumer)  # no Faust app: only the offset bookkeeping
    consumer.app = SimpleNamespace(held_from=held.get, drop_held=held.clear)
    paced = {"events.logs": frozenset({TP("events.logs", 1)})}  # the pacer paused partition 1
    consumer._batch_acked, consumer._merges, consumer._paced = {regroup: 300}, {}, paced
    assert consumer._new_offset(regroup) == 200
    assert consumer.paced("events.logs") == {1}
    consumer._drop_waiting()
    assert not held
    assert consumer._new_offset(regroup) == 200
    assert consumer.paced("events.logs") == set()  # the seek or the rebalance resumes them all
    assert REGISTRY.get_sample_value("worker_merge_paused_partitions", {"topic": "events.logs"}) == 0


def test_a_seek_takes_a_partition_never_committed_back_to_its_start() -> None:
    """aiokafka's ``seek_to_committed`` seeks only to a committed offset above 0: a partition
    with none kept its position, and the records fetched and dropped before the seek were never
    read again (a worker that took over a dead one's never-committed partition lost them)."""
    never, zero, some = TP("events.logs", 1), TP("events.logs", 0), TP("events.sensors", 0)
    changelog = TP("streamalert-rules-rule-state-logs-changelog", 1)
    calls: list[tuple[str, Any]] = []

    class Thread:
        async def seek_to_committed(self) -> dict[TP, int | None]:
            return {never: None, zero: 0, some: 5, changelog: None}

        async def seek_to_beginning(self, *tps: TP) -> None:
            calls.append(("beginning", set(tps)))

        def seek(self, tp: TP, offset: int) -> None:
            calls.append(("seek", (tp, offset)))

    consumer = object.__new__(BatchConsumer)
    consumer._thread = Thread()
    consumer.app = SimpleNamespace(tables=SimpleNamespace(changelog_topics={changelog.topic}))
    committed = asyncio.run(consumer.seek_to_committed())
    assert committed == {never: None, zero: 0, some: 5, changelog: None}
    assert calls == [("seek", (zero, 0)), ("beginning", {never})]


def test_the_pauses_and_resumes_reach_the_log_at_info_once_in_ten_seconds(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A catch-up paused and resumed a partition every 40 ms: an INFO line each time."""
    source = TP("events.logs", 0)
    clock = [100.0]
    monkeypatch.setattr(transport.time, "monotonic", lambda: clock[0])
    consumer = object.__new__(BatchConsumer)
    consumer._paced, consumer._pace_logged, consumer._held = {}, {}, frozenset()
    monkeypatch.setattr(consumer, "assignment", lambda: {source}, raising=False)
    monkeypatch.setattr(consumer, "pause_partitions", lambda tps: None, raising=False)
    monkeypatch.setattr(consumer, "resume_partitions", lambda tps: None, raising=False)
    caplog.set_level(logging.DEBUG, logger=transport.logger.name)
    for _ in range(10):
        assert consumer.pace("events.logs", [0]) == {0}
        assert consumer.pace("events.logs", []) == set()
        clock[0] += 0.04
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert info == ["events.logs: the fetch of partitions [0] paused: too many of their forwards wait "
                    "on the regroup side for a lagging partition"]  # fmt: skip
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 19
    clock[0] += transport.PACE_LOG_S
    consumer.pace("events.logs", [0])
    assert consumer.paced("events.logs") == {0}
    assert REGISTRY.get_sample_value("worker_merge_paused_partitions", {"topic": "events.logs"}) == 1
    assert caplog.records[-1].levelno == logging.INFO
    assert caplog.records[-1].getMessage().endswith("(19 more pauses and resumes since the last such line)")


def test_the_least_time_a_lagging_partition_has_shown_bounds_what_leaves() -> None:
    merge = RegroupMerge(3, now=0.0, grace_s=5.0)
    merge.add(numbered([mark(0, 30, True), mark(1, 10, True)]), now=0.0)
    assert merge.bound(now=0.0) == -(2**63)  # partition 2 may still be starting: all wait for it
    assert merge.bound(now=6.0) == 10
    merge.add([(2, mark(1, 40, True), None)], now=6.1)
    assert merge.bound(now=6.1) == 30
    merge.add([(3, mark(0, 41, False), None), (4, mark(1, 41, False), None)], now=6.2)
    assert merge.bound(now=6.2) is None  # none lags: nothing waits for time


def test_a_paused_partition_stays_lagging_while_its_markers_say_so() -> None:
    """Its time stands still on purpose (:class:`Pacer`): the others' forwards later than it
    keep waiting for it, as long as its worker keeps telling so; once that stops, it goes stale."""
    merge = RegroupMerge(2, now=0.0, grace_s=0.0, stale_s=3.0)
    merge.add(numbered([mark(1, 5, PAUSED), fwd(0, 0, 10)]), now=0.0)
    for now in (2.0, 4.0, 6.0):
        merge.add([(int(now), mark(1, 5, PAUSED), None)], now=now)
        assert merge.take(100, now=now) == [] and merge.lagging(now) == [1]
    assert [m["f"] for m in merge.take(100, now=9.5)] == [[0, 0]]


def test_a_stale_caught_up_is_checked_against_its_end_before_forwards_go_past_it() -> None:
    """Partition 1's worker told it caught up at offset 40, then stopped while a burst came to
    it. Partition 0's forwards came on. Before, the regroup side let them go on that old word,
    and the burst, earlier, came after them (late for the regrouped windows). Now a "caught up"
    heard 2 s ago or more is checked against the partition's end before forwards go past it."""
    merge = RegroupMerge(2, now=0.0, grace_s=0.0, confirm_s=2.0)
    merge.add(numbered([mark(0, 10, False, reached=7), mark(1, 10, False, reached=40)]), now=0.0)
    assert merge.unconfirmed(now=5.0) == {}  # nothing waits: nothing to check, nothing read
    merge.add([(2, fwd(0, 7, 20), None)], now=1.0)
    assert merge.unconfirmed(now=1.0) == {}  # heard within 2 s: trusted
    assert merge.unconfirmed(now=2.5) == {0: 7, 1: 40}
    assert merge.unconfirmed(now=2.5, skip={0}) == {1: 40}  # its sole ordered owner's: in order
    # partition 1's end has moved on with no word of it: it lags, the forward waits for it
    assert merge.confirm({0: 8, 1: 52}, now=2.5) == {1}  # 0's forward of 7 went that far
    assert merge.lagging(now=2.5) == [1] and merge.take(100, now=2.5) == []
    assert merge.unconfirmed(now=6.0) == {0: 7}  # 1 lags, not caught up: nothing to read of it
    # its worker wakes: the burst, then its marker, and the forwards leave in time order
    merge.add(numbered([fwd(1, 40, 12), fwd(1, 41, 15), mark(1, 15, False, reached=52)]), now=6.0)
    assert [m["f"] for m in merge.take(100, now=6.0)] == [[1, 40], [1, 41], [0, 7]]
    # a lagging partition that never tells again goes stale as any other
    merge.add([(9, fwd(0, 8, 30), None)], now=10.0)
    assert merge.confirm({1: 60}, now=10.0) == {1}
    assert merge.take(100, now=10.0 + STALE_S - 0.1) == []
    assert [m["f"] for m in merge.take(100, now=10.0 + STALE_S)] == [[0, 8]]


def test_a_caught_up_whose_end_has_not_moved_is_confirmed_until_it_goes_stale_again() -> None:
    merge = RegroupMerge(2, now=0.0, grace_s=0.0, confirm_s=2.0)
    merge.add(
        numbered([mark(0, 10, False, reached=7), mark(1, 10, False, reached=40), fwd(0, 7, 20)]), now=0.0
    )
    assert merge.unconfirmed(now=3.0) == {0: 7, 1: 40}
    # partition 0 went on to 9 and said nothing: its forward of 7 tells it went that far, not further
    assert merge.confirm({0: 9, 1: 40}, now=3.0) == {0}
    assert merge.unconfirmed(now=4.9, skip={0}) == {}  # 1 confirmed at 3.0
    assert [m["f"] for m in merge.take(100, now=3.0)] == []  # partition 0 itself lags now
    merge.add([(3, mark(0, 20, False, reached=9), None)], now=3.1)  # its worker's timer tells it
    assert [m["f"] for m in merge.take(100, now=3.1)] == [[0, 7]]
    # a marker of an earlier release says no offset: trusted as it is, as before
    old = RegroupMerge(2, now=0.0, grace_s=0.0)
    old.add(numbered([mark(0, 10, False), mark(1, 10, False), fwd(0, 7, 20)]), now=0.0)
    assert old.unconfirmed(now=60.0) == {}
    assert [m["f"] for m in old.take(100, now=60.0)] == [[0, 7]]


def test_a_caught_up_read_again_after_its_workers_death_is_checked_at_once() -> None:
    """A regroup partition read again by its new owner holds its dead owner's markers: one of
    partition 1 says caught up at offset 40, written 20 s ago, and its worker died too. Read as
    new, it was trusted for 2 s, while the backlog of partition 0's forwards behind it left,
    and partition 1's records came after them, too late (bench/chaos_workers.py, seed 3). Now
    a marker counts as heard when it was written: it is checked against the end at once, and
    partition 1 lags. A marker from a clock ahead of this one counts as written now."""
    merge = RegroupMerge(2, now=100.0, grace_s=0.0, confirm_s=2.0)
    wall = 1_000_000
    batch = [mark(1, 10, False, reached=40), fwd(0, 7, 20), fwd(0, 8, 25), mark(0, 26, False, reached=9)]
    merge.add(numbered(batch, [wall - 20_000, wall - 200, wall - 150, wall - 100]), now=100.0, wall_ms=wall)
    assert merge.unconfirmed(now=100.0) == {1: 40}  # 20 s old; partition 0's is 0.1 s old
    assert merge.confirm({0: 9, 1: 70}, now=100.0) == {1}
    assert merge.take(100, now=100.0) == []  # they wait for partition 1's new owner
    ahead = RegroupMerge(2, now=0.0, grace_s=0.0, confirm_s=2.0)
    ahead.add(numbered([mark(1, 10, False, reached=40), fwd(0, 7, 20)], [wall + 5_000, wall]), 0.0, wall)
    assert ahead.unconfirmed(now=1.9) == {} and ahead.unconfirmed(now=2.0) == {1: 40}
    unknown = RegroupMerge(2, now=0.0, grace_s=0.0, confirm_s=2.0)  # Kafka's -1: no timestamp
    unknown.add(numbered([mark(1, 10, False, reached=40), fwd(0, 7, 20)], [-1, -1]), 0.0, wall)
    assert unknown.unconfirmed(now=1.9) == {}


def test_a_partition_never_told_of_is_checked_against_where_its_worker_starts() -> None:
    """Partition 1's worker has run no round since it started (all its partitions idle), so no
    marker of it ever came, and past the grace it held nothing back. It stopped while a burst
    came to it: its end beyond the group's committed offset says so, and the forwards of
    partition 0 wait for its first marker."""
    merge = RegroupMerge(2, now=0.0, grace_s=10.0, confirm_s=2.0)
    merge.add(numbered([mark(0, 10, False, reached=7), fwd(0, 7, 20)]), now=0.0)
    assert merge.unheard(now=5.0) == []  # within the grace it lags anyway
    assert merge.lagging(now=5.0) == [1]
    assert merge.unheard(now=11.0) == [1] and merge.unheard(now=11.0, skip={1}) == []
    # idle since its worker started: its end is where the group starts it, checked for 2 s
    assert merge.confirm({1: 40}, now=11.0, starts={1: 40}) == set()
    assert merge.unheard(now=12.9) == [] and merge.unheard(now=13.0) == [1]
    assert [m["f"] for m in merge.take(100, now=11.0)] == [[0, 7]]
    merge.add([(2, fwd(0, 8, 30), None)], now=13.0)
    # a burst came, its worker stopped: it lags from now with no time shown, every forward waits
    assert merge.confirm({1: 43}, now=13.0, starts={1: 40}) == {1}
    assert merge.lagging(now=13.0) == [1] and merge.take(100, now=13.0) == []
    assert merge.unheard(now=20.0) == []  # heard of (as lagging) now
    merge.add(
        numbered([fwd(1, 40, 12), fwd(1, 41, 15), fwd(1, 42, 25), mark(1, 25, False, reached=43)]), now=16.0
    )
    assert [m["f"] for m in merge.take(100, now=16.0)] == [[1, 40], [1, 41], [1, 42], [0, 8]]


def test_a_never_told_partition_that_never_tells_goes_stale_and_one_unread_is_trusted() -> None:
    merge = RegroupMerge(3, now=0.0, grace_s=0.0, confirm_s=2.0)
    merge.add(numbered([mark(0, 10, False, reached=7), fwd(0, 7, 20)]), now=0.0)
    assert merge.unheard(now=0.0) == [1, 2]
    # 2's start not read (the caller trusts it: its start given as its end)
    assert merge.confirm({1: 5, 2: 9}, now=0.0, starts={1: 3, 2: 9}) == {1}
    assert merge.take(100, now=STALE_S - 0.1) == []
    assert [m["f"] for m in merge.take(100, now=STALE_S)] == [[0, 7]]
    assert merge.unheard(now=STALE_S) == []  # nothing waits: nothing to check
    merge.add([(2, fwd(0, 8, 30), None)], now=STALE_S)
    assert merge.unheard(now=STALE_S) == [2]


def test_the_pacer_pauses_the_partitions_ahead_until_few_of_their_forwards_wait() -> None:
    """Partition 1 lags (its worker slow, or dead until the group moves its partitions); the
    forwards of partitions 0 and 2 later than its time wait for it, here or in Kafka. From 40 %
    of ``max_held`` of them, the pacer names the partitions that sent them, never partition 1;
    none again once fewer than 20 % wait."""
    pacer = Pacer(max_held=100)
    assert (pacer.pause_at, pacer.resume_at) == (40, 20)
    pacer.sent(1, time=5, count=10)
    assert pacer.idle()  # 10 forwarded in all: whatever the bound, nothing to pause
    pacer.sent(0, time=10, count=10)
    assert not pacer.idle()
    pacer.sent(0, time=20, count=15)
    pacer.sent(2, time=8, count=5)
    assert pacer.waiting(bound=5) == {0: 25, 2: 5}
    assert pacer.pace(bound=5) == set()  # 30 wait: under 40
    pacer.sent(0, time=30, count=10)
    assert pacer.pace(bound=5) == {0, 2}
    assert pacer.pace(bound=10) == {0}  # 25: still over 20, partition 2's have left
    assert pacer.pace(bound=20) == set()  # 10
    assert pacer.idle()  # what came before 20 has left
    # a rebalance's new merge knows no time yet for a while: what was forwarded after the
    # last bound paced by still waits; what came before it has left
    pacer.sent(0, time=40, count=50)
    pacer.sent(1, time=41, count=3)
    assert pacer.waiting(bound=-(2**63)) == {0: 60, 1: 3}
    pacer.forget([0])
    assert pacer.waiting(bound=-(2**63)) == {1: 3}
    # none lags (a sole owner, live): nothing waits for time, and the pacer is idle again
    pacer.sent(1, time=42, count=500)
    assert not pacer.idle()
    assert pacer.pace(bound=None) == set()
    assert pacer.waiting(bound=-(2**63)) == {} and pacer.idle()


def test_the_pacer_forgets_the_oldest_rounds_past_its_bound() -> None:
    pacer = Pacer(max_held=100)
    for t in range(PACER_ROUNDS + 10):
        pacer.sent(0, time=t, count=1)
    assert pacer.waiting(bound=-1) == {0: PACER_ROUNDS}  # the oldest ten: too old to tell
    pacer.sent(0, time=PACER_ROUNDS + 9, count=1)  # the same time again: the same round
    assert pacer.waiting(bound=PACER_ROUNDS + 8) == {0: 2}


def test_the_most_waiting_forwards_is_a_setting_of_at_least_two_batches() -> None:
    """A round forwards up to a batch of events before its progress markers: a regroup partition
    that could not hold two would let them go out of order."""
    assert Settings.from_env({}).regroup_max_waiting == 50_000
    assert Settings.from_env({"APP_REGROUP_MAX_WAITING": "4000"}).regroup_max_waiting == 4000
    expected = r"APP_REGROUP_MAX_WAITING=3999: expected at least 2 x APP_WORKER_BATCH \(4000\)"
    with pytest.raises(ConfigError, match=expected):
        Settings.from_env({"APP_REGROUP_MAX_WAITING": "3999"})
    small = Settings.from_env({"APP_REGROUP_MAX_WAITING": "200", "APP_WORKER_BATCH": "100"})
    assert small.regroup_max_waiting == 200


def test_progress_markers_every_round_while_behind_and_on_a_change_or_a_refresh_after() -> None:
    told = Told()
    marks = {0: (1_000, 900)}

    def markers(progress: dict[int, tuple[bool, int | None]], now: float) -> dict[int, list[Any]]:
        return progress_markers("r", 2, progress, marks, told, now, one_producer=False)

    first = markers({0: (True, None), 1: (False, None)}, now=0.0)
    assert sorted(first) == [0, 1]
    assert first[0] == [("r", 0, b"0", b'{"m":[0,1000,true]}'), ("r", 1, b"0", b'{"m":[0,1000,true]}')]
    assert first[1][0][3] == b'{"m":[1,-9223372036854775808,false]}'  # nothing forwarded yet
    # partition 0 still behind: again, at the least time it may still bring when that is later
    # than its forwards (a record waiting for another partition); partition 1 told already
    again = markers({0: (True, 1_200), 1: (False, 50)}, now=0.5)
    assert sorted(again) == [0] and again[0][0][3] == b'{"m":[0,1200,true]}'
    assert sorted(markers({0: (False, None), 1: (False, None)}, now=0.6)) == [0]
    assert markers({0: (False, None), 1: (False, None)}, now=0.9) == {}
    assert sorted(markers({0: (False, None), 1: (False, None)}, now=1.7)) == [0, 1]


def test_markers_say_the_offset_reached_and_the_timer_tells_a_partition_that_went_idle_once() -> None:
    """A round within the refresh of the last marker sends none, so a partition's last marker
    before it goes idle may say an offset it has since passed: the worker's timer (``settle``)
    tells it once, and an idle worker sends nothing at all."""
    told = Told()

    def markers(
        progress: dict[int, bool], positions: dict[int, int], now: float, settle: bool
    ) -> dict[int, Any]:
        out = progress_markers("r", 2, {p: (b, 5) for p, b in progress.items()}, {}, told, now,
                               one_producer=False, positions=positions, settle=settle)  # fmt: skip
        return {p: orjson.loads(ms[0][3]) for p, ms in out.items()}

    assert markers({0: False, 1: True}, {0: 7, 1: 3}, now=0.0, settle=False) == {
        0: {"m": [0, 5, False], "n": 7},
        1: {"m": [1, 5, True], "n": 3},
    }
    assert markers({0: False, 1: False}, {0: 9, 1: 4}, now=0.4, settle=False) == {
        1: {"m": [1, 5, False], "n": 4}
    }
    # 0 moved on to 9 within the refresh, then went idle: the timer tells it once it is due
    assert markers({0: False, 1: False}, {0: 9, 1: 4}, now=0.6, settle=True) == {}
    assert markers({0: False, 1: False}, {0: 9, 1: 4}, now=1.1, settle=True) == {
        0: {"m": [0, 5, False], "n": 9}
    }
    for now in (2.0, 5.0, 60.0):  # idle: nothing, however long
        assert markers({0: False, 1: False}, {0: 9, 1: 4}, now=now, settle=True) == {}
    # behind: its rounds tell it, not the timer; unknown position: nothing to say
    assert markers({0: True, 1: False}, {0: 12}, now=61.0, settle=True) == {}
    # a partition no round has told of: not the timer either (a worker that never forwarded)
    assert markers({0: False, 1: False, 2: False}, {0: 9, 1: 4, 2: 8}, now=62.0, settle=True) == {}


def test_a_paused_partitions_markers_say_so_at_every_call() -> None:
    """The worker's timer tells a paused partition's progress, no round of its coming; a
    partition caught up is not told as paused (nothing of it waits for time)."""
    told = Told()
    for now in (0.0, 0.5):
        out = progress_markers("r", 2, {0: (True, 700), 1: (False, 900)}, {}, told, now,
                               one_producer=False, paused={0, 1})  # fmt: skip
        assert out[0][0][3] == b'{"m":[0,700,2]}' and orjson.loads(out[0][0][3])["m"][2] == PAUSED
    assert out.get(1) is None  # told at 0.0, not behind: not again within the refresh


def test_a_sole_owner_with_one_producer_tells_no_partition_behind_once_all_caught_up() -> None:
    """At least once, a worker that owns every partition forwards in the merged order: once all
    were caught up together, the regroup side need wait for none of them (a live partition is
    often behind by a fetch: no markers at every round). Not before: the regroup topic may
    still hold other workers' forwards to merge. Not with a partition of another worker's, nor
    exactly-once (a producer per partition)."""
    told = Told()

    def late(progress: dict[int, bool], one: bool = True, now: float = 0.0) -> dict[int, bool]:
        out = progress_markers(
            "r", 2, {p: (b, 5) for p, b in progress.items()}, {}, told, now, one_producer=one
        )
        return {p: orjson.loads(ms[0][3])["m"][2] for p, ms in out.items()}

    assert late({0: True, 1: False}) == {0: True, 1: False}  # catching up: told as it is
    assert late({0: False, 1: False}, now=0.1) == {0: False}  # all caught up: ordered from now on
    assert late({0: True, 1: True}, now=0.2) == {}  # behind by a fetch: nobody waits, nothing sent
    assert late({0: True}, now=0.3) == {0: True}  # partition 1 went to another worker
    assert late({0: True, 1: True}, now=0.4) == {0: True, 1: True}  # back, behind: told again
    told.sole = False
    late({0: False, 1: False}, now=5.0)
    assert late({0: True, 1: True}, one=False, now=5.1) == {0: True, 1: True}  # exactly-once


def test_the_least_time_a_partition_may_still_bring() -> None:
    merge = TimeMerge()
    assert merge.floor(P0) is None
    merge.add(P0, recs((0, 10), (1, 30), (2, 20)), now=0.0)  # times made non-decreasing: 10, 30, 30
    merge.take(1, lagging=(), now=0.0)
    assert merge.floor(P0) == 30  # its first waiting record's
    merge.take(5, lagging=(), now=0.0)
    assert merge.floor(P0) == 30  # none waits: the newest fetched


def test_a_longer_session_makes_the_forwards_wait_as_much_longer_for_a_partition_whose_time_stood() -> None:
    """A dead worker's partition is taken over (or its static replacement joins) only when its
    session ends: with a 60 s session the forwards still wait for it after 15 s, and leave,
    out of its way, 50 s later than by default. A session of 10 s or shorter changes nothing."""
    assert regroup_waits(10.0) == regroup_waits(6.0) == {"stale_s": STALE_S, "hold_s": REGROUP_HOLD_S}
    assert regroup_waits(60.0) == {"stale_s": STALE_S + 50, "hold_s": REGROUP_HOLD_S + 50}

    def first_left(session_s: float) -> float:
        merge = RegroupMerge(2, now=0.0, grace_s=0.0, **regroup_waits(session_s))
        merge.add(numbered([mark(1, 5, True), fwd(0, 0, 10)]), now=0.0)  # 1 behind, then silent
        return next(t for t in range(200) if merge.take(100, now=float(t)))

    assert first_left(10.0) == STALE_S
    assert first_left(60.0) == STALE_S + 50
