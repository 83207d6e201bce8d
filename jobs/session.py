"""The SparkSession of the Spark engine: configuration in one place.

Decisions, written down once:

- ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are this interpreter, so
  Python workers run in the project's virtualenv (otherwise Spark fails with
  "Python worker failed to connect back").
- ANSI mode stays on (Spark 4's default). The rule language gives NULL for
  division or modulo by zero and for 64-bit overflow; the expression
  translator (:mod:`app.rules.spark_sql`) emits ``try_add``/``try_subtract``/
  ``try_multiply``/``try_divide``/``try_mod`` for every arithmetic operation,
  so those cases give NULL and anything else that goes wrong (a bad cast)
  still fails loudly instead of silently becoming NULL.
- The session time zone is UTC, like every time in this system.
- Spark's own Kafka connector (``format("kafka")``, the default of
  ``APP_SPARK_KAFKA_FORMAT``) comes as local jars (:mod:`jobs.connector`) passed
  in ``spark.jars``, so nothing is downloaded at run time (no
  ``spark.jars.packages``). Without them a ``kafka`` read is refused with the
  command that fetches them (docs/spark-kafka.md).
- The geo UDFs are registered on every session this module builds. The project's own
  Kafka data source (``kafka_py``, the fallback) is registered by the read that asks for
  it (:func:`jobs.kafka_source.read_kafka`): about 1 s of start-up that a backtest from a
  file and a query on Spark's connector never use.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from jobs import connector, local_fs, udfs

logger = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
#: how long a stopping role waits for its JVM to exit before killing it
JVM_EXIT_TIMEOUT_S = 5.0
ESCAPED_LITERALS = "spark.sql.parser.escapedStringLiterals"
LOG4J2_CONFIG = Path(__file__).resolve().parent.parent / "config" / "spark-log4j2.properties"
PANDAS_CONCAT_WARNING = "The behavior of DataFrame concatenation with empty or all-NA entries"
#: renames with ``java.io`` (:func:`_checkpoint_files`)
FILE_SYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"


def python_env(master: str | None = DEFAULT_MASTER) -> None:
    """Point Spark's Python workers at this interpreter, and a local master's JVMs at the
    loopback interface (idempotent).

    Left to itself, Spark binds the driver's RPC and block manager to the host's outward
    address (warning "Your hostname ... resolves to a loopback address") and its web UI to
    every interface: a one-machine run would listen on the network. ``SPARK_LOCAL_IP`` moves
    them all to 127.0.0.1 for ``local[...]`` and ``local-cluster[...]`` (whose executors run
    on this host); an operator's own value is kept, and a cluster master or spark-submit
    (``master`` None) is left as it is configured."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if _on_this_host(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def _on_this_host(master: str | None) -> bool:
    """A ``local[...]`` or ``local-cluster[...]`` master: every JVM of it runs here."""
    return bool(master) and str(master).startswith("local")


def _driver_logging(master: str | None) -> dict[str, str]:
    """A local master's driver logs with ``config/spark-log4j2.properties`` (Spark's defaults
    without its start-up chatter); under spark-submit or a cluster, the cluster's own."""
    if not _on_this_host(master):
        return {}
    return {"spark.driver.extraJavaOptions": f"'-Dlog4j2.configurationFile={LOG4J2_CONFIG}'"}


def _checkpoint_files(master: str | None) -> dict[str, str]:
    """A local master's streaming checkpoints are written through Hadoop's ``FileSystem``, not
    its ``FileContext`` (Spark's default).

    Every micro-batch renames files into place: the offset log's entry, the commit log's, a
    delta file per state-store partition. On the local file system without Hadoop's native
    library (pyspark ships none) ``FileContext``'s rename reads the destination's link status
    with a ``readlink`` subprocess: the JVM forked a process per rename and the query waited
    (the offset and commit logs took 35 to 40 ms per micro-batch each on this host).
    ``FileSystem``'s rename is ``java.io``'s (a POSIX rename, atomic on one host). What it
    gives up: it checks that the destination is absent and then renames, in two steps, where
    ``FileContext`` refuses atomically; that matters only to two runs of one query at once,
    which Spark refuses within a driver and the supervisor never starts (a role's JVM has
    exited before the role restarts). A cluster or spark-submit, whose checkpoints may be on
    HDFS or an object store, keeps Spark's default."""
    if not _on_this_host(master):
        return {}
    return {CHECKPOINT_MANAGER: FILE_SYSTEM_CHECKPOINTS}


def _local_file_system(master: str | None) -> dict[str, str]:
    """A local master's ``file:`` paths (checkpoints, the archive's Parquet files) go through
    :mod:`jobs.local_fs`: Hadoop's local file system set each new file's permission with a
    ``chmod`` subprocess, this one sets it in the JVM (the offset and commit logs went from 11
    to 14 ms per micro-batch each to 1 or 2). A cluster or spark-submit keeps its own."""
    return local_fs.conf() if _on_this_host(master) else {}


def _executor_path(master: str | None) -> dict[str, str]:
    """A master whose executors are JVMs of their own (``local-cluster[...]``, ``spark://``)
    starts their Python workers in its own work folders: they find ``app`` and ``jobs``
    through ``PYTHONPATH`` (this checkout; a cluster on other hosts needs ``--py-files``
    or the code installed there). ``local[...]`` and spark-submit need nothing."""
    if not master or master.startswith("local["):
        return {}
    root = str(Path(__file__).resolve().parent.parent)
    paths = [root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"spark.executorEnv.PYTHONPATH": os.pathsep.join(paths)}


def build_session(
    master: str | None = DEFAULT_MASTER,
    app_name: str = "streamalert-spark",
    shuffle_partitions: int | None = None,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    """Get or create the session. ``master=None`` keeps what spark-submit configured.

    Shuffle partitions default to the number of cores of a local master (at
    least 2): the state of ``applyInPandasWithState`` is split into that many
    state-store partitions, and the count is fixed by the first checkpoint.

    The connector's jars are passed whenever they are there, so one session
    serves both formats; without them the session still serves ``kafka_py`` and
    files, and a ``kafka`` read raises :class:`jobs.connector.ConnectorMissingError`
    (:func:`jobs.kafka_source.read_kafka`). With ``master=None`` (spark-submit)
    they are not set: ``--jars`` does that, and a second ``spark.jars`` would
    replace it. Like every setting here, the jars apply only to a session this
    call creates: an active session is returned as it is.
    """
    python_env(master)
    jars = connector.jars() if master else []  # under spark-submit, its --jars ship them
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    parts = shuffle_partitions or max(2, os.cpu_count() or 2)
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.ansi.enabled": "true",
        "spark.sql.shuffle.partitions": str(parts),
        "spark.ui.showConsoleProgress": "false",
        "spark.python.daemon.module": "jobs.pydaemon",  # the compiled evaluator in the workers
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.pythonUDF.arrow.enabled": "true",  # the geo UDFs: ~3x faster in batches
        # pyspark's applyInPandasWithState pads its frames with all-NA rows, which makes pandas
        # warn at every micro-batch; nothing of ours: keep it out of the operators' logs
        "spark.executorEnv.PYTHONWARNINGS": f"ignore:{PANDAS_CONCAT_WARNING}:FutureWarning",
        **({"spark.jars": ",".join(str(j) for j in jars)} if jars else {}),
        **({"spark.ui.port": ui_port} if (ui_port := os.environ.get("APP_SPARK_UI_PORT")) else {}),
        **_driver_logging(master),
        **_checkpoint_files(master),
        **_local_file_system(master),
        **_executor_path(master),
        **(extra or {}),
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # app.rules.spark_sql.quote writes string literals for the parser's default escaping. Set
    # only where a cluster's defaults changed it: Spark 4 warns at every session and query
    # that carries this deprecated setting, even at its default value
    if spark.conf.get(ESCAPED_LITERALS, "false") != "false":
        spark.conf.set(ESCAPED_LITERALS, "false")
    spark.sparkContext.setLogLevel(os.environ.get("APP_SPARK_LOG_LEVEL", "WARN"))
    udfs.register(spark)
    logger.info(
        "spark session ready: master %s, %s shuffle partitions, kafka connector %s",
        spark.sparkContext.master,
        parts,
        f"from {connector.jars_dir()}" if jars else "absent (kafka_py only)",
    )
    return spark


def session_unless_stopped(
    stop: threading.Event,
    master: str | None,
    app_name: str = "streamalert-spark",
    shuffle_partitions: int | None = None,
) -> SparkSession | None:
    """:func:`build_session`, or None when a stop signal came while it started.

    A signal to the role's whole process group reaches the JVM that pyspark is starting too,
    and it dies; pyspark then fails with py4j's connection errors. That is a stop, not a
    crash: said in one line, exit 0. py4j's own record of those errors (a traceback per call,
    at INFO) is kept out of the log (:func:`quiet_py4j`), and so are its errors once ``stop``
    is set. A signal to the role alone (the supervisor's, ``Role.stops_children``) ends the
    same way: the JVM this process is starting is stopped (:func:`_end_a_starting_jvm`), so a
    stop does not wait for a start that takes 10 s and more on a loaded host. A session that
    was ready first is stopped, and its JVM, before any query starts.
    """
    quiet_py4j(stop)
    logger.info("starting the Spark session (master %s)", master or "of spark-submit")
    starting = _Starting()
    threading.Thread(
        target=_end_a_starting_jvm, args=(stop, starting), name="spark-start-stop", daemon=True
    ).start()
    try:
        spark = build_session(master, app_name, shuffle_partitions)
    except Exception:
        starting.done()
        if not stop.is_set():
            raise
        logger.info("stopped while Spark was starting")
        return None
    starting.done()
    if stop.is_set():
        jvm = launched_jvm()
        spark.stop()
        wait_for_jvm(jvm)
        logger.info("stopped while Spark was starting")
        return None
    return spark


class _Starting:
    """Whether :func:`session_unless_stopped` still waits for its session (under a lock, so the
    JVM of a session already returned is never stopped from the side)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting = True

    def done(self) -> None:
        with self.lock:
            self.waiting = False


def _end_a_starting_jvm(stop: threading.Event, starting: _Starting) -> None:
    """Once ``stop`` is set while the session still starts: terminate the JVM that pyspark
    launched from this process (a child whose command line is Spark's launcher), waiting for
    pyspark to launch it if the stop came first. pyspark then fails to start, which
    :func:`session_unless_stopped` takes as the stop it is.

    It keeps watching until the start is over. A child caught between pyspark's fork and its
    exec still runs this process's command line and its signal handlers, which take a SIGTERM
    as the role's own stop and go on to exec Spark's launcher: such a child is left until it
    has exec'd (a clean-clone run met it, and the JVM started in full). A child signalled
    once is signalled again only if it exec'd into another command line since."""
    while not stop.wait(0.1):
        if not starting.waiting:
            return
    own = _cmdline(os.getpid())
    signalled: dict[int, bytes] = {}
    while True:
        with starting.lock:
            if not starting.waiting:
                return
            for pid, argv in _spark_children(own).items():
                if signalled.get(pid) == argv:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                    logger.info("stopping Spark's starting JVM, pid %d", pid)
                signalled[pid] = argv
        time.sleep(0.05)


def _cmdline(pid: int) -> bytes | None:
    """A process's command line as ``/proc`` has it; None once it is gone or not ours to read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _spark_children(own: bytes | None) -> dict[int, bytes]:
    """This process's children that run Spark's launcher or JVM, with their command lines
    (``/proc``; none elsewhere). A child whose command line is still ``own`` has not exec'd."""
    found = {}
    me = os.getpid()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if ppid != me:
            continue
        argv = _cmdline(int(entry.name))
        if argv is None or argv == own:
            continue
        if any(b"spark" in arg.lower() for arg in argv.split(b"\0")):
            found[int(entry.name)] = argv
    return found


def launched_jvm() -> subprocess.Popen[bytes] | None:
    """The JVM pyspark launched for this process (``launch_gateway`` keeps its Popen on the
    gateway); None under spark-submit, which launched this process instead."""
    return getattr(SparkContext._gateway, "proc", None)  # noqa: SLF001


def wait_for_jvm(jvm: subprocess.Popen[bytes] | None, timeout_s: float = JVM_EXIT_TIMEOUT_S) -> None:
    """On shutdown, after ``spark.stop()``: stop the JVM (a signal to the process group already
    did; a signal to this process alone did not) and return once it has exited, so the role's
    exit means its checkpoint and ports are free and nothing of it is left running. A JVM
    that outlives ``timeout_s`` is killed."""
    if jvm is None:
        return
    if jvm.poll() is None:
        jvm.terminate()
    try:
        jvm.wait(timeout_s)
    except subprocess.TimeoutExpired:
        logger.warning(
            "the Spark JVM (pid %d) still runs %.0f s after the stop; killing it", jvm.pid, timeout_s
        )
        jvm.kill()
        jvm.wait(timeout_s)


def quiet_spark() -> None:
    """Turn off the driver JVM's Spark loggers (``org.apache.spark``, with a local master its
    executors' too) for the rest of its life: for a stop that cuts a micro-batch short,
    whose every abort Spark logs as an error (:func:`jobs.engine.stop_between_batches`).
    Other loggers (Kafka's client, Hadoop's) keep their levels. No JVM: nothing to do."""
    jvm = SparkContext._jvm  # noqa: SLF001 - pyspark offers no per-logger level
    if jvm is None:
        return
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel("org.apache.spark", log4j.Level.OFF)


class Py4jQuiet(logging.Filter):
    """Drops py4j's records: its INFO ones always (a traceback for each call that meets the
    JVM gone), its warnings and errors once ``stopping`` is set (the JVM, signalled with its
    role's process group, goes away under a call: ``Exception while sending command.`` at
    ERROR, nothing wrong). Other records pass."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping: threading.Event | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if f"{os.sep}py4j{os.sep}" not in record.pathname:
            return True
        stopping = self.stopping is not None and self.stopping.is_set()
        return record.levelno >= logging.WARNING and not stopping


PY4J_QUIET = Py4jQuiet()


def quiet_py4j(stop: threading.Event | None = None) -> None:
    """Keep py4j's INFO records out of the log, and all of them once ``stop`` is set
    (:class:`Py4jQuiet`). Most go through its loggers, some straight to the root logger
    (``logging.info``, ``logging.exception``): the filter is on each."""
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if stop is not None:
        PY4J_QUIET.stopping = stop
    for name in ("", "py4j.java_gateway", "py4j.clientserver"):  # the loggers py4j writes to
        log = logging.getLogger(name)
        if PY4J_QUIET not in log.filters:
            log.addFilter(PY4J_QUIET)
