"""Riding out a Kafka that is not there: every role waits for it at start, and its clients'
logs stay readable while it is gone.

Every role that talks to Kafka calls :func:`wait_for_broker` before it creates a client:
:func:`app.runtime.role.run_role` (dispatch, store-sync), :func:`ingest.runtime.run_adapter`
(replays, simulators, the HTTP, syslog, tail and MQTT adapters, the registry) and the rule
worker's entry point (:func:`wait_for_broker_blocking`, before Faust starts). A cluster that
does not answer gives one WARNING line, then quiet retries with a doubling wait
(:data:`RETRY_FIRST_S` up to :data:`RETRY_CAP_S`) until it answers (one INFO line) or the
role is told to stop (it then exits 0 without having started). So a role started before its
broker neither crashes into the supervisor's restart loop nor fills its log with tracebacks.
The requests a role starts from (dispatch's and store-sync's partitions and end offsets) are
asked again the same way when they time out (:func:`until_answered`).

Once started, the Kafka clients reconnect by themselves (aiokafka retries every ~0.1 s and
logs an ERROR per attempt and connection); :func:`quiet_client_logs` lets each of those
messages through once per :data:`REPEAT_WINDOW_S` with the count of the ones held back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka import AIOKafkaClient
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError, KafkaTimeoutError
from aiokafka.protocol.commit import OffsetFetchRequest

from app.errors import BrokerError
from app.kafka.auth import KafkaAuth
from app.kafka.clients import Endpoint, Target, bootstrap_of, connection
from app.kafka.errors import CLIENT_ERRORS
from app.runtime.settings import Settings, setup_logging

logger = logging.getLogger(__name__)

#: The first wait between two attempts to reach Kafka at start; it doubles after each
#: failed attempt up to :data:`RETRY_CAP_S`.
RETRY_FIRST_S = 0.5
RETRY_CAP_S = 10.0
#: How long one attempt may take (a metadata request to a broker that is still starting).
ATTEMPT_TIMEOUT_S = 5.0

#: A repeated client log message passes once per this many seconds (:class:`RepeatLimiter`).
REPEAT_WINDOW_S = 30.0
#: The Kafka client's loggers whose repeats :func:`quiet_client_logs` limits. A filter on a
#: logger sees only the records logged on that very logger, so each is named.
CLIENT_LOGGERS = (
    "aiokafka",
    "aiokafka.client",
    "aiokafka.conn",
    "aiokafka.cluster",
    "aiokafka.producer.producer",
    "aiokafka.producer.sender",
    "aiokafka.consumer.consumer",
    "aiokafka.consumer.fetcher",
    "aiokafka.consumer.group_coordinator",
    "aiokafka.admin.client",
)

Probe = Callable[[Target], Awaitable[bool]]
T = TypeVar("T")


def listening(host_port: str) -> bool:
    """Whether ``host:port`` accepts a TCP connection within 0.5 s."""
    host, _, port = host_port.strip().rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


async def broker_answers(
    target: Target, timeout_s: float = ATTEMPT_TIMEOUT_S, auth: KafkaAuth | None = None
) -> bool:
    """True when a Kafka metadata request to ``target`` (with its TLS/SASL settings, or
    ``auth``) succeeds in time and names a broker.

    Nothing is asked of a cluster none of whose bootstrap addresses accepts a TCP
    connection: the client would log an ERROR for each of them."""
    bootstrap = bootstrap_of(target)
    if not any(listening(hp) for hp in bootstrap.split(",") if hp.strip()):
        return False
    options = (
        connection(target) if auth is None else {"bootstrap_servers": bootstrap, **auth.client_options()}
    )
    client = AIOKafkaClient(**options, request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        return bool(client.cluster.brokers())
    except CLIENT_ERRORS:
        return False
    finally:
        await client.close()


#: Kafka's internal topic of committed offsets, whose partitions the group coordinator loads
OFFSETS_TOPIC = "__consumer_offsets"
#: the stem of the group ids whose offsets :func:`group_coordinator_ready` fetches, one per
#: partition of the offsets topic (no group of that name is ever created)
READINESS_GROUP = "streamalert-readiness"
#: FindCoordinator's key type for a consumer group (1 is a transactional id)
GROUP_COORDINATOR = 0


def offsets_partition(group: str, partitions: int) -> int:
    """The partition of the offsets topic whose coordinator holds ``group``: Kafka's
    ``Utils.abs(groupId.hashCode()) % partitions``, with Java's ``String.hashCode`` over the
    id's UTF-16 code units."""
    units = group.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h & 0x80000000 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def readiness_groups(partitions: int) -> list[str]:
    """One group id per partition of the offsets topic, in partition order."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < partitions:
        group = f"{READINESS_GROUP}-{i}"
        found.setdefault(offsets_partition(group, partitions), group)
        i += 1
    return [found[p] for p in range(partitions)]


async def group_coordinator_ready(
    bootstrap: str, auth: KafkaAuth, timeout_s: float, stop: threading.Event | None = None
) -> bool:
    """Ask for a consumer group's coordinator, then until every partition of the offsets
    topic has a leader, then until each of those partitions is loaded (a group that lives on
    it answers an offset fetch without an error) and the list of groups answers (True), or
    ``timeout_s`` passes, or ``stop`` is set (a Ctrl-C while ``make run`` starts its broker:
    False at the next try, a tenth of a second apart).

    A new cluster creates its offsets topic (``__consumer_offsets``) at the first question for
    a coordinator, and answers "coordinator not available" until its partitions have leaders,
    then "not coordinator" or "load in progress" for a partition until its coordinator has
    loaded it; the list of groups fails while any partition loads. Asked by the roles
    themselves, that was an ERROR line in their logs at every fresh start.

    A partition's leader is in the broker's metadata before its coordinator is scheduled to
    load it. So neither the leaders nor a run of answers from the list of groups proves the
    load done: three answers 0.1 s apart (the check before this one) once passed, under CI
    load, before the last partitions were scheduled, and the next list met "load in
    progress". Fetching the offsets of one group per partition asks each partition's
    coordinator itself, which answers "load in progress" until its load is done."""
    options = connection(Endpoint(bootstrap, auth))
    admin = AIOKafkaAdminClient(**options, request_timeout_ms=5000)
    client = AIOKafkaClient(**options, request_timeout_ms=5000)  # the offset fetches' own requests
    deadline = time.monotonic() + timeout_s
    partitions = 0

    async def coordinator() -> bool:
        await admin.find_coordinator(READINESS_GROUP)
        return True

    async def led() -> bool:
        nonlocal partitions
        (topic,) = await admin.describe_topics([OFFSETS_TOPIC])
        parts = topic.get("partitions") or []
        partitions = len(parts)
        return not topic.get("error_code") and bool(parts) and all(p["leader"] >= 0 for p in parts)

    async def loaded() -> bool:  # every partition's coordinator answers for a group of its own
        if not client.cluster.brokers():
            await client.bootstrap()
        for group in readiness_groups(partitions):
            node = await client.coordinator_lookup(GROUP_COORDINATOR, group)
            answer = await client.send(node, OffsetFetchRequest(group, None))
            if answer.error_code:  # "not coordinator" or "load in progress": not loaded yet
                return False
        return True

    async def listed() -> bool:
        await admin.list_consumer_groups()
        return True

    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        for ask in (coordinator, led, loaded, listed):
            while True:
                done = False
                with contextlib.suppress(*CLIENT_ERRORS):
                    done = await ask()
                if done:
                    break
                if time.monotonic() > deadline or (stop is not None and stop.is_set()):
                    return False
                await asyncio.sleep(0.1)
        return True
    except CLIENT_ERRORS:
        return False
    finally:
        await admin.close()
        await client.close()


async def back_off(stop: asyncio.Event, delay: float, cap_s: float) -> float:
    """Wait ``delay`` seconds, or less when ``stop`` is set; the next try's delay, doubled up
    to ``cap_s`` (the retry loops of :func:`wait_for_broker` and :func:`until_answered`)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay)
    return min(delay * 2, cap_s)


async def wait_for_broker(
    target: Target,
    stop: asyncio.Event | None = None,
    *,
    first_s: float = RETRY_FIRST_S,
    cap_s: float = RETRY_CAP_S,
    probe: Probe = broker_answers,
) -> bool:
    """Wait until the Kafka cluster at ``bootstrap`` answers; True then, False when ``stop``
    was set first (also before the first attempt). An empty ``bootstrap`` returns True at
    once: the caller reports the missing setting.

    The first failed attempt logs one WARNING; the next ones are silent, ``first_s`` apart,
    doubling up to ``cap_s``. After a wait, one INFO line says that Kafka answered."""
    stop = stop or asyncio.Event()
    bootstrap = bootstrap_of(target)
    if not bootstrap:
        return not stop.is_set()
    began, delay, warned = time.monotonic(), first_s, False
    while not stop.is_set():
        attempt = asyncio.ensure_future(probe(target))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({attempt, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not attempt.done():
            attempt.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await attempt
            break
        if attempt.result():
            if warned:
                logger.info(
                    "Kafka at %s answered after %.1f s; starting", bootstrap, time.monotonic() - began
                )
            return True
        if not warned:
            logger.warning(
                "Kafka at %s is not reachable; retrying every %g s (backoff up to %g s)",
                bootstrap, first_s, cap_s,
            )  # fmt: skip
            warned = True
        delay = await back_off(stop, delay, cap_s)
    logger.info("stopped while waiting for Kafka at %s", bootstrap)
    return False


def transient(exc: BrokerError) -> bool:
    """Whether asking again may mend ``exc``: a timeout, a connection or socket error, a
    Kafka error its client marks retriable (a leader moving, a node not ready), or a
    :class:`BrokerError` of our own with no client error under it (a read that stalled)."""
    cause = exc.__cause__
    if cause is None:
        return True
    if isinstance(cause, KafkaError):
        return bool(cause.retriable) or isinstance(cause, KafkaTimeoutError)
    return isinstance(cause, TimeoutError | OSError)


async def until_answered(
    what: str,
    attempt: Callable[[], Awaitable[T]],
    stop: asyncio.Event,
    *,
    first_s: float = RETRY_FIRST_S,
    cap_s: float = RETRY_CAP_S,
) -> T | None:
    """``await attempt()`` until it does not raise :class:`~app.errors.BrokerError` (its
    result), or ``stop`` is set (None). A role's first requests after :func:`wait_for_broker`
    (the metadata and end offsets it starts from) time out when the host is starved, as
    when ``make run`` starts two Spark JVMs beside them on two cores: the role waits and
    asks again, as it waited for the broker, instead of exiting into the supervisor's
    restart loop. One WARNING names ``what`` and the error; the next failures are silent,
    ``first_s`` apart, doubling up to ``cap_s``. An error that asking again cannot mend (a
    refused authorization, an unsupported request: :func:`transient`) is raised: the role
    exits with it, and the supervisor and the console say so, instead of a role that looks
    up and waits for ever."""
    began, delay, warned = time.monotonic(), first_s, False
    while not stop.is_set():
        try:
            result = await attempt()
        except BrokerError as exc:
            if not transient(exc):
                raise
            if not warned:
                logger.warning("cannot %s yet (%s); asking again, up to every %g s", what, exc, cap_s)
                warned = True
        else:
            if warned:
                logger.info("could %s after %.1f s", what, time.monotonic() - began)
            return result
        delay = await back_off(stop, delay, cap_s)
    return None


def wait_for_broker_blocking(settings: Settings) -> bool:
    """:func:`wait_for_broker` for a process without an event loop yet (the Faust worker
    before it starts): SIGINT and SIGTERM end the wait (False), and the signal handlers
    before it are restored after. Logging is set up first when nothing set it up, so the
    warning reads like the role's other lines (Faust replaces the handlers as it starts)."""
    if not logging.getLogger().handlers:
        setup_logging(settings.log_level)
    quiet_client_logs()

    async def wait() -> bool:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await wait_for_broker(settings, stop)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return asyncio.run(wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class RepeatLimiter(logging.Filter):
    """Passes each message (logger and format string) once per ``window_s``; the next one
    to pass says how many like it were held back. Messages below WARNING always pass.

    Thread-safe enough for logging from a consumer thread: a race can only miscount."""

    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.window_s, self.clock = window_s, clock
        self.seen: dict[tuple[str, str], tuple[float, int]] = {}  # key -> (last passed, held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key, now = (record.name, str(record.msg)), self.clock()
        passed, held = self.seen.get(key, (None, 0))
        if passed is not None and now - passed < self.window_s:
            self.seen[key] = (passed, held + 1)
            return False
        self.seen[key] = (now, 0)
        if held and passed is not None:
            record.msg = f"{record.msg} [{held} more like this in the last {now - passed:.0f} s]"
        return True


_limiter = RepeatLimiter()


def quiet_client_logs() -> None:
    """Limit the repeats of the Kafka client's warnings and errors (:class:`RepeatLimiter`,
    one shared by :data:`CLIENT_LOGGERS`). Safe to call twice."""
    for name in CLIENT_LOGGERS:
        log = logging.getLogger(name)
        if _limiter not in log.filters:
            log.addFilter(_limiter)
