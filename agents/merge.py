"""A source topic's partitions merged by record time before the rule worker takes them.

Why. Rules grouped by another field than the topic key (``group_by: [client_ip]`` on logs
keyed by host, or no ``group_by``) run on a regroup topic: the worker forwards each event
there as it evaluates its source partition, so a regrouped stream meets its events in the
order they were forwarded. Live, that is about the order they happened. In a catch-up (a
worker started late or restarted behind a backlog), a fetch brings each partition's backlog
in turn, and the worker forwarded one partition's events before the next one's: every later
partition went back in time by the backlog's span, and the regrouped windows, absences and
sequences took its events for late ones (1,200 time-ordered log lines from two partitions:
142 transitions where the backtest gives 233).

How. The records a fetch brings of such a topic wait here, per partition (:class:`TimeMerge`),
and leave in *rounds*: every waiting record up to a cut time, at most about a batch of them,
taken from each partition in offset order. The time is Kafka's record timestamp (when the
event reached its topic: the Spark engine merges by the same, ``jobs.state.arrival_order``),
made non-decreasing along each partition. A record waits while a partition that may still
bring an earlier one has not: one of the topic's partitions this worker owns whose fetch
position is behind its end (a caught-up partition brings only newer records). Live, every
partition is caught up after each fetch, and nothing waits. A record waits at most
:data:`HOLD_S` (a lagging partition's leader slow to answer, a paused partition), and at most
:data:`MAX_HELD` records wait per topic, the oldest leaving first.

The handler of a round (``agents.wiring``) runs each partition's records as before and
forwards the events merged by record time, then event time. Records waiting here are not
processed: the offsets committed stop before them, and a rebalance or a seek, which drops
them, reads them again.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: how long a fetched record waits for a lagging partition, in seconds; checked as each fetch
#: returns, and Faust's fetch loop returns at least once a second, so a wait ends within 2 s
HOLD_S = 1.0
#: most records waiting per topic; past it the oldest leave without waiting
MAX_HELD = 50_000
#: records a partition is behind its end for a catch-up (a fetch brings a few thousand)
BACKLOG_RECORDS = 1_000


def split_catch_up(owned: int, total: int, behind: Iterable[int]) -> bool:
    """Whether this worker catches up a backlog (one of its ``owned`` partitions ``behind`` its
    end by :data:`BACKLOG_RECORDS` or more) of a source with a regrouped stream while other
    workers own the rest of its ``total`` partitions. Each worker merges only its own
    partitions by time and forwards at its own pace, so the regrouped rules then take the
    workers' forwards out of time order, and lose and invent alerts (docs/rules.md,
    Partitioning: catch up with one worker, then scale out)."""
    return 0 < owned < total and any(n >= BACKLOG_RECORDS for n in behind)


@dataclass
class _Part:
    """One partition's waiting records: ``records[start:]``, their times (the running maximum
    of the record timestamps), and when each fetch's records arrived (``(end, monotonic)``)."""

    records: list[Any] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    start: int = 0
    arrivals: list[tuple[int, float]] = field(default_factory=list)

    @property
    def waiting(self) -> int:
        return len(self.records) - self.start

    def expired_end(self, before: float) -> int:
        """The end of the records that arrived at or before ``before`` (monotonic)."""
        end = self.start
        for stop, when in self.arrivals:
            if when > before:
                break
            end = stop
        return max(end, self.start)

    def take(self, count: int) -> list[Any]:
        out = self.records[self.start : self.start + count]
        self.start += count
        self.arrivals = [(stop, when) for stop, when in self.arrivals if stop > self.start]
        if self.start >= 4096 and self.start * 2 >= len(self.records):  # compact now and then
            del self.records[: self.start], self.times[: self.start]
            self.arrivals = [(stop - self.start, when) for stop, when in self.arrivals]
            self.start = 0
        return out


class TimeMerge:
    """The waiting records of one topic's partitions (see the module)."""

    def __init__(self, hold_s: float = HOLD_S, max_held: int = MAX_HELD) -> None:
        self.hold_s = hold_s
        self.max_held = max_held
        self._parts: dict[Hashable, _Part] = {}
        #: per partition, the newest record time fetched (waiting or gone): what a lagging
        #: partition has shown so far, none earlier is still to come
        self._last: dict[Hashable, int] = {}
        #: records let go past the lagging partitions' time (held too long, or too many)
        self.forced = 0

    @property
    def waiting(self) -> int:
        return sum(p.waiting for p in self._parts.values())

    def next_offset(self, tp: Hashable) -> int | None:
        """The offset after ``tp``'s last waiting record (None when none waits)."""
        part = self._parts.get(tp)
        return part.records[-1].offset + 1 if part is not None and part.waiting else None

    def first_offset(self, tp: Hashable) -> int | None:
        """The offset of ``tp``'s first waiting record (None when none waits)."""
        part = self._parts.get(tp)
        return part.records[part.start].offset if part is not None and part.waiting else None

    def add(self, tp: Hashable, records: list[Any], now: float) -> None:
        """``tp``'s fetched ``records`` (offset order, after those waiting) arrive at ``now``."""
        if not records:
            return
        part = self._parts.setdefault(tp, _Part())
        newest = self._last.get(tp, -(2**63))
        for r in records:
            ts = r.timestamp
            if ts is not None and ts > newest:
                newest = ts
            part.times.append(newest)
        part.records.extend(records)
        part.arrivals.append((len(part.records), now))
        self._last[tp] = newest

    def drop(self, tps: Collection[Hashable] | None = None) -> None:
        """Forget the waiting records of ``tps`` (all: None): they will be fetched again."""
        for tp in list(self._parts) if tps is None else tps:
            self._parts.pop(tp, None)
            self._last.pop(tp, None)

    def take(
        self, budget: int, lagging: Collection[Hashable], now: float, skip: Collection[Hashable] = ()
    ) -> list[tuple[Any, list[Any]]]:
        """The next round: per partition, its records up to the cut time, in offset order; empty
        when every waiting record waits. ``lagging``: the partitions that may still bring
        earlier records than they have shown; ``skip``: partitions not to take from now
        (paused), which hold nothing back."""
        parts = {tp: p for tp, p in self._parts.items() if p.waiting and tp not in skip}
        if not parts:
            return []
        bound = min((self._last.get(tp, -(2**63)) for tp in lagging if tp not in skip), default=None)
        limit = bound if bound is not None else 2**63
        # records that waited too long leave, with every earlier one of the other partitions
        for p in parts.values():
            end = p.expired_end(now - self.hold_s)
            if end > p.start:
                limit = max(limit, p.times[end - 1])
        over = sum(p.waiting for p in parts.values()) - self.max_held
        if over > 0:  # the oldest leave until the rest fits
            limit = max(limit, _cut([p.times[p.start : p.start + over] for p in parts.values()], over))
        heads = [p.times[p.start : p.start + budget] for p in parts.values()]
        cut = min(limit, _cut(heads, budget))
        out = []
        for tp, p in parts.items():
            count = bisect_right(p.times, cut, p.start) - p.start
            if bound is not None and cut > bound:
                self.forced += count - (bisect_right(p.times, bound, p.start) - p.start)
            if count:
                out.append((tp, p.take(count)))
        return out


def _cut(heads: list[list[int]], count: int) -> int:
    """The time of the ``count``-th earliest of the sorted ``heads`` (the latest when fewer):
    a round takes every record up to it, so equal times are never split."""
    merged = sorted(t for head in heads for t in head)
    return merged[min(count, len(merged)) - 1]
