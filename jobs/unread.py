"""The state groups a restarted rules query no longer reads, and the alerts they hold open.

Spark calls a state group of ``applyInPandasWithState`` only in a micro-batch that has rows
for it: the query runs no timers. A restored group ends the open alerts of rules that no
longer run (:mod:`app.rules.retire`, as the worker's sweep does) at its next rows. But after
a rule change, a stream whose last Spark rule went gets no rows again, nor do the keyed
path's buckets once no keyed rule is left: the alerts firing in their states would never end,
and the dispatcher would repeat them.

So each start of the rules query (:func:`jobs.engine.start`) reads the checkpoint's state
store (Spark's state data source, ``statestore``) for the groups its plan will not read, ends
their open episodes as a restore would end them (the same ids; ``ends_at`` at the stream
partition's clock, or a keyed state's last event; ``values: {retired: true}``), and publishes
them before the query starts (:func:`retire_unread`).

A query cannot delete another query's state, so the groups' stored values stay. Their digests
are recorded as swept: a later query that reads such a group again (its stream back in the
rules) starts it afresh while the stored value is still the swept one
(:func:`jobs.state.evaluate`), as after the worker's sweep, which deleted the states.

The record, ``_groups.json`` in the checkpoint: the streams the last start's plan read and
whether it had keyed rules (a start that reads every group the last one read reads no state;
a checkpoint without the record is read once), and the swept groups' digests.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from app.alerts import Alert
from app.rules.logic.base import DictStore
from app.rules.retire import RulesRan, sweep
from app.runtime.statefile import write_json
from jobs import peers
from jobs.compile import SparkPlan
from jobs.state import DLQ_GROUP, STATE_SCHEMAS, decode_states
from jobs.streams import STREAM_PREFIX, is_stream_key, parse_stream_key, stream_keys

logger = logging.getLogger(__name__)

#: the record's file name in the checkpoint
GROUPS_FILE = "_groups.json"
#: at most this many swept groups are remembered (the newest)
MAX_SWEPT = 4096


@dataclass
class Groups:
    """The record: what the last start read, and the swept groups' digests (hex) by group."""

    streams: frozenset[str] | None = None  # None: no record (a checkpoint from before it)
    keyed: bool = True
    swept: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> Groups:
        try:
            found = json.loads(path.read_bytes())
            return cls(frozenset(found["streams"]), bool(found["keyed"]), dict(found["swept"]))
        except FileNotFoundError:
            return cls()
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("%s does not read (%r): the state is read again for unread groups", path, exc)
            return cls()

    def stale(self) -> dict[str, bytes]:
        """The swept digests as :func:`jobs.state.evaluate` compares them."""
        return {group: bytes.fromhex(d) for group, d in self.swept.items()}


def unread_after(before: Groups, plan: SparkPlan) -> bool:
    """Whether ``plan`` leaves unread a group the last start's plan read (or, with no record,
    may leave one): only then is the state read."""
    if before.streams is None:
        return True
    gone_streams = before.streams - {s.name for s in plan.streams}
    return bool(gone_streams) or (before.keyed and not plan.rules)


def end_open(
    rows: Iterable[tuple[str, str | bytes]], ran: RulesRan, swept: Mapping[str, str]
) -> tuple[list[Alert], dict[str, str]]:
    """The unread groups' stored values (group, value) -> the transitions that end their open
    episodes, in group order, and the digests (hex) of the values swept now. A value already
    swept (``swept``) is passed over: its alerts ended at an earlier start."""
    alerts: list[Alert] = []
    digests: dict[str, str] = {}
    for group, stored in sorted(rows, key=lambda r: r[0]):
        digest = peers.digest(stored).hex()
        if swept.get(group) == digest:
            continue
        digests[group] = digest
        states = decode_states(stored)
        if is_stream_key(group):  # the stream partition's evaluator, as StreamRunner restores it
            _, partition = parse_stream_key(group)
            found = [
                sweep(DictStore(dict(st["s"])), partition, [], ran, clock=st.get("c"), keep_records=False)
                for st in states.values()
            ]
        else:  # a keyed bucket: each state ends at its last event, as GroupRunner.current ends it
            items = list(states.items())
            found = [sweep(DictStore(dict(states)), 0, [], ran, items=items, keep_records=False)]
        for done in found:
            alerts += done.alerts
            for key in done.unended:
                logger.warning("state %r of a rule no longer running is left; its alert is not ended", key)
    return alerts, digests


def retire_unread(
    spark: SparkSession, plan: SparkPlan, checkpoint: Path, partitions: int, codec: str, ran: RulesRan,
    publish: Callable[[list[Alert]], None], split: int = 1,
) -> dict[str, bytes]:  # fmt: skip
    """End the open alerts of the groups ``plan`` will not read (see the module's doc), publish
    them, and record the plan's groups; the swept digests, for the query's state function.

    The state is read only when ``plan`` leaves a group unread that the last start read. A
    state that cannot be read is logged and left (``alerts list`` marks such alerts retired);
    a failed publish raises, before the record says anything was swept."""
    path = checkpoint / GROUPS_FILE
    before = Groups.read(path)
    swept = dict(before.swept)
    if unread_after(before, plan) and (checkpoint / "state").is_dir():
        logger.info("reading the state of %s for groups the rules no longer read", checkpoint)
        try:
            rows = _unread_rows(spark, plan, checkpoint, partitions, codec, split)
        except Exception as exc:  # the state data source's error: the query itself may still run
            logger.warning("the state of %s could not be read for unread groups: %r", checkpoint, exc)
            rows = []
        alerts, digests = end_open(rows, ran, swept)
        if alerts:
            publish(alerts)
            logger.info(
                "ended %d open alert(s) held by state groups the rules no longer read: %s",
                len(alerts),
                ", ".join(sorted({a.rule_id for a in alerts})),
            )
        swept.update(digests)
    swept = dict(list(swept.items())[-MAX_SWEPT:])
    record = {"streams": sorted(s.name for s in plan.streams), "keyed": bool(plan.rules), "swept": swept}
    write_json(path, record)
    return Groups(swept=swept).stale()


def _unread_rows(
    spark: SparkSession, plan: SparkPlan, checkpoint: Path, partitions: int, codec: str, split: int = 1
) -> list[tuple[str, Any]]:
    """(group, stored value) of every group in the state that ``plan`` will not read: a stream
    partition (or part, ``split``) of no stream of the plan, and with no keyed rule in it, the
    keyed buckets."""
    read = [k for s in plan.streams for k in stream_keys(s.name, partitions, split)]
    group = F.col("key").getField("__bucket")
    stream = group.startswith(STREAM_PREFIX)
    unread = stream & ~group.isin(read)
    if not plan.rules:
        unread = unread | (~stream & (group != DLQ_GROUP))
    value = F.col("value").getField("groupState").getField(STATE_SCHEMAS[codec].split()[0])
    spark.streams.active  # noqa: B018 - makes the driver's state store coordinator, which the read needs
    state = spark.read.format("statestore").load(str(checkpoint))
    return [(r[0], r[1]) for r in state.where(unread).select(group, value).collect() if r[1] is not None]
