"""`python -m app spark` as a `make run` role: SIGTERM to its process group (what the
supervisor sends), or to the role alone, stops it and its JVM cleanly, even while the JVM
starts, and without Spark rules it idles without a JVM."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from app.kafka.broker import KafkaBroker
from jobs.session import PY4J_QUIET, quiet_py4j
from tests.conftest import child_env
from tests.procs import gone, role, run_script, wait_for
from tests.spark.helpers import RULES

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.parametrize(
    ("engine", "ready", "group"),
    [
        ("both", "spark query 'rules' started", True),
        ("both", "spark query 'rules' started", False),  # the role alone: it stops its JVM itself
        ("both", "starting the Spark session", True),  # while its JVM starts: a stop too
        ("both", "starting the Spark session", False),  # the JVM starts, then stops before any query
        ("faust", "the Spark engine has nothing to do", True),
    ],
)
def test_sigterm_exits_zero_and_leaves_nothing(
    broker: KafkaBroker, tmp_path: Path, engine: str, ready: str, group: bool
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.read_text().replace("engine: both", f"engine: {engine}"))
    data = tmp_path / "data"
    env = child_env(KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_DATA_DIR=str(data))
    log = tmp_path / "spark.log"
    with role(["app", "spark", "--master", "local[2]", "--rules", str(rules)], env, log) as proc:
        wait_for(lambda: ready in log.read_text(errors="replace"), timeout_s=120, what=ready)
        started = time.monotonic()
        if group:
            os.killpg(proc.pid, signal.SIGTERM)  # as the supervisor stops a role
        else:
            os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() - started < 10
        if engine == "both":  # the role returned only once its JVM had exited
            assert "the Spark JVM (pid" not in log.read_text(errors="replace")  # not killed: it stopped
        if ready == "starting the Spark session" and not group:  # it did not wait for the JVM's start
            assert "stopping Spark's starting JVM" in log.read_text(errors="replace")
    assert "Traceback" not in log.read_text(errors="replace")
    assert gone(str(data)) == []
    if engine == "faust":
        assert "spark session ready" not in log.read_text(errors="replace")  # no JVM was started


#: a stop that comes before pyspark has even launched the JVM (the clean-clone run met one
#: 27 ms after "starting the Spark session", and the role waited for the whole start)
STOPPED_FIRST = """
import logging, threading
logging.basicConfig(level=logging.INFO, format="%(message)s")
from jobs.session import session_unless_stopped
stop = threading.Event()
stop.set()
print("session:", session_unless_stopped(stop, "local[2]"))
"""


def test_a_stop_before_the_jvm_is_launched_stops_it_as_soon_as_it_is(tmp_path: Path) -> None:
    data = tmp_path / "data"  # the marker of this test's processes
    code, out, err = run_script(STOPPED_FIRST, env=child_env(APP_DATA_DIR=str(data)))
    assert code == 0, err[-3000:]
    assert "session: None" in out
    assert "stopping Spark's starting JVM" in err, err[-3000:]
    assert "spark session ready" not in err  # it did not wait for the start to finish
    assert gone(str(data)) == []


#: a stop that finds pyspark's child between its fork and its exec: that child still runs the
#: role's command line and SIGTERM handler, which would take the signal for the role's own
#: stop and exec Spark's launcher anyway (a clean-clone run met it: the JVM started in full
#: and the role's stop waited for it). The pause before the exec makes that window wide.
STOPPED_BEFORE_THE_EXEC = """
import logging, signal, threading, time
import pyspark.java_gateway as gateway
logging.basicConfig(level=logging.INFO, format="%(message)s")
signal.signal(signal.SIGTERM, lambda *_: None)  # as the role's supervisor has one
launch = gateway.Popen
def slow_exec(command, **kwargs):
    before = kwargs.get("preexec_fn")
    def pause():
        if before:
            before()
        time.sleep(1.0)
    return launch(command, **{**kwargs, "preexec_fn": pause})
gateway.Popen = slow_exec
from jobs.session import session_unless_stopped
stop = threading.Event()
stop.set()
print("session:", session_unless_stopped(stop, "local[2]"))
"""


def test_a_stop_that_finds_the_jvm_between_fork_and_exec_stops_it_once_it_is_spark(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    code, out, err = run_script(STOPPED_BEFORE_THE_EXEC, env=child_env(APP_DATA_DIR=str(data)))
    assert code == 0, err[-3000:]
    assert "session: None" in out, err[-3000:]
    assert "stopping Spark's starting JVM" in err, err[-3000:]
    assert "spark session ready" not in err, err[-3000:]
    assert gone(str(data)) == []


def test_the_kafka_format_without_the_connector_exits_with_the_fetch_command(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    env = child_env(
        KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
        APP_DATA_DIR=str(data),
        APP_SPARK_KAFKA_FORMAT="kafka",
        APP_SPARK_KAFKA_JARS=str(tmp_path / "no-jars"),
    )
    log = tmp_path / "spark.log"
    with role(["app", "spark", "--master", "local[2]", "--rules", str(RULES)], env, log) as proc:
        assert proc.wait(60) == 2
    out = log.read_text(errors="replace")
    assert "scripts/fetch-jars.sh spark-kafka" in out and str(tmp_path / "no-jars") in out, out[-2000:]
    assert "spark session ready" not in out  # refused before a JVM was started
    assert gone(str(data)) == []


def test_py4j_records_are_kept_out_of_the_log_as_the_role_stops() -> None:
    """What the group case meets at random: the JVM, signalled with the role, goes away under
    a py4j call, and py4j logs ``Exception while sending command.`` at ERROR on the root
    logger. Its INFO records are dropped always, its errors once the role is stopping."""

    def record(path: str, level: int) -> logging.LogRecord:
        return logging.LogRecord("root", level, path, 1059, "Exception while sending command.", None, None)

    py4j = os.path.join("", "site-packages", "py4j", "java_gateway.py")
    ours = os.path.join("", "jobs", "engine.py")
    stop = threading.Event()
    before = PY4J_QUIET.stopping
    try:
        quiet_py4j(stop)
        assert PY4J_QUIET in logging.getLogger().filters
        assert PY4J_QUIET in logging.getLogger("py4j.java_gateway").filters
        assert not PY4J_QUIET.filter(record(py4j, logging.INFO))
        assert PY4J_QUIET.filter(record(py4j, logging.ERROR))  # running: an error is news
        stop.set()
        assert not PY4J_QUIET.filter(record(py4j, logging.ERROR))
        assert PY4J_QUIET.filter(record(ours, logging.ERROR))  # ours always pass
        assert PY4J_QUIET.filter(record(ours, logging.INFO))
    finally:
        PY4J_QUIET.stopping = before
