"""How the streaming role ends (no Spark: a fake query): a failure raised by
``awaitTermination`` during a shutdown ends well, outside one it is an error; and what it
counts of each micro-batch."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from py4j.protocol import Py4JNetworkError
from pyspark.errors import StreamingQueryException

from jobs.engine import outcome, watch

INTERRUPTED = StreamingQueryException(message="org.apache.kafka.common.errors.InterruptException\n\tat ...")


@dataclass
class FakeQuery:
    """What :func:`jobs.engine.watch` calls: the first ``awaitTermination`` sets ``stop`` (the
    SIGTERM) when given, then raises ``raises``."""

    stop: threading.Event | None = None
    raises: BaseException | None = None
    failure: BaseException | None = None
    recentProgress: list[dict[str, object]] = field(default_factory=list)
    lastProgress: None = None

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
