"""The embedded Apache Kafka broker: one single-node KRaft process for one-machine runs and tests.

The jars come from ``deps/kafka/pom.xml`` through ``scripts/fetch-jars.sh`` (``make run`` and
``make test`` call it) into ``.cache/jars/kafka``; ``APP_KAFKA_JARS`` points elsewhere.

Lifecycle of :class:`KafkaBroker` over a state directory ``home``:

- :meth:`~KafkaBroker.start` formats ``home/log`` once (``kafka.tools.StorageTool format``,
  skipped when ``meta.properties`` exists), writes ``server.properties`` with the listener
  ports of the previous start when they are still free (new free loopback ports otherwise),
  spawns ``kafka.Kafka`` in its own process group with JVM flags sized for two cores, and
  returns once a metadata request succeeds. :attr:`~KafkaBroker.ready_s` is that wait.
- :meth:`~KafkaBroker.stop` sends SIGTERM, which runs Kafka's controlled shutdown (logs
  flushed, clean-shutdown marker written), then SIGKILL after ``grace_s``.
- :meth:`~KafkaBroker.kill` is a ``kill -9``, for fault tests.
- The broker gets SIGTERM when the process that started it dies (``PR_SET_PDEATHSIG``).

Topics, offsets, groups and transactions live in ``home/log`` and survive a restart.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import random
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from app.errors import BrokerError
from app.kafka.auth import KafkaAuth
from app.kafka.wait import broker_answers, group_coordinator_ready
from app.runtime.procs import dies_with_parent, exited_by
from app.runtime.settings import PROJECT_ROOT

logger = logging.getLogger(__name__)

#: JVM flags for a broker sharing two cores with the whole system: a small fixed heap (Kafka
#: keeps its data in the page cache, not the heap), G1 with short pauses, and the JIT and GC
#: told there are two CPUs.
JVM_FLAGS: tuple[str, ...] = (
    "-Xms256m",
    "-Xmx768m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:ActiveProcessorCount=2",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

#: Broker settings beyond the listeners and the log dir: one node, so every internal topic
#: has one replica; no automatic topics (the system creates its own, with their keys and
#: partitions); thread pools sized for two cores.
SERVER_DEFAULTS: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "8",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "background.threads": "4",
    "log.cleaner.threads": "1",
    "num.recovery.threads.per.data.dir": "2",
    "delete.topic.enable": "true",
    "log.segment.bytes": str(128 * 1024 * 1024),
    "log.retention.hours": "168",
}

LOG4J2 = """\
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = INFO
"""


class _NoPlainWarning(logging.Filter):
    """Drops aiokafka's "Sending username and password in the clear" warning, which the
    broker's own PLAIN login on its loopback listener would print at every start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "in the clear" not in record.getMessage()


@contextlib.contextmanager
def _own_plain_login() -> Iterator[None]:
    conn_log, quiet = logging.getLogger("aiokafka.conn"), _NoPlainWarning()
    conn_log.addFilter(quiet)
    try:
        yield
    finally:
        conn_log.removeFilter(quiet)


PORTS_FROM = 20000  # the lowest port free_port picks (below: well-known and registered services)
_random = random.SystemRandom()


def port_range() -> tuple[int, int]:
    """Where :func:`free_port` picks: from ``PORTS_FROM`` up to the port before the kernel's
    range for the local ports of outgoing connections (Linux's ``ip_local_port_range``;
    IANA's 49152-65535 where that file does not exist)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 49152
    return PORTS_FROM, low - 1


class PortBook:
    """The ports a process hands out (:func:`free_port`, :func:`claim_port`: the process's one
    book), each at most once among the last ``remembered``, and each claimed machine-wide
    while remembered.

    A claim is a lock (``fcntl`` record lock, non-blocking) on byte N of :func:`claims_path`
    for port N. Two processes that pick at the same time (two ``make run`` s started together,
    two test processes side by side) never hand out one port: a port is handed out a while
    before its server binds it, and until then it looks free to everyone. The kernel drops a
    lock when its process ends, however it ends, so a crashed run leaves no stale claim; a role
    started by the claiming process does not inherit it, and the claim stays with its parent,
    the supervisor, for the run. A forgotten port's claim is released, so a long-lived process
    (a test session) holds at most ``remembered``."""

    def __init__(self, remembered: int = 4096) -> None:
        self.remembered = remembered
        self._handed_out: dict[int, None] = {}  # insertion-ordered: the oldest is forgotten first
        self._lock = threading.Lock()

    def free(self, host: str = "127.0.0.1") -> int:
        """See :func:`free_port`."""
        low, high = port_range()
        with self._lock:
            for _ in range(256 if high >= low else 0):
                port = _random.randint(low, high)
                if port not in self._handed_out and self._claim(port, host):
                    return self._hand_out(port)
            for _ in range(256):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((host, 0))
                    port = int(s.getsockname()[1])
                if port not in self._handed_out and self._claim(port, host):
                    return self._hand_out(port)
        msg = f"no free TCP port on {host}"
        raise OSError(msg)

    def claim(self, port: int, host: str = "127.0.0.1") -> bool:
        """See :func:`claim_port`."""
        with self._lock:
            if not self._claim(port, host):
                return False
            self._hand_out(port)
            return True

    def _claim(self, port: int, host: str) -> bool:
        fd = _claims_fd()
        if fd is not None:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, os.SEEK_SET)
            except OSError:  # another process holds it
                return False
        if port_free(port, host):
            return True
        if port not in self._handed_out:  # not ours to keep: a claim this book holds stays
            _unclaim(port)
        return False

    def _hand_out(self, port: int) -> int:
        self._handed_out[port] = None
        if len(self._handed_out) > self.remembered:
            forgotten = next(iter(self._handed_out))
            del self._handed_out[forgotten]
            _unclaim(forgotten)
        return port


#: the process's book of ports
_book = PortBook()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now, that this process has not handed out
    among its last 4,096, and that no other process on this machine has claimed
    (:class:`PortBook`); this process then holds the claim.

    It is picked at random in :func:`port_range`; the kernel's choice (``bind`` to port 0) is
    the last resort, when that range has nothing left. The kernel's choice alone went wrong
    in two ways:

    - It hands out a port again as soon as the test socket is closed: of 3,000 sets of 22
      calls (the ports of one ``make run``), 60 held a duplicate (2 %), and the second role on
      a port crash-loops.
    - Its ports are those every outgoing connection on the machine takes its local port from,
      the Kafka clients' included: one of them can take the port before the server binds it.
    """
    return _book.free(host)


def claim_port(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` is free on ``host`` (:func:`port_free`) and no other process of this
    user on this machine holds a claim to it (:class:`PortBook`). When it is, this process now
    holds the claim and :func:`free_port` does not hand the port out: a port asked for by
    number (a broker's of its last start, the dashboard's 8501)."""
    return _book.claim(port, host)


#: the machine's record of claimed ports (:class:`PortBook`), per user; opened once
_claims: int | None = None
_claims_opened = False
_claims_lock = threading.Lock()


def claims_path() -> Path:
    """The file whose byte N a process locks while it holds a claim to port N."""
    return Path(tempfile.gettempdir()) / f"streamalert-ports-{os.getuid()}.lock"


def _claims_fd() -> int | None:
    global _claims, _claims_opened
    with _claims_lock:
        if not _claims_opened:
            _claims_opened = True
            try:
                _claims = os.open(claims_path(), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:  # a read-only temp dir: ports are then picked as before
                logger.warning(
                    "cannot open %s (%s): ports are not claimed across processes", claims_path(), exc
                )
        return _claims


def _unclaim(port: int) -> None:
    if _claims is not None:
        with contextlib.suppress(OSError):
            fcntl.lockf(_claims, fcntl.LOCK_UN, 1, port, os.SEEK_SET)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server can listen on ``port`` on ``host`` right now.

    The test bind sets ``SO_REUSEADDR``, as the JVM does for every server socket: the
    connections a killed broker leaves in TIME_WAIT on its own ports must not make a
    restart on the same log dir move to new ports, or its clients would lose it.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def jars_dir() -> Path:
    """The folder of the broker's jars (``APP_KAFKA_JARS``, else ``.cache/jars/kafka``)."""
    raw = os.environ.get("APP_KAFKA_JARS")
    return Path(raw) if raw else PROJECT_ROOT / ".cache" / "jars" / "kafka"


def classpath() -> str:
    """The broker's Java class path; a :class:`BrokerError` saying how to fetch it when missing."""
    jars = jars_dir()
    if not any(jars.glob("kafka_2.13-*.jar")):
        msg = (
            f"the Apache Kafka jars are not in {jars}: run `scripts/fetch-jars.sh kafka` "
            "(`make run` and `make test` do), or set KAFKA_BOOTSTRAP_SERVERS to a cluster"
        )
        raise BrokerError(msg)
    return f"{jars}/*"


def kafka_version() -> str:
    """The version of the fetched broker jars (from ``kafka_2.13-<version>.jar``)."""
    jar = next(jars_dir().glob("kafka_2.13-*.jar"), None)
    return "?" if jar is None else jar.stem.removeprefix("kafka_2.13-")


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding (Kafka's ``Uuid``).

    Never one that starts with ``-``: ``kafka-storage format -t`` would read it as an option and
    fail (1 format in 64). Kafka's own ``Uuid.randomUuid`` draws again then, and so does this."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker:
    """An Apache Kafka broker and controller in one process, on 127.0.0.1, over ``home``.

    ``home`` holds ``log/`` (the KRaft log dir), ``server.properties``, ``log4j2.properties``,
    ``ports.json`` and ``broker.log`` (the process's output). Use as a context manager or
    call :meth:`start` and :meth:`stop`.

    ``sasl_users`` (user -> password) makes the client listener ``SASL_PLAINTEXT`` with the
    PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 mechanisms for those users; the first user is
    the broker's own (inter-broker and controller) identity, and the controller listener
    takes only that user (SASL PLAIN). :meth:`start` writes every user's SCRAM credentials
    once the broker answers (AlterUserScramCredentials, as the first user over PLAIN, whose
    password is in the listener's configuration), on a new log dir as on one formatted
    earlier without these users or with other passwords: after every start each SCRAM
    password is the one given here. (Not ``kafka-storage format --add-scram``: that puts
    the passwords on a command line, which every local user can read.)

    ``acls`` (with ``sasl_users``) turns on Kafka's StandardAuthorizer: nothing is allowed
    without an ACL (:mod:`app.kafka.acls` writes them), except to the first user, the super user.
    """

    def __init__(
        self,
        home: Path,
        *,
        port: int | None = None,
        heap: str | None = None,
        sasl_users: dict[str, str] | None = None,
        acls: bool = False,
    ) -> None:
        if acls and not sasl_users:
            msg = "ACLs need SASL users: without authentication every client is ANONYMOUS"
            raise BrokerError(msg)
        self.home = home
        self.sasl_users = dict(sasl_users or {})
        self.acls = acls
        self.log_dir = home / "log"
        self.output = home / "broker.log"
        self._want_port = port
        self._heap = heap
        self.port = 0
        self.controller_port = 0
        self.ready_s: float | None = None
        self.formatted_now = False
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _pick_ports(self) -> None:
        saved: dict[str, int] = {}
        with contextlib.suppress(OSError, ValueError):
            saved = json.loads((self.home / "ports.json").read_text())
        port = self._want_port or saved.get("port", 0)
        cport = saved.get("controller_port", 0)
        self.port = port if port and claim_port(port) else free_port()
        self.controller_port = cport if cport and cport != self.port and claim_port(cport) else free_port()
        if port and self.port != port:
            logger.warning(
                "port %d (%s) is taken by another process: the broker listens on %d instead, and "
                "clients that know the old address will not find it", port,
                "asked for" if self._want_port else "of the previous start", self.port,
            )  # fmt: skip
        (self.home / "ports.json").write_text(
            json.dumps({"port": self.port, "controller_port": self.controller_port})
        )

    @property
    def admin_auth(self) -> KafkaAuth:
        """How the broker's own (first) user connects; plaintext without SASL users."""
        if not self.sasl_users:
            return KafkaAuth()
        user, password = next(iter(self.sasl_users.items()))
        return KafkaAuth(
            protocol="SASL_PLAINTEXT", mechanism="SCRAM-SHA-256", username=user, password=password
        )

    @property
    def _plain_admin_auth(self) -> KafkaAuth:
        """The first user over PLAIN: its password is in the listener's JAAS configuration,
        so it authenticates even before the log dir holds any SCRAM credential."""
        return dataclasses.replace(self.admin_auth, mechanism="PLAIN")

    def _listener_props(self) -> dict[str, str]:
        controller = f"CONTROLLER://127.0.0.1:{self.controller_port}"
        if not self.sasl_users:
            return {
                "listeners": f"PLAINTEXT://127.0.0.1:{self.port},{controller}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            }
        admin, secret = next(iter(self.sasl_users.items()))
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in self.sasl_users.items())
        props = {
            "listeners": f"SASL_PLAINTEXT://127.0.0.1:{self.port},{controller}",
            "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{self.port}",
            "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            # its own identity by PLAIN, as on the controller listener: valid before the SCRAM
            # credentials are written (start() writes them once the broker answers)
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            # the controller's own listener: only the broker's identity, by PLAIN (SCRAM
            # credentials live in the metadata the controller serves, so it cannot use them)
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{admin}" password="{secret}" user_{admin}="{secret}";'
            ),
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{admin}" password="{secret}" {plain_users};'
            ),
        }
        for mech in ("scram-sha-256", "scram-sha-512"):
            props[f"listener.name.sasl_plaintext.{mech}.sasl.jaas.config"] = (
                f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{admin}" '
                f'password="{secret}";'
            )
        if self.acls:
            props["authorizer.class.name"] = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
            props["super.users"] = f"User:{admin}"
            props["allow.everyone.if.no.acl.found"] = "false"
        return props

    def _write_config(self) -> Path:
        props = {
            **SERVER_DEFAULTS,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            **self._listener_props(),
            "log.dirs": str(self.log_dir),
        }
        path = self.home / "server.properties"
        path.touch(mode=0o600)  # it may hold passwords
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.home / "log4j2.properties").write_text(LOG4J2)
        return path

    def _java(self, main: str, *args: str) -> list[str]:
        flags = list(JVM_FLAGS)
        if self._heap:
            flags = [f for f in flags if not f.startswith(("-Xms", "-Xmx"))] + [f"-Xmx{self._heap}"]
        log4j = f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}"
        return ["java", *flags, log4j, "-cp", classpath(), main, *args]

    def _format(self, config: Path) -> None:
        """Format the log dir unless it was formatted before (its ``meta.properties`` exists)."""
        if (self.log_dir / "meta.properties").exists():
            return
        argv = self._java(
            "kafka.tools.StorageTool", "format", f"--cluster-id={new_cluster_id()}", "-c", str(config)
        )
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [*argv, "--ignore-formatted"], capture_output=True, timeout=120, check=False
        )
        if done.returncode != 0:
            msg = f"formatting the Kafka log dir {self.log_dir} failed: {done.stderr.decode()[-2000:]}"
            raise BrokerError(msg)
        self.formatted_now = True
        logger.info("formatted the Kafka log dir %s", self.log_dir)

    def start(self, timeout_s: float = 60.0, stop: threading.Event | None = None) -> KafkaBroker:
        """Format when needed, start the broker and wait until it answers (at most ``timeout_s``;
        no longer once ``stop`` is set: then the broker runs, maybe not ready yet, for the
        caller to stop)."""
        self.home.mkdir(parents=True, exist_ok=True)
        self._pick_ports()
        config = self._write_config()
        self._format(config)
        began = time.monotonic()
        with self.output.open("ab") as out:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                self._java("kafka.Kafka", str(config)),
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=dies_with_parent(),  # the main thread starts it: outlives no kill -9 of its owner
            )
        deadline = began + timeout_s
        while time.monotonic() < deadline:
            if _set(stop):
                return self
            if self._proc.poll() is not None:
                msg = (
                    f"the Kafka broker exited with code {self._proc.returncode} on {self.bootstrap}; "
                    f"its output is in {self.output}"
                )
                self._proc = None
                raise BrokerError(msg)
            with _own_plain_login():
                answers = asyncio.run(
                    broker_answers(self.bootstrap, timeout_s=2.0, auth=self._plain_admin_auth)
                )
            if answers:
                if self.sasl_users:
                    self._upsert_scram()
                with _own_plain_login():
                    coordinator = group_coordinator_ready(
                        self.bootstrap, self._plain_admin_auth, max(1.0, deadline - time.monotonic()), stop
                    )
                    coordinated = asyncio.run(coordinator)
                if _set(stop):  # stopped while the coordinator loaded: running, maybe not ready
                    return self
                if not coordinated:  # the roles would wait for it themselves
                    logger.warning("the Kafka broker on %s has no group coordinator yet", self.bootstrap)
                self.ready_s = time.monotonic() - began
                logger.info(
                    "Apache Kafka %s ready on %s in %.1f s (pid %d, log dir %s)",
                    kafka_version(), self.bootstrap, self.ready_s, self._proc.pid, self.log_dir,
                )  # fmt: skip
                return self
            time.sleep(0.1)
        self.stop()
        msg = (
            f"the Kafka broker did not answer on {self.bootstrap} within {timeout_s:.0f}s; see {self.output}"
        )
        raise BrokerError(msg)

    def _upsert_scram(self) -> None:
        """Store this broker's SCRAM users and passwords in its log dir (see the class)."""
        from app.kafka.acls import upsert_scram_users
        from app.kafka.clients import Endpoint

        try:
            with _own_plain_login():
                asyncio.run(
                    upsert_scram_users(Endpoint(self.bootstrap, self._plain_admin_auth), self.sasl_users)
                )
        except BrokerError:
            self.stop()
            raise

    def stop(self, grace_s: float = 30.0, force: threading.Event | None = None) -> None:
        """Controlled shutdown (SIGTERM), then SIGKILL when it takes longer than ``grace_s``,
        or as soon as ``force`` is set (a kill loses nothing the broker acknowledged: its log
        is recovered at the next start)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        deadline = time.monotonic() + grace_s
        try:
            if not _set(force):
                os.killpg(proc.pid, signal.SIGTERM)
            if not exited_by(proc, deadline, force):
                why = "on a second signal" if _set(force) else f"after {grace_s:.0f} s"
                logger.warning("the Kafka broker did not stop; killing it %s", why)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        except ProcessLookupError:
            pass
        logger.info("Kafka broker on %s stopped", self.bootstrap)

    def kill(self) -> None:
        """``kill -9`` the broker (no shutdown at all), for fault tests."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _set(event: threading.Event | None) -> bool:
    return event is not None and event.is_set()
