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
bring an earlier one has not shown its time: one of the topic's partitions this worker owns
whose fetch position is behind its end (a caught-up partition brings only newer records). Live,
every partition is caught up after each fetch, and nothing waits. A record waits at most
:data:`HOLD_S` (a lagging partition's leader slow to answer, a paused partition), and at most
:data:`MAX_HELD` records wait per topic, the oldest leaving first.

The handler of a round (``agents.wiring``) runs each partition's records as before and
forwards the events merged by record time, then event time. Records waiting here are not
processed: the offsets committed stop before them, and a rebalance or a seek, which drops
them, reads them again.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple, TypedDict

#: how long a fetched record waits for a lagging partition, in seconds; checked as each fetch
#: returns, and Faust's fetch loop returns at least once a second, so a wait ends within 2 s
HOLD_S = 1.0
#: most records waiting per topic; past it the oldest leave without waiting
MAX_HELD = 50_000
#: the regroup side (:class:`RegroupMerge`): how long a source partition it has had no
#: progress of, since it began merging, counts as one that may still bring earlier events.
#: After a rebalance, the other workers recover, run a round and (exactly-once) commit before
#: their first markers are read: 2 s was too short under the test suite's load
GRACE_S = 10.0
#: the regroup side: a source partition whose time has not moved on for this long holds
#: nothing back (its worker hangs, or its fetch does: a working one that is behind sends a
#: later time each round). Longer than the group's session timeout (10 s by default): a worker
#: killed in a catch-up has its partitions taken over, and the waiting forwards read again,
#: before anything leaves out of order. A longer session lengthens it (:func:`regroup_waits`)
STALE_S = 15.0
#: the regroup side: the longest a forward waits, whatever the progress says (also lengthened
#: by a longer session)
REGROUP_HOLD_S = 30.0
#: the worker group's default session (``APP_WORKER_SESSION_TIMEOUT``), which the two above exceed
DEFAULT_SESSION_S = 10.0
#: the regroup side: how long a source partition's "caught up" is trusted once heard. Past it, with
#: forwards to let go, the partition's end is read from the broker and compared with the offset
#: its marker said it had reached (:meth:`RegroupMerge.unconfirmed`). A working worker tells a
#: partition whose position moved within about 1.5 s (``agents.wiring.PROGRESS_REFRESH_S``, and
#: its 0.5 s timer), so this is rarely needed but for one that stalled
CONFIRM_S = 2.0
#: backpressure (:class:`Pacer`): past this share of a regroup partition's most waiting forwards
#: (``APP_REGROUP_MAX_WAITING``) forwarded by one worker and still waiting, it pauses its source
#: partitions that are ahead, until fewer than :data:`RESUME_SHARE` of it wait
PAUSE_SHARE = 0.4
RESUME_SHARE = 0.2
#: a progress marker's ``behind`` for a partition whose fetch is paused (:class:`Pacer`): it is
#: behind, and its time stands still on purpose, so it does not go stale (an earlier worker
#: reads it as behind)
PAUSED = 2
#: the most round ends :class:`Pacer` remembers per source partition (the oldest are forgotten)
PACER_ROUNDS = 10_000


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

    def __init__(self, hold_s: float = HOLD_S, max_held: int = MAX_HELD, *, strict: bool = False) -> None:
        self.hold_s = hold_s
        self.max_held = max_held
        #: whether records at the very time a lagging partition has shown wait too (see
        #: :meth:`take`): the regroup side's, not the source side's
        self.strict = strict
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

    def shown(self, tp: Hashable) -> int | None:
        """The newest time ``tp`` has shown (None: none yet): none of its records still to come
        is earlier."""
        return self._last.get(tp)

    def floor(self, tp: Hashable) -> int | None:
        """The least time ``tp`` may still bring: its first waiting record's, else the newest
        it has fetched (its records are made non-decreasing); None when it fetched none."""
        part = self._parts.get(tp)
        if part is not None and part.waiting:
            return part.times[part.start]
        return self._last.get(tp)

    def first_waiting_offset(self) -> int | None:
        """The least offset of any partition's first waiting record (None when none waits)."""
        return min((p.records[p.start].offset for p in self._parts.values() if p.waiting), default=None)

    def show(self, tp: Hashable, time: int) -> None:
        """``tp`` has shown ``time``: none of its records still to come is earlier (the regroup
        side's progress markers, :class:`RegroupMerge`)."""
        if time > self._last.get(tp, -(2**63)):
            self._last[tp] = time

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
        # strict: a lagging partition may still bring records at the time it has shown (the
        # same millisecond) with earlier event times, so what is not earlier waits for it. The
        # source side lets that millisecond go: its next fetch rarely brings more of it, and
        # live, waiting for that fetch cost the alerts of every rule a few ms (docs/worker.md)
        shown = min((self._last.get(tp, -(2**63)) for tp in lagging if tp not in skip), default=None)
        bound = shown - self.strict if shown is not None else None
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


class Forwarded(NamedTuple):
    """A forward waiting on the regroup side: its source record time (``timestamp``, what
    :class:`TimeMerge` merges by), its regroup record's offset, its merge order (``"o"``) and
    its message."""

    timestamp: int
    offset: int
    order: tuple[int, ...]
    msg: dict[str, Any]


class Heard(NamedTuple):
    """What the regroup side holds of a source partition's progress (:class:`RegroupMerge`)."""

    #: whether its last marker said it may still bring records (or a check found it had)
    behind: bool
    #: the least record time it may still bring, as its marker showed
    shown: int
    #: when its time last moved on, or it came to be behind (monotonic)
    since: float
    #: when its last marker was written (the record's timestamp, on this clock's monotonic
    #: axis: see :meth:`RegroupMerge.add`), or a read of its end confirmed it
    heard: float
    #: the source offset it had reached, as its marker said (None: a marker of an earlier release)
    reached: int | None


class RegroupWaits(TypedDict):
    stale_s: float
    hold_s: float


def regroup_waits(session_s: float) -> RegroupWaits:
    """The regroup side's ``stale_s`` and ``hold_s`` for a worker group whose session is
    ``session_s``: each as much longer than its default as the session is longer than 10 s.

    A dead worker's partitions wait for its session to end (or, a static member, for its
    replacement): the forwards of the other partitions wait for them that long too, instead of
    leaving after 15 s, ahead of events that would then come late. The price, only with a longer
    session: while a worker is away, regrouped rules wait for it (backpressure bounds the
    memory, :class:`Pacer`)."""
    longer = max(0.0, session_s - DEFAULT_SESSION_S)
    return RegroupWaits(stale_s=STALE_S + longer, hold_s=REGROUP_HOLD_S + longer)


class RegroupMerge:
    """One regroup partition's forwards, merged across the source partitions they came from.

    Why. Each worker merges only the source partitions it owns (:class:`TimeMerge`). When
    several workers catch up a backlog together, each forwards its own partitions' events at
    its own pace, and a regroup partition took them as they came: the regrouped windows and
    sequences took one worker's events for late ones beside the other's (8,000 log lines on
    two workers: 952 transitions where the backtest gives 1,584).

    How. A worker's round ends with a *progress marker* per source partition it owns, sent to
    every regroup partition behind that round's forwards (``{"m": [partition, time, behind]}``,
    ``agents.wiring``): the least record time it may still bring, and whether it may still
    bring more (behind its end, or records waiting in its :class:`TimeMerge`). Here the
    forwards wait per source partition, as the source side's records do, and leave in record
    time order before the time every source partition that is *lagging* has shown: one whose
    last marker said behind and whose time moved on within :data:`STALE_S` (or that said
    :data:`PAUSED` within it), or, for
    :data:`GRACE_S` after this merge began, one it has heard nothing of. A partition that is
    caught up holds nothing back (nor, at least once, does a worker that owns every source
    partition, once caught up: ``agents.wiring.progress_markers``); nor does one stuck at a time
    (its worker stopped, hangs, or cannot fetch).

    A "caught up" is true when it is told, and goes stale: a worker stopped while its partition
    was idle told it last, and a burst may be waiting there when it wakes, earlier than the
    others' forwards. So each marker also says the source offset its partition had reached
    (``"n"``), and a caught-up partition not heard of for :data:`CONFIRM_S` is confirmed
    before forwards leave past it (:meth:`unconfirmed`, then :meth:`confirm` with its end read
    from the broker): its end beyond that offset makes it lagging from then on, until its
    worker tells it again or its time goes stale. Idle, none of this costs anything: no marker
    is sent, no end is read. A partition never heard of past the grace (its worker has run no
    round since it started) is checked the same way, against the offset its worker starts from
    (:meth:`unheard`).

    A forward waits at most :data:`REGROUP_HOLD_S`, and
    at most ``max_held`` wait (``APP_REGROUP_MAX_WAITING``), the oldest leaving first. Forwards
    without a merge order or source offset (an older worker's) go as they came.

    Too many waiting: see :class:`Pacer`."""

    def __init__(
        self, sources: int, now: float, *, grace_s: float = GRACE_S, stale_s: float = STALE_S,
        hold_s: float = REGROUP_HOLD_S, max_held: int = MAX_HELD, confirm_s: float = CONFIRM_S,
    ) -> None:  # fmt: skip
        self.sources = sources
        self.started = now
        self.grace_s, self.stale_s, self.confirm_s = grace_s, stale_s, confirm_s
        self.merge = TimeMerge(hold_s, max_held, strict=True)
        #: per source partition, what its markers said (:class:`Heard`)
        self.progress: dict[int, Heard] = {}
        #: per regrouped stream and source partition, the last source offset taken in
        self._sent: dict[tuple[str, int], int] = {}
        #: forwards dropped as copies of ones taken in before (see :meth:`add`)
        self.copies = 0
        #: per source partition never heard of, when a read last found it had nothing unread
        self._unheard_checked: dict[int, float] = {}

    @property
    def waiting(self) -> int:
        return self.merge.waiting

    @property
    def forced(self) -> int:
        """Forwards let go before the lagging partitions showed their time (held too long, or
        too many)."""
        return self.merge.forced

    def add(
        self,
        records: Iterable[tuple[int, dict[str, Any], int | None]],
        now: float,
        wall_ms: int | None = None,
    ) -> list[dict[str, Any]]:
        """A batch of the regroup partition, ``(offset, message, written_ms)`` in offset order,
        arrives at ``now``: the markers are taken and the forwards wait. Returns the messages
        that go as they came (no merge order).

        ``written_ms``: the record's Kafka timestamp (when its worker wrote it, on that
        worker's clock; None: unknown), and ``wall_ms`` this clock's time now. A marker counts as heard
        when it was written, not when it is read: a regroup partition read again after its
        owner died holds the dead worker's last markers, and a "caught up" read there as new
        was trusted for :data:`CONFIRM_S` while the whole backlog behind it left, past a
        source partition whose worker had died too (its records came later, too late for the
        rules' lateness: ``bench/chaos_workers.py --seed 3 --only kill``, docs/worker.md). Such
        a marker is confirmed against the partition's end at once (:meth:`unconfirmed`).

        A forward at or before the last source offset of its stream and source partition
        taken in is a copy (a source partition read again from its committed offset, by its
        new owner after a crash), dropped here rather than held: the worker that took a dead
        one's partitions over forwarded thousands of them, and held, they counted towards
        ``max_held``, whose forced release then let forwards go out of order. The copies of
        forwards taken in before this merge began are dropped at evaluation
        (``agents.wiring.first_forwards``)."""
        passing: list[dict[str, Any]] = []
        runs: dict[int, list[Forwarded]] = {}  # per source partition, its forwards since its marker
        for offset, msg, written in records:
            mark = msg.get("m")
            if mark is not None:
                source, shown, behind = mark
                self._flush(runs, source, now)  # its forwards came before, at their own times
                self.merge.show(source, shown)
                before = self.progress.get(source)
                if before is None or not before.behind or shown > before.shown or behind == PAUSED:
                    since = now  # its time moved on, or stands still on purpose
                else:
                    since = before.since
                heard = now
                if wall_ms is not None and written is not None and written > 0:  # Kafka's -1: none, as if now
                    heard -= max(0.0, (wall_ms - written) / 1000)  # a clock ahead of this one: as if now
                self.progress[source] = Heard(bool(behind), shown, since, heard, msg.get("n"))
                continue
            order, sent = msg.get("o"), msg.get("f")
            if order is None or sent is None:
                passing.append(msg)
                continue
            where = (msg["s"], sent[0])
            if sent[1] <= self._sent.get(where, -1):
                self.copies += 1
                continue
            self._sent[where] = sent[1]
            runs.setdefault(sent[0], []).append(Forwarded(order[0], offset, tuple(order), msg))
        for source in list(runs):
            self._flush(runs, source, now)
        return passing

    def _flush(self, runs: dict[int, list[Forwarded]], source: int, now: float) -> None:
        run = runs.pop(source, None)
        if run:
            self.merge.add(source, run, now)

    def lagging(self, now: float) -> list[int]:
        """The source partitions that may still bring forwards earlier than those waiting."""
        out = []
        for source in range(self.sources):
            seen = self.progress.get(source)
            if seen is None:
                if now - self.started < self.grace_s:
                    out.append(source)
            elif seen.behind and now - seen.since < self.stale_s:
                out.append(source)
        return out

    def unconfirmed(self, now: float, skip: Collection[int] = ()) -> dict[int, int]:
        """With forwards waiting: the source partitions told caught up whose word is too old to
        let them go past (heard of :data:`CONFIRM_S` ago or more), each with the offset it had
        reached. Not those in ``skip`` (the caller's, when it is their sole ordered owner).

        The caller's own partitions are checked too: a worker woken after a stop may read the
        others' forwards after its own source round has forwarded the burst that came
        meanwhile, but before it has read those forwards back."""
        if not self.merge.waiting:
            return {}
        return {
            source: seen.reached
            for source, seen in self.progress.items()
            if not seen.behind and seen.reached is not None and source not in skip
            and now - seen.heard >= self.confirm_s
        }  # fmt: skip

    def unheard(self, now: float, skip: Collection[int] = ()) -> list[int]:
        """With forwards waiting, past the grace: the source partitions never heard of (their
        worker has run no round since it started: all its partitions idle), unchecked for
        :data:`CONFIRM_S`. Not those in ``skip``. Such a partition holds nothing back, so a
        burst that came to it while its worker stalled would be late behind the others'
        forwards; :meth:`confirm` checks its end against where its worker starts from."""
        if not self.merge.waiting or now - self.started < self.grace_s:
            return []
        return [
            source for source in range(self.sources)
            if source not in self.progress and source not in skip
            and now - self._unheard_checked.get(source, -self.confirm_s) >= self.confirm_s
        ]  # fmt: skip

    def confirm(
        self, ends: Mapping[int, int], now: float, starts: Mapping[int, int] | None = None
    ) -> set[int]:
        """The ends of source partitions read at ``now`` (:meth:`unconfirmed`): one whose end is
        beyond the offset its caught-up marker said it had reached, and beyond its forwards
        taken in here, has records its worker has not told of (stopped, or hung), and lags from
        now: forwards later than its time wait for its next marker, or until its time goes
        stale (:data:`STALE_S`). The others are confirmed until :data:`CONFIRM_S` from now.
        Returns those that lag.

        ``starts``: for source partitions never heard of (:meth:`unheard`), the offset their
        worker starts from (its group's committed offset, or the partition's start): an end
        beyond it is records their worker has not evaluated, so they lag from now, with no time
        shown yet (every forward waits for their first marker, or :data:`STALE_S`)."""
        lagging = set()
        for source, start in (starts or {}).items():
            end = ends.get(source)
            if source in self.progress or end is None:
                continue
            if end <= start:
                self._unheard_checked[source] = now
            else:
                self.progress[source] = Heard(True, -(2**63), now, now, None)
                lagging.add(source)
        for source, end in ends.items():
            seen = self.progress.get(source)
            if seen is None or seen.behind or seen.reached is None:
                continue
            # its forwards taken in since its marker went that far too (a round within the
            # refresh of the last marker sends none)
            sent = max((offset + 1 for (_, s), offset in self._sent.items() if s == source), default=0)
            if end <= max(seen.reached, sent):
                self.progress[source] = seen._replace(heard=now)
            else:
                self.progress[source] = seen._replace(behind=True, since=now, heard=now)
                lagging.add(source)
        return lagging

    def bound(self, now: float, own: Mapping[int, tuple[bool, int]] | None = None) -> int | None:
        """The least time a lagging source partition has shown: every forward later than it
        waits (None: none lags; ``-2**63``: one has shown nothing yet, all wait). ``own``: the
        partitions the caller owns, whether each is behind and its time now, fresher than their
        markers read here so far."""
        own = own or {}
        times = [self.merge.shown(source) for source in self.lagging(now) if source not in own]
        times += [time for behind, time in own.values() if behind]
        return min((-(2**63) if t is None else t for t in times), default=None)

    def take(self, budget: int, now: float) -> list[dict[str, Any]]:
        """Every forward no lagging source partition may still precede, in merge order, in
        rounds of about ``budget``."""
        lagging = self.lagging(now)
        out: list[dict[str, Any]] = []
        while parts := self.merge.take(budget, lagging, now):
            out.extend(f.msg for f in heapq.merge(*(run for _, run in parts), key=attrgetter("order")))
        return out

    def first_offset(self) -> int | None:
        """The offset of the earliest regroup record still waiting (None: none waits): the
        commit stops before it, so a crash or a rebalance reads it again."""
        return self.merge.first_waiting_offset()


class Pacer:
    """Backpressure: when to pause the fetch of a source's partitions this worker owns.

    Why. A regroup partition holds the forwards of the source partitions that are ahead while
    a lagging one's worker is slow, or dead until the group gives its partitions to another
    (the session timeout, 10 s): meanwhile the others race on, and past ``max_held`` the
    oldest forwards leave out of order. Counting what waits on the regroup side would not do:
    the dead worker's regroup partitions are read by nobody until the takeover, and then hold
    everything the others forwarded meanwhile.

    How. The source side counts what it forwarded, per partition and round, by record time
    (:meth:`sent`). Every forward later than the least time a lagging partition has shown
    (:meth:`RegroupMerge.bound`, from the markers every regroup partition receives) waits
    somewhere: in a regroup partition's merge, or in Kafka. From ``pause_at`` of those from
    this worker's partitions, :meth:`pace` names the partitions that sent them, and the worker
    pauses their fetch until fewer than ``resume_at`` wait. The partition whose time holds the
    others back has none later than its own, so it is never paused: its progress always lets
    the waiting go. A pause ends too when no partition lags any more (one whose time has not
    moved for :data:`STALE_S` does not)."""

    def __init__(self, max_held: int = MAX_HELD) -> None:
        self.pause_at, self.resume_at = max(1, int(max_held * PAUSE_SHARE)), int(max_held * RESUME_SHARE)
        #: per source partition: the record time each round's forwards reached, and how many
        #: forwards were sent up to it (the count before the first one remembered in ``_base``)
        self._times: dict[int, list[int]] = {}
        self._counts: dict[int, list[int]] = {}
        self._base: dict[int, int] = {}
        #: past ``pause_at`` waiting, and not yet back under ``resume_at``
        self.pressing = False

    def sent(self, partition: int, time: int, count: int) -> None:
        """A round forwarded ``count`` records of ``partition``, up to record time ``time``."""
        if not count:
            return
        times, counts = self._times.setdefault(partition, []), self._counts.setdefault(partition, [])
        total = counts[-1] if counts else self._base.get(partition, 0)
        if times and times[-1] >= time:  # the same time again (or a replay's): one entry
            counts[-1] = total + count
        else:
            times.append(time)
            counts.append(total + count)
        if len(times) > PACER_ROUNDS:
            self._base[partition] = counts[0]
            del times[0], counts[0]

    def waiting(self, bound: int) -> dict[int, int]:
        """Per source partition, the forwards sent later than ``bound`` (none: not listed)."""
        out = {}
        for partition, times in self._times.items():
            counts, i = self._counts[partition], bisect_right(times, bound)
            before = counts[i - 1] if i else self._base.get(partition, 0)
            if counts and counts[-1] > before:
                out[partition] = counts[-1] - before
        return out

    def idle(self) -> bool:
        """Whether :meth:`pace` would name no partition whatever the bound: not pausing, and
        fewer than ``resume_at`` forwards sent since the last bound paced by (live, nearly
        always: the bound is then worked out once per ``resume_at`` forwards)."""
        return not self.pressing and sum(self.waiting(-(2**63)).values()) < self.resume_at

    def pace(self, bound: int | None) -> set[int]:
        """The source partitions whose fetch should pause, given the least time a lagging
        partition has shown (None: none lags, and nothing waits for time)."""
        if bound is None:  # what was sent so far waits for no time: it has left, or leaves now
            self.pressing = False
            self._forget_before(2**63)  # else, live with nothing lagging, never idle again
            return set()
        self._forget_before(bound)
        waiting = self.waiting(bound)
        total = sum(waiting.values())
        if total >= self.pause_at:
            self.pressing = True
        elif total < self.resume_at:
            self.pressing = False
        return set(waiting) if self.pressing else set()

    def _forget_before(self, bound: int) -> None:
        """Forget the rounds that ended at or before ``bound``: their forwards have left. After
        a rebalance, a new merge's bound may be earlier for a while: they still count as gone."""
        for partition, times in self._times.items():
            if i := bisect_right(times, bound):
                self._base[partition] = self._counts[partition][i - 1]
                del times[:i], self._counts[partition][:i]

    def forget(self, partitions: Collection[int]) -> None:
        """``partitions`` left this worker or came to it: their forwards are counted afresh."""
        for partition in partitions:
            self._times.pop(partition, None)
            self._counts.pop(partition, None)
            self._base.pop(partition, None)
