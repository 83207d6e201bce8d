"""The rule worker's per-(rule, group) state: kept in a Faust table's memory, written behind
to the table's changelog once per offset commit (:class:`TableStore`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator
from json.encoder import (
    encode_basestring_ascii as json_string,  # a str key as JSON, without orjson's allocation
)

import orjson
from faust.types import TableT

from agents.metrics import STATE_TOO_LARGE
from app.rules.evaluator import DictStore, State
from app.rules.state import partition_of
from app.rules.statekey import FORWARDED_PREFIX, StateKey

logger = logging.getLogger(__name__)

#: room left in a changelog record for Kafka's own fields (key length, headers, offsets)
RECORD_OVERHEAD_BYTES = 1024


def encode_state(value: State) -> bytes:
    """A rule state as the JSON its changelog record holds (read back by the table's JSON codec)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # an integer beyond 64 bits: the standard library writes it
        return json.dumps(value).encode()


def ordered(pending: dict[str, int]) -> Iterator[tuple[str, int]]:
    """The changed keys of a commit with the records of the last offsets evaluated
    (:func:`app.rules.statekey.forwarded_key`) last.

    A partition's changelog records go out in order, and Kafka appends a partition's record
    batches in order, so a crash that cuts the commit short leaves a prefix of them. With an
    offset's record first, a prefix could hold it without the states that count its events:
    the restart then dropped those events as evaluated, and they were counted nowhere. Last,
    the record is there only if the states are."""
    later: list[tuple[str, int]] = []
    for key, partition in pending.items():
        if key.startswith(FORWARDED_PREFIX):
            later.append((key, partition))
        else:
            yield key, partition
    yield from later


class TableStore:
    """A write-behind state store over a Faust table.

    The states live in the table's own memory dict. The evaluator reads and writes them
    through :attr:`store`, a compiled ``DictStore`` over that dict (its calls from the
    compiled evaluator are native), which records each key written or deleted. Writes
    land in the dict at once. :meth:`changes`, which the consumer runs before every
    offset commit (``RulesApp.commit_snapshot``, each second), turns each changed key
    into one changelog record, on the partition the
    evaluator stamped on the state (``partition``: the partition of the events that own it,
    as Faust would pick), and :class:`Outbox` sends them as record batches. A
    window rule updates its state on every event, so this turns one changelog
    record per rule and event into one per rule and group and commit, and the
    changelog always covers what the committed offsets say was processed.
    """

    def __init__(self, table: TableT[str, State], max_record_bytes: int) -> None:
        self.topic = table.changelog_topic.get_topic_name()
        live = getattr(table.data, "data", None)
        if not isinstance(live, dict):  # the worker's tables are memory:// stores
            msg = f"table {table.name}: expected an in-memory store, got {type(table.data).__name__}"
            raise TypeError(msg)
        self.live: dict[str, State] = live
        #: the store the evaluator writes to: the compiled DictStore over the table's dict,
        #: recording the keys changed since the last commit with their changelog partition
        self.store = DictStore(live, {})
        #: the largest state record the producer accepts (its max_request_size, less the
        #: key and the record's overhead)
        self.max_record_bytes = max_record_bytes
        #: keys whose state is too large for the changelog now (logged once until they fit)
        self.oversized: set[str] = set()

    def items(self) -> list[tuple[str, State]]:
        return list(self.live.items())

    def forget(self, partitions: Collection[int]) -> int:
        """Drop the states of ``partitions`` from memory, and their changes not yet written,
        without writing anything to the changelog; return how many states were dropped.

        For partitions that moved to another worker: the changelog is theirs now, and a
        change of ours written after the move would land behind the new owner's own and
        win at its next restore. And for partitions about to be restored from the
        changelog (read again to the last commit, then the input after it): a state
        kept in memory would carry the effect of events that are read again."""
        if not partitions:
            return 0
        wanted = set(partitions)
        pending = self.store.changed
        if pending:
            for key in [k for k, p in pending.items() if p in wanted]:
                del pending[key]
        gone = [k for k, v in self.live.items() if partition_of(v) in wanted]
        for key in gone:
            del self.live[key]
            self.oversized.discard(key)
        return len(gone)

    def changes(self) -> Iterator[tuple[str, int, bytes, bytes | None]]:
        """The changelog records of the keys changed since the last call, as
        ``(topic, partition, key, value)``; a deleted key's value is None (a tombstone).

        Each state is encoded as it is taken, so the consumer can copy it into a record
        batch at once instead of holding every blob of a commit: orjson's output costs
        ~3 µs more to allocate while many are alive. The changed keys are taken as the
        iteration starts; read it in one go (:meth:`Outbox.send_placed` does).

        A state too large for one Kafka record (one client IP's burst filling a
        sliding window, a long ``pct_change`` lookback of fast ticks) stays in
        memory, and its changelog record becomes a tombstone: the producer would
        refuse the record and stop the worker, and an older version left in the
        changelog would be restored beside replayed events after a restart. After a
        restart such a group starts again from the events since the last commit.
        ``worker_state_too_large_total`` counts these writes.
        """
        pending, self.store.changed = self.store.changed or {}, {}
        topic, live = self.topic, self.live
        # the offsets evaluated last go after the states that count them (:func:`ordered`)
        for key, partition in ordered(pending):
            value = live.get(key)
            raw_key = json_string(key).encode()  # the table's key codec (json) reads it back
            if value is None:
                self.oversized.discard(key)
                yield topic, partition, raw_key, None
                continue
            blob = encode_state(value)
            if len(blob) + len(raw_key) > self.max_record_bytes:
                STATE_TOO_LARGE.labels(StateKey.rule_of(key)).inc()
                if key not in self.oversized:
                    self.oversized.add(key)
                    logger.error(
                        "state %r is %d bytes, over the %d a changelog record may have: kept in "
                        "memory only until it shrinks (a restart starts it again from the events "
                        "since the last commit)", key, len(blob), self.max_record_bytes,
                    )  # fmt: skip
                yield topic, partition, raw_key, None
                continue
            if key in self.oversized:
                self.oversized.discard(key)
                logger.warning("state %r fits a changelog record again (%d bytes)", key, len(blob))
            yield topic, partition, raw_key, blob
