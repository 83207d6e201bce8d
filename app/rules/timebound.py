"""The event-time bound of one stream's partitions: which events the evaluator takes now,
which it holds until a second witness confirms their time, which it refuses
(docs/event-time.md has the whole policy; the ingest side is :mod:`app.eventtime`).

:class:`TimeBound` belongs to one :class:`~app.rules.evaluator.StreamEvaluator` and shares
its partition clocks; not thread-safe. Its state per partition (the clock, the held
events) is written to the evaluator's store as one record under :data:`CLOCK_KEY`, so the
live worker's changelog carries it across restarts and rule reloads. Compiled with the
evaluator (``app.runtime.native``): the common case is a comparison per event.
"""

from __future__ import annotations

import logging

from app.events import Event, format_ts, span
from app.rules.logic.base import State, StateStore
from app.rules.state import migrate_clock
from app.rules.statekey import CLOCK_PREFIX, clock_key

logger = logging.getLogger(__name__)

#: The state key prefix of a stream partition's clock record (see :meth:`StreamEvaluator.restore`)
CLOCK_KEY = CLOCK_PREFIX
#: events one partition holds at most while they wait for a second witness (docs/event-time.md)
MAX_HELD = 256
#: how far a partition's clock moves on without coming within the skew of a held event (and
#: without a witness) before that event is refused: a day of the partition's own time, far
#: more than events of several partitions merged into one regrouped stream run apart
HOLD_LIMIT_MS = 86_400_000

#: events refused for their time, each with the reason
Refused = list[tuple[Event, str]]


class _Held:
    """An event held for its time: whether the partition's previous event had its key, how
    many events the partition had admitted while some were held when it came, the
    partition clock then and the wall clock then (ms, -1: none)."""

    __slots__ = ("alone", "base", "event", "mark", "since")

    def __init__(self, event: Event, alone: bool, mark: int, base: int, since: int) -> None:
        self.event, self.alone, self.mark, self.base, self.since = event, alone, mark, base, since


class TimeBound:
    """The bound of one stream (``stream``: its name) at ``max_skew_ms`` (-1: off, and
    nothing here runs); ``clocks`` is the evaluator's dict of partition clocks."""

    def __init__(self, stream: str, max_skew_ms: int, store: StateStore, clocks: dict[int, int]) -> None:
        self.stream, self.skew, self.store, self.clocks = stream, max_skew_ms, store, clocks
        #: per partition: the events held until a second witness confirms their time, the
        #: events admitted since some were held, and the key of the last admitted event
        self.held: dict[int, list[_Held]] = {}
        self.counts: dict[int, int] = {}
        self.last_key: dict[int, str] = {}

    def restore(self, st: State) -> None:
        st = migrate_clock(st)
        partition, clock = int(st["partition"]), int(st["clock"])
        if clock >= 0:
            self.clocks[partition] = max(self.clocks.get(partition, clock), clock)
        self.last_key[partition] = str(st.get("last_key", ""))
        self.counts[partition] = int(st.get("admitted", 0))
        held = [
            _Held(Event(str(k), int(ts), dict(f)), bool(alone), int(mark), int(base), int(since))
            for k, ts, f, alone, mark, base, since in st.get("held", ())
        ]
        if held:
            self.held[partition] = held

    def save(self, partition: int) -> None:
        """Persist the partition's clock and held events in the store, as a state the rule
        worker's changelog carries (``partition``: its partition): a restart or a rule reload goes
        on from them instead of letting the next event start a new clock."""
        record: State = {"partition": partition, "clock": self.clocks.get(partition, -1)}
        record["last_key"] = self.last_key.get(partition, "")
        held = self.held.get(partition)
        if held:
            record["held"] = [
                [h.event.key, h.event.ts_ms, h.event.fields, h.alone, h.mark, h.base, h.since] for h in held
            ]
            record["admitted"] = self.counts.get(partition, 0)
        self.store.put(clock_key(self.stream, partition), record)

    def admit(
        self, events: list[Event], partition: int, now_ms: int, refused: Refused, save: bool
    ) -> tuple[list[Event], list[int]]:
        """The time bound (docs/event-time.md): which of ``events`` (in arrival order, on
        ``partition``) to evaluate now, in what order, with the partition clock at each.

        An event at most ``max_skew_ms`` ahead of the clock is evaluated as it comes. One
        further ahead is held (not evaluated) until a later event *confirms* it: one also
        more than the skew ahead of the clock, not more than the skew before it, with
        another key; or with the same key, when the partition's previous event had it too
        (one device talks on the partition) or no event was evaluated since (the partition
        moved on as a whole). Then it is evaluated, the clock jumps to it, and the
        confirming event is judged from there. Events in between are evaluated as they
        come; once the clock came within the skew of a held event, it is evaluated too, and
        once the clock moved on :data:`HOLD_LIMIT_MS` without that, it is refused. So no
        single event moves a clock by more than the skew. With ``now_ms`` (the live
        worker's wall clock, -1 for none), an event more than the skew ahead of it is
        refused at once, and one within the skew of it is its own witness. Refused events
        go to ``refused`` with the reason. A comparison per event while nothing is held;
        ``save``: write the partition's clock record (:meth:`save`) even then.
        """
        skew = self.skew
        clock = self.clocks.get(partition, -1)
        clocks: list[int] = []
        i, n = 0, len(events)
        if clock >= 0 and partition not in self.held:
            wall = now_ms + skew if now_ms >= 0 else -1
            limit = clock + skew
            if 0 <= wall < limit:
                limit = wall
            while i < n:
                ts = events[i].ts_ms
                if ts > clock:
                    if ts > limit:
                        break
                    clock = ts
                    limit = ts + skew
                    if 0 <= wall < limit:
                        limit = wall
                clocks.append(clock)
                i += 1
            if i == n:
                self.clocks[partition] = clock
                if save:
                    self.last_key[partition] = events[n - 1].key
                    self.save(partition)
                return events, clocks
        return self._admit_slowly(events, i, clocks, clock, partition, now_ms, refused)

    def _admit_slowly(
        self, events: list[Event], begin: int, clocks: list[int], clock: int, partition: int, now_ms: int,
        refused: Refused,
    ) -> tuple[list[Event], list[int]]:  # fmt: skip
        """:meth:`admit` from ``events[begin]`` on, with events held or to hold."""
        skew = self.skew
        admitted = events[:begin]
        held = self.held.pop(partition, [])
        count = self.counts.pop(partition, 0)  # events admitted while some were held
        last_key = events[begin - 1].key if begin else self.last_key.get(partition, "")
        queue = events[begin:]
        j = 0
        while j < len(queue):
            ev = queue[j]
            j += 1
            ts = ev.ts_ms
            if now_ms >= 0 and ts > now_ms + skew:
                self._refuse(ev, self._wall_reason(ev, now_ms), refused)
                continue
            if clock < 0 or ts <= clock + skew:
                admitted.append(ev)
                clock = max(clock, ts)
                clocks.append(clock)
                last_key = ev.key
                if held:
                    count += 1
                    caught_up = True  # held events the clock came within the skew of are ordinary now
                    while caught_up:
                        caught_up, waiting = False, []
                        for h in held:
                            if h.event.ts_ms <= clock + skew:
                                admitted.append(h.event)
                                clock = max(clock, h.event.ts_ms)
                                clocks.append(clock)
                                last_key, caught_up = h.event.key, True
                            else:
                                waiting.append(h)
                        held = waiting
                    while held and clock - held[0].base >= HOLD_LIMIT_MS:
                        why = f"; the clock moved on {span(clock - held[0].base)} since without a witness"
                        self._refuse(
                            held[0].event, self._ahead_reason(held[0].event, clock, partition, why), refused
                        )
                        del held[0]
                continue
            limit = ts + skew  # the held events at most this late are where ``ev`` says the time is
            confirmed = [h for h in held if h.event.ts_ms <= limit]
            witness = now_ms >= 0 and ts >= now_ms - skew  # the wall clock is a witness
            if confirmed and (
                witness or any(h.event.key != ev.key or h.alone or h.mark == count for h in confirmed)
            ):
                held = [h for h in held if h.event.ts_ms > limit]
                for h in confirmed:
                    admitted.append(h.event)
                    clock = max(clock, h.event.ts_ms)
                    clocks.append(clock)
                    last_key = h.event.key
                j -= 1  # ``ev`` again, from the clock it moved
                continue
            if witness:
                admitted.append(ev)
                clock = ts
                clocks.append(clock)
                last_key = ev.key
                continue
            if len(held) >= MAX_HELD:
                why = f"; {MAX_HELD} events were already held on the partition"
                self._refuse(ev, self._ahead_reason(ev, clock, partition, why), refused)
                continue
            held.append(_Held(ev, last_key == ev.key, count, clock, now_ms))
        if held:
            self.held[partition] = held
            self.counts[partition] = count
        if clock >= 0:
            self.clocks[partition] = clock
        self.last_key[partition] = last_key
        self.save(partition)
        return admitted, clocks

    @staticmethod
    def _refuse(ev: Event, reason: str, refused: Refused) -> None:
        refused.append((ev, reason))

    def _ahead_reason(self, ev: Event, clock: int, partition: int, why: str) -> str:
        return (
            f"event time {format_ts(ev.ts_ms)} is {span(ev.ts_ms - clock)} ahead of its partition's clock "
            f"{format_ts(clock)} (max skew {span(self.skew)}; stream {self.stream}, partition "
            f"{partition}){why}"
        )

    def _wall_reason(self, ev: Event, now_ms: int) -> str:
        return (
            f"event time {format_ts(ev.ts_ms)} is {span(ev.ts_ms - now_ms)} ahead of the wall clock "
            f"{format_ts(now_ms)} (max skew {span(self.skew)})"
        )

    def held_partitions(self) -> list[int]:
        """The partitions with events held for their time."""
        return sorted(self.held)

    def forget(self, partition: int) -> None:
        """Drop what memory holds of ``partition`` (its clock and held events): another worker
        owns it now, or its persisted record is about to be restored (:meth:`restore`)."""
        self.clocks.pop(partition, None)
        self.held.pop(partition, None)
        self.counts.pop(partition, None)
        self.last_key.pop(partition, None)

    def release(self, partition: int, now_ms: int, quiet_ms: int) -> list[Event]:
        """The live worker's end of a gap: when no event came to ``partition`` for
        ``quiet_ms`` of wall time since its first held event came (``now_ms``: the wall
        clock), that event starts a new period there. Returns the held events to evaluate
        (the first one now within the skew of the clock, the others to be judged again from
        it), or none."""
        held = self.held.get(partition)
        if not held:
            return []
        first, count = held[0], self.counts.get(partition, 0)
        if first.mark != count or first.since < 0 or now_ms - first.since < quiet_ms:
            return []
        del self.held[partition]
        self.counts.pop(partition, None)
        self.clocks[partition] = max(self.clocks.get(partition, first.event.ts_ms), first.event.ts_ms)
        return [h.event for h in held]

    def finish(self, refused: Refused) -> None:
        """The end of the input (a backtest's): every event still held is refused, as no later
        event can confirm it."""
        for partition in sorted(self.held):
            clock = self.clocks.get(partition, -1)
            for h in self.held.pop(partition):
                why = "; no later event on the partition confirmed it before the input ended"
                self._refuse(h.event, self._ahead_reason(h.event, clock, partition, why), refused)
            self.counts.pop(partition, None)
            self.save(partition)
