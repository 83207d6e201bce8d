"""How the streaming role ends (no Spark: a fake query): a failure raised by
``awaitTermination`` during a shutdown ends well, outside one it is an error; what it
counts of each micro-batch; and which failures start a query again."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from py4j.protocol import Py4JNetworkError
from pyspark.errors import StreamingQueryException

from jobs.engine import WORKER_MISSED_ITS_START, WORKER_RESTARTS, WorkerRestarts, outcome, watch

INTERRUPTED = StreamingQueryException(message="org.apache.kafka.common.errors.InterruptException\n\tat ...")


@dataclass
class FakeQuery:
    """What :func:`jobs.engine.watch` calls: the first ``awaitTermination`` sets ``stop`` (the
    SIGTERM) when given, then raises ``raises``."""

    stop: threading.Event | None = None
    raises: BaseException | None = None
    failure: BaseException | None = None
    recentProgress: list[dict[str, object]] = field(default_factory=list)
    lastProgress: dict[str, object] | None = None

    @property
    def isActive(self) -> bool:
        return True

    def awaitTermination(self, _timeout: float) -> bool:
        if self.stop is not None:
            self.stop.set()
        if self.raises is not None:
            raise self.raises
        return False

    def exception(self) -> BaseException | None:
        return self.failure


def test_a_failure_raised_while_the_signal_stops_the_query_ends_well() -> None:
    stop = threading.Event()
    failure = watch(FakeQuery(stop=stop, raises=INTERRUPTED), stop)  # type: ignore[arg-type]
    assert failure is INTERRUPTED
    assert outcome(failure, stop) == 0


def test_a_failure_without_a_shutdown_is_an_error() -> None:
    stop = threading.Event()
    failure = watch(FakeQuery(raises=INTERRUPTED), stop)  # type: ignore[arg-type]
    assert failure is INTERRUPTED and outcome(failure, stop) == 1
    stop.set()
    assert outcome(StreamingQueryException(message=""), stop) == 0  # no message: still logged


def test_a_jvm_gone_with_the_signal_is_no_failure_but_gone_without_one_raises() -> None:
    stop = threading.Event()
    gone = Py4JNetworkError("Answer from Java side is empty")
    assert watch(FakeQuery(stop=stop, raises=gone), stop) is None  # type: ignore[arg-type]
    with pytest.raises(Py4JNetworkError):
        watch(FakeQuery(raises=gone), threading.Event())  # type: ignore[arg-type]


def test_each_micro_batch_counts_once_on_the_meters_it_is_given() -> None:
    stop, registry = threading.Event(), CollectorRegistry()
    meters = Counter("records", "", registry=registry), Gauge("batch_seconds", "", registry=registry)
    query = FakeQuery(recentProgress=[_progress(0, 100, 1500), _progress(1, 20, 250)])
    waits = 0

    def wait(_timeout: float) -> bool:  # two rounds over the same progress, then the SIGTERM
        nonlocal waits
        waits += 1
        if waits == 2:
            stop.set()
        return False

    query.awaitTermination = wait  # type: ignore[method-assign]
    assert watch(query, stop, meters=meters) is None  # type: ignore[arg-type]
    assert waits == 2
    assert registry.get_sample_value("records_total") == 120
    assert registry.get_sample_value("batch_seconds") == 0.25


def _progress(batch: int, rows: int, ms: int) -> dict[str, object]:
    return {"batchId": batch, "numInputRows": rows, "durationMs": {"triggerExecution": ms}}


#: as Spark reports it: the worker's start, in the JVM, under the query's own failure
MISSED = StreamingQueryException(
    message=f"[STREAM_FAILED] Query [id = 1] terminated with exception: {WORKER_MISSED_ITS_START}\n\tat ..."
)


def test_a_python_worker_that_missed_its_start_restarts_the_query_a_few_times_in_a_row() -> None:
    stop, restarts = threading.Event(), WorkerRestarts("rules")
    unstarted = FakeQuery()  # failed before its first micro-batch
    assert [restarts.allow(MISSED, unstarted, stop) for _ in range(WORKER_RESTARTS + 1)] == [
        *[True] * WORKER_RESTARTS,
        False,
    ]
    assert not restarts.allow(MISSED, unstarted, stop), "still given up: nothing ran meanwhile"
    ran = FakeQuery(lastProgress=_progress(7, 10, 100))  # a query that ran batches, then failed so
    assert restarts.allow(MISSED, ran, stop) and restarts.in_a_row == 1


def test_no_other_failure_and_no_failure_in_a_stop_restarts_a_query() -> None:
    stop, restarts = threading.Event(), WorkerRestarts("rules")
    assert not restarts.allow(None, FakeQuery(), stop)
    assert not restarts.allow(INTERRUPTED, FakeQuery(), stop)
    assert not restarts.allow(RuntimeError("Python worker exited unexpectedly (crashed)"), FakeQuery(), stop)
    stop.set()
    assert not restarts.allow(MISSED, FakeQuery(), stop), "the role stops: the failure ends it well"
    assert restarts.in_a_row == 0
