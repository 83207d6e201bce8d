"""Publish registry records to their compacted table topic, with deletes and pruning.

:func:`load_table` upserts every record (key -> JSON), sends a tombstone
(``None`` value) for each deleted key, and with ``prune`` also for every key
that is on the topic but no longer in the file. It returns once the broker
acknowledged every record. Re-loading the same file is harmless: the latest
record per key wins, and compaction keeps only that one.

:func:`read_table` reads a table topic from the beginning to its current end
and returns the live rows (the latest value per key, tombstoned keys removed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from app.errors import BrokerError
from app.kafka.clients import make_consumer, partitions_of, stop_consumer
from app.kafka.errors import broker_errors
from app.runtime.settings import Settings
from ingest.publisher import Publisher
from ingest.registry.load import TableRecord
from ingest.registry.model import TableSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadSummary:
    """What one load sent; ``failed`` records were not acknowledged (exit 1); ``skipped``:
    nothing was sent because a progress file says these rows were loaded before."""

    table: str
    topic: str
    upserted: int
    deleted: int
    failed: int
    skipped: bool = False

    def to_json(self) -> bytes:
        out = {"table": self.table, "topic": self.topic, "upserted": self.upserted, "deleted": self.deleted,
               "failed": self.failed}  # fmt: skip
        return orjson.dumps({**out, "skipped": True} if self.skipped else out)


async def read_table(settings: Settings, topic: str, timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
    """The live rows of ``topic``: key -> latest value; BrokerError when unreachable."""
    consumer = make_consumer(settings)
    rows: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        with broker_errors(f"read {topic}"):
            await asyncio.wait_for(consumer.start(), timeout_s)
            tps = await partitions_of(settings, [topic], timeout_s)
            if not tps:
                return rows
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                if time.monotonic() > deadline:
                    msg = f"reading {topic} did not reach its end within {timeout_s:.0f} s"
                    raise BrokerError(msg)
                batch = await consumer.getmany(*tps, timeout_ms=200)
                for records in batch.values():
                    for r in records:
                        key = r.key.decode() if r.key is not None else ""
                        if r.value is None:
                            rows.pop(key, None)
                        else:
                            rows[key] = orjson.loads(r.value)
            return rows
    finally:
        await stop_consumer(consumer)


async def load_table(
    settings: Settings,
    spec: TableSpec,
    records: Iterable[TableRecord],
    *,
    deletes: Iterable[str] = (),
    prune: bool = False,
) -> LoadSummary:
    """Publish ``records`` and the tombstones; see the module docstring."""
    records = list(records)
    keys = {r.key for r in records}
    tombstones = [k for k in dict.fromkeys(deletes) if k not in keys]
    if prune:
        live = await read_table(settings, spec.topic)
        tombstones += [k for k in sorted(live) if k not in keys and k not in tombstones]
    async with Publisher(settings, spec.topic, spec.source, f"registry-{spec.name}") as pub:
        for record in records:
            await pub.send_record(record.key, record.value)
        for key in tombstones:
            await pub.send_record(key, None)
        await pub.flush(timeout_s=60)
    upserted = sum(1 for r in records if r.value is not None)
    deleted = len(records) - upserted + len(tombstones)
    logger.info("%s: %d rows upserted, %d deleted, %d failed", spec.topic, upserted, deleted, pub.failed)
    return LoadSummary(spec.name, spec.topic, upserted, deleted, pub.failed)
