"""``foreachBatch`` sink: alert transitions and DLQ records to Kafka, idempotent by batch id.

Contract per micro-batch ``batch_id`` (runs on the driver, in Spark's
foreachBatch thread, one batch at a time):

1. collect the batch's output rows (small: transitions and DLQ records only),
   always, so the stateful operator's state stores commit;
2. if ``batch_id`` is not above the last committed id in the marker file, the
   batch was already produced before a crash: do not produce it again (Spark
   re-runs the last batch when its commit log entry is missing);
3. otherwise order the rows by (partition, offset, rule order), produce each
   to its topic (alerts keyed by fingerprint, DLQ keyed by source, branch copies
   keyed by the event key, late copies keyed by rule id; each with the header
   ``engine: spark``), wait for
   every acknowledgement, then atomically write ``batch_id`` to the marker.

A crash between 3's produce and its marker re-produces that batch on restart
with the same alert ids (state is versioned by Spark, so the re-run is
identical): at least once on the wire, exactly once after the downstream
dedup on ``alert_id``. No alert is lost and none gets a new id.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import orjson
from prometheus_client import REGISTRY, Counter, Histogram
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, Row

from app.alerts import Alert
from app.kafka.clients import make_producer
from app.runtime.settings import Settings
from app.runtime.statefile import write_json
from app.topics import ALERTS

logger = logging.getLogger(__name__)

T = TypeVar("T")

ALERTS_OUT = Counter(
    "spark_alerts_total", "Alert transitions produced by the Spark engine", ["rule", "status"]
)
DLQ_OUT = Counter("spark_dlq_total", "Invalid events sent to the dead-letter topic by the Spark engine")
LATE = Counter("spark_late_events_total", "Events a Spark-engine rule could not use (late), once per rule")
RULE_ERRORS = Counter(
    "spark_rule_errors_total",
    "Evaluations of a rule that raised in Spark's Python workers (logged there with the traceback); "
    "the rule goes on with the next event",
    ["rule"],
)
ROUTED = Counter(
    "spark_routed_total", "Events copied to a branch topic or events.late by the Spark engine", ["kind"]
)
STATE_GROUPS = Counter(
    "spark_state_groups_total",
    "State groups a micro-batch of the Spark engine ran, by where their state came from: the "
    "worker's own live state, another worker's (live), restored from the state store, or new",
    ["found"],
)
#: where a stateful group's micro-batch found its state (``jobs.state.evaluate``)
FOUND = ("live", "peer", "stored", "new")


def state_groups() -> dict[str, float]:
    """:data:`STATE_GROUPS` so far in this process, by where the states came from."""
    return {w: REGISTRY.get_sample_value("spark_state_groups_total", {"found": w}) or 0.0 for w in FOUND}


SKIPPED = Counter("spark_batches_skipped_total", "Micro-batches already produced before a restart")
BATCH_SECONDS = Histogram("spark_sink_batch_seconds", "Time to produce one micro-batch's output")


#: every record the engine writes says so in a header, not in its body: the alert JSON (and
#: so its id, fingerprint and bytes) of an ``engine: both`` rule stays the Faust engine's,
#: and the receivers' dedup on ``alert_id`` keeps whichever copy came first
ENGINE_HEADER = [("engine", b"spark")]
#: the Java exceptions by which Spark tells an interruption by ``query.stop()`` from a failure
INTERRUPTIONS = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
)


class BatchInterrupted(Exception):
    """A micro-batch's job cut short by ``query.stop()``, told in two lines (:func:`collect`)."""


def collect(df: DataFrame) -> list[Row]:
    """``df.collect()``; the same error, in two lines, when ``query.stop()`` interrupted it.

    Spark tells such a stop from a failure of the ``foreachBatch`` function by the Python
    traceback it gets back: a regular expression looks in it for the ``Py4JJavaError`` and an
    interruption's Java exception (``StreamExecution.PROXY_ERROR``). That expression recurses
    once per character: on the whole traceback of a cancelled ``collect``, which holds the
    Java stack, Spark's thread overflowed its stack (a ``StackOverflowError`` of a thousand
    lines at a stop of the ``spark`` role) and the stop was taken for a failure. Said in
    two lines (the error's first line and the interruption's name) Spark recognises it."""
    try:
        return df.collect()
    except Py4JJavaError as exc:
        text = str(exc)
        cause = next((name for name in INTERRUPTIONS if name in text), None)
        if cause is None:
            raise
        logger.debug("the micro-batch's collect was interrupted: %s", text)  # the whole error, kept
        first = text.splitlines()[0] if text else ""
        msg = f"py4j.protocol.Py4JJavaError: {first}\n: {cause}"
        raise BatchInterrupted(msg) from None


class BatchMarker:
    """The last batch id whose output is fully acknowledged, in a small JSON file.

    Written with write-to-temp, fsync and rename, so a kill -9 leaves either
    the old or the new id, never a torn file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def last(self) -> int:
        try:
            return int(orjson.loads(self.path.read_bytes())["batch_id"])
        except FileNotFoundError:
            return -1

    def commit(self, batch_id: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, {"batch_id": batch_id})


class _Loop:
    """An event loop on a daemon thread, so one producer lives across micro-batches."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="spark-sink-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class KafkaSink:
    """The foreachBatch function of one query. Call :meth:`close` when the query ends."""

    def __init__(self, settings: Settings, marker: BatchMarker) -> None:
        self.settings = settings
        self.marker = marker
        self._loop = _Loop()
        self._producer = self._loop.run(self._start())
        self.produced = 0
        self.closed = False

    async def _start(self) -> Any:
        producer = make_producer(self.settings)
        await producer.start()
        return producer

    async def _send(self, records: list[tuple[str, bytes, bytes]]) -> None:
        futures = [
            await self._producer.send(topic, value=value, key=key, headers=ENGINE_HEADER)
            for topic, key, value in records
        ]
        await asyncio.gather(*futures)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        # Always run the batch's plan to the end: its state stores must commit
        # (Spark 4 fails the query otherwise), and a re-run computes the same rows.
        # in the order the query made them (its partitions in turn, each state group's rows in
        # the order the group ran them), which keeps each fingerprint's transitions in order;
        # a sort by partition and offset put those of a key merged from several partitions
        # out of it (jobs.state.arrival_order)
        rows = collect(df)
        last = self.marker.last()
        if batch_id <= last:
            SKIPPED.inc()
            logger.info(
                "batch %d was produced before a restart (marker %d); not producing it again", batch_id, last
            )
            return
        with BATCH_SECONDS.time():
            records: list[tuple[str, bytes, bytes]] = []
            for r in rows:
                if r["kind"] == "late":
                    LATE.inc(int(r["value"]))
                    continue
                if r["kind"] == "state":
                    STATE_GROUPS.labels(r["value"]).inc()
                    continue
                if r["kind"] == "error":
                    RULE_ERRORS.labels(r["rule"]).inc(int(r["value"]))
                    continue
                records.append((r["topic"], r["key"].encode(), r["value"].encode()))
                if r["kind"] == "alert":
                    ALERTS_OUT.labels(r["rule"], r["status"]).inc()
                elif r["kind"] in ("dlq", "refused"):
                    DLQ_OUT.inc()
                else:  # "routed" (branch) or "side" (late_policy: side)
                    ROUTED.labels(r["kind"]).inc()
            if records:
                self._loop.run(self._send(records))
            self.marker.commit(batch_id)
        self.produced += len(records)
        if records:
            logger.info("batch %d: produced %d record(s)", batch_id, len(records))

    def publish(self, alerts: list[Alert]) -> None:
        """Send ``alerts`` to ``alerts`` now, outside any micro-batch (the transitions a start
        ends, :mod:`jobs.unread`); returns once the broker has them all."""
        self._loop.run(self._send([(ALERTS, a.fingerprint.encode(), a.to_json()) for a in alerts]))
        for a in alerts:
            ALERTS_OUT.labels(a.rule_id, a.status).inc()
        self.produced += len(alerts)

    def close(self) -> None:
        """Stop the producer and its loop; a second call does nothing (a query stopped for a
        rules reload that found no rule left keeps its closed sink until the role stops)."""
        if self.closed:
            return
        self.closed = True
        try:
            self._loop.run(self._producer.stop(), timeout_s=15)
        finally:
            self._loop.close()
