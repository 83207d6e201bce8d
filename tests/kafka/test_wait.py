"""Waiting for Kafka at start and limiting the client's repeated log lines, without a broker:
a fake probe and an injected clock."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading

import pytest
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    KafkaConnectionError,
    KafkaTimeoutError,
    TopicAuthorizationFailedError,
)

from app.errors import BrokerError
from app.kafka.auth import KafkaAuth
from app.kafka.broker import free_port
from app.kafka.wait import (
    Probe,
    RepeatLimiter,
    broker_answers,
    group_coordinator_ready,
    offsets_partition,
    readiness_groups,
    transient,
    until_answered,
    wait_for_broker,
)


def answers_after(failures: int, calls: list[float]) -> Probe:
    async def probe(_bootstrap: str) -> bool:
        calls.append(asyncio.get_running_loop().time())
        return len(calls) > failures

    return probe


def test_one_warning_then_quiet_retries_with_backoff_until_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[float] = []
    caplog.set_level(logging.INFO, logger="app.kafka.wait")
    ok = asyncio.run(wait_for_broker("h:1", first_s=0.01, cap_s=0.04, probe=answers_after(5, calls)))
    assert ok and len(calls) == 6
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps[0] < gaps[2] and all(g < 1.0 for g in gaps)  # doubling, capped
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "Kafka at h:1 is not reachable; retrying every 0.01 s (backoff up to 0.04 s)"
    ]
    assert "answered after" in caplog.records[-1].getMessage()


def test_a_broker_that_answers_at_once_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="app.kafka.wait")
    assert asyncio.run(wait_for_broker("h:1", probe=answers_after(0, [])))
    assert caplog.records == []


def test_a_stop_ends_the_wait_even_during_an_attempt() -> None:
    async def hangs(_bootstrap: str) -> bool:
        await asyncio.sleep(60)
        return True

    async def run() -> bool:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, stop.set)
        return await asyncio.wait_for(wait_for_broker("h:1", stop, probe=hangs), 5)

    assert not asyncio.run(run())


def test_a_stop_set_before_the_wait_returns_false_without_a_probe() -> None:
    async def run(calls: list[float]) -> bool:
        stop = asyncio.Event()
        stop.set()
        return await wait_for_broker("h:1", stop, probe=answers_after(0, calls))

    calls: list[float] = []
    assert not asyncio.run(run(calls))
    assert calls == []


def test_no_broker_listening_is_told_without_a_kafka_request(caplog: pytest.LogCaptureFixture) -> None:
    assert not asyncio.run(broker_answers(f"127.0.0.1:{free_port()}", timeout_s=1))
    assert caplog.records == []  # the client would have logged an ERROR per address


def record(msg: str, level: int = logging.ERROR, name: str = "aiokafka") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, ("x",), None)


def test_the_limiter_passes_a_message_once_per_window_and_counts_the_rest() -> None:
    now = [0.0]
    limiter = RepeatLimiter(window_s=30, clock=lambda: now[0])
    assert limiter.filter(record("Unable connect to %s"))
    for t in (1, 2, 3):
        now[0] = t
        assert not limiter.filter(record("Unable connect to %s"))
    assert limiter.filter(record("another message %s"))  # another message is its own
    assert limiter.filter(record("Unable connect to %s", logging.INFO))  # below WARNING: always
    now[0] = 31
    passed = record("Unable connect to %s")
    assert limiter.filter(passed)
    assert passed.getMessage() == "Unable connect to x [3 more like this in the last 31 s]"


class NoCoordinatorYet:
    """An admin client of a broker whose offsets topic is still loading."""

    asked = 0

    def __init__(self, **_kwargs: object) -> None:
        pass

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def find_coordinator(self, _group: str) -> int:
        NoCoordinatorYet.asked += 1
        raise GroupCoordinatorNotAvailableError


@pytest.mark.parametrize("stopped", [True, False])
def test_a_stop_ends_the_wait_for_the_group_coordinator(
    monkeypatch: pytest.MonkeyPatch, stopped: bool
) -> None:
    """A Ctrl-C while `make run` starts its broker is not held until the coordinator loads."""
    monkeypatch.setattr("app.kafka.wait.AIOKafkaAdminClient", NoCoordinatorYet)
    NoCoordinatorYet.asked = 0
    stop = threading.Event()
    if stopped:
        stop.set()
    timeout_s = 0.5 if not stopped else 60.0
    ready = asyncio.run(group_coordinator_ready("h:1", KafkaAuth(), timeout_s, stop))
    assert not ready
    assert NoCoordinatorYet.asked == 1 if stopped else NoCoordinatorYet.asked > 1


@pytest.mark.parametrize(
    ("group", "partitions", "partition"),
    [  # Java's "...".hashCode(), from jshell: -67795172, -67795168, 2113
        ("streamalert-readiness-0", 8, 4),
        ("streamalert-readiness-4", 8, 0),
        ("Ab", 50, 13),
        ("", 8, 0),
    ],
)
def test_a_group_lives_on_the_offsets_partition_kafka_gives_it(
    group: str, partitions: int, partition: int
) -> None:
    assert offsets_partition(group, partitions) == partition


def test_the_readiness_groups_cover_every_offsets_partition_once() -> None:
    for partitions in (1, 8, 50):
        groups = readiness_groups(partitions)
        assert [offsets_partition(g, partitions) for g in groups] == list(range(partitions))


class LedOffsetsTopic(NoCoordinatorYet):
    """An admin client of a broker whose offsets topic has 8 partitions, all led."""

    listed = 0

    async def find_coordinator(self, _group: str) -> int:
        return 1

    async def describe_topics(self, _topics: list[str]) -> list[dict[str, object]]:
        return [{"error_code": 0, "partitions": [{"partition": p, "leader": 1} for p in range(8)]}]

    async def list_consumer_groups(self) -> list[object]:
        LedOffsetsTopic.listed += 1
        return []


class LoadingCoordinators:
    """A client whose group coordinators load one offsets partition at a time: a group's
    offset fetch answers "not coordinator" (16), then "load in progress" (14), then none."""

    answers: dict[str, list[int]] = {}
    fetched: list[tuple[str, int]] = []

    class Cluster:
        def brokers(self) -> set[int]:
            return {1}

    cluster = Cluster()

    def __init__(self, **_kwargs: object) -> None:
        pass

    async def close(self) -> None:
        pass

    async def coordinator_lookup(self, _type: int, _group: str) -> int:
        return 1

    async def send(self, _node: int, request: object) -> object:
        group = request._consumer_group  # type: ignore[attr-defined]
        left = LoadingCoordinators.answers[group]
        code = left.pop(0) if left else 0
        LoadingCoordinators.fetched.append((group, code))
        return type("Answer", (), {"error_code": code})()


def test_readiness_waits_until_every_offsets_partition_is_loaded_not_only_led(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The leaders of the offsets topic are in the broker's metadata before its coordinator
    loads them: readiness asks each partition's coordinator, and waits for the slowest."""
    monkeypatch.setattr("app.kafka.wait.AIOKafkaAdminClient", LedOffsetsTopic)
    monkeypatch.setattr("app.kafka.wait.AIOKafkaClient", LoadingCoordinators)
    groups = readiness_groups(8)
    LoadingCoordinators.answers = {g: [] for g in groups}
    LoadingCoordinators.answers[groups[5]] = [16, 16, 14, 14]
    LoadingCoordinators.fetched = []
    LedOffsetsTopic.listed = 0
    assert asyncio.run(group_coordinator_ready("h:1", KafkaAuth(), 10.0))
    asked = {g for g, _ in LoadingCoordinators.fetched}
    assert asked == set(groups)
    last = {g: code for g, code in LoadingCoordinators.fetched}
    assert all(code == 0 for code in last.values())
    assert [code for g, code in LoadingCoordinators.fetched if g == groups[5]] == [16, 16, 14, 14, 0]
    assert LedOffsetsTopic.listed == 1  # the groups listed once all partitions were loaded


def test_readiness_gives_up_when_a_partition_never_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.kafka.wait.AIOKafkaAdminClient", LedOffsetsTopic)
    monkeypatch.setattr("app.kafka.wait.AIOKafkaClient", LoadingCoordinators)
    groups = readiness_groups(8)
    LoadingCoordinators.answers = {g: [] for g in groups}
    LoadingCoordinators.answers[groups[2]] = [14] * 1000
    LedOffsetsTopic.listed = 0
    assert not asyncio.run(group_coordinator_ready("h:1", KafkaAuth(), 0.5))
    assert LedOffsetsTopic.listed == 0


def test_a_request_that_times_out_at_start_is_asked_again_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[float] = []

    async def end_offsets() -> dict[str, int]:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) <= 3:
            raise BrokerError("cannot read end offsets from h:1: TimeoutError()")
        return {}

    caplog.set_level(logging.INFO, logger="app.kafka.wait")
    got = asyncio.run(
        until_answered("read the end offsets", end_offsets, asyncio.Event(), first_s=0.01, cap_s=0.04)
    )
    assert got == {} and len(calls) == 4  # an empty answer is an answer, not a stop
    assert [(r.levelno, r.getMessage().split(" after ")[0]) for r in caplog.records] == [
        (
            logging.WARNING,
            "cannot read the end offsets yet (cannot read end offsets from h:1: TimeoutError()); "
            "asking again, up to every 0.04 s",
        ),
        (logging.INFO, "could read the end offsets"),
    ]


def test_a_stop_ends_the_asking_with_none_and_other_errors_pass() -> None:
    async def never() -> int:
        raise BrokerError("cannot read topic metadata from h:1: TimeoutError()")

    async def asked_until_stopped() -> int | None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, stop.set)
        return await asyncio.wait_for(until_answered("ask", never, stop, first_s=0.01), 5)

    assert asyncio.run(asked_until_stopped()) is None

    async def broken() -> int:
        raise ValueError("a bug, not the broker")

    with pytest.raises(ValueError, match="a bug"):
        asyncio.run(until_answered("ask", broken, asyncio.Event()))


def test_an_error_that_asking_again_cannot_mend_is_raised_at_once() -> None:
    """A refused authorization would be asked again for ever, the role looking up on the
    console: it is raised, so the role exits with it and the supervisor says why."""
    calls: list[int] = []

    async def refused() -> int:
        calls.append(1)
        try:
            raise TopicAuthorizationFailedError("alerts")
        except TopicAuthorizationFailedError as exc:
            msg = f"cannot read end offsets from h:1: {exc!r}"
            raise BrokerError(msg) from exc

    with pytest.raises(BrokerError, match="TopicAuthorizationFailedError"):
        asyncio.run(asyncio.wait_for(until_answered("ask", refused, asyncio.Event(), first_s=0.01), 5))
    assert calls == [1]
    for cause in (TimeoutError(), KafkaTimeoutError(), KafkaConnectionError(), ConnectionResetError()):
        exc = BrokerError("cannot ...")
        exc.__cause__ = cause
        assert transient(exc), cause
    assert transient(BrokerError("no record came for 30 s before the end of alerts:0 at 3 of 9"))
