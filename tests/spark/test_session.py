"""The session a local master gets: its JVM listens on the loopback interface only, it
carries no deprecated setting (Spark 4 warns of one at every session and query), its
driver starts without Spark's start-up chatter, and its streaming checkpoints are written
without a subprocess per file."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from app.runtime.settings import PROJECT_ROOT
from jobs.session import ESCAPED_LITERALS
from tests.conftest import child_env

pytestmark = [pytest.mark.integration]

LISTEN = "0A"  # the TCP state in /proc/net/tcp


def _address(hex_addr: str) -> str:
    """``/proc/net/tcp{,6}``'s local address, as text (an IPv4-mapped IPv6 one as IPv4)."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # each 32-bit word is host order
    text = socket.inet_ntop(socket.AF_INET6, words)
    return text.removeprefix("::ffff:")


def listening(pid: int) -> set[str]:
    """The local addresses of the TCP sockets process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                found.add(_address(fields[1].split(":")[0]))
    return found


def test_a_local_session_listens_on_the_loopback_interface_only(spark: SparkSession) -> None:
    jvm = SparkContext._gateway.proc  # the JVM pyspark launched
    addresses = listening(jvm.pid)
    assert addresses, "the driver listens on nothing?"
    assert addresses == {"127.0.0.1"}, addresses  # the RPC, the block manager, the gateway


def test_the_session_does_not_carry_the_deprecated_literal_setting(spark: SparkSession) -> None:
    assert not spark.sparkContext.getConf().contains(ESCAPED_LITERALS)
    assert spark.conf.get(ESCAPED_LITERALS) == "false"  # what app.rules.spark_sql.quote writes for


#: a local driver's session, then a stateful streaming query started, stopped and resumed on
#: its checkpoint, then a query whose every batch outlasts its trigger, then one warning of our
#: own through the state store's logger
QUIET = """
import sys, time
from jobs.session import build_session
s = build_session('local[1]', app_name='chatter', extra={'spark.ui.enabled': 'false'})
print('rows', s.range(3).count())
for run in range(2):
    counts = s.readStream.format('rate').option('rowsPerSecond', 50).load().groupBy('value').count()
    q = (counts.writeStream.format('noop').outputMode('update').option('checkpointLocation', sys.argv[1])
         .trigger(processingTime='200 milliseconds').start())
    deadline = time.monotonic() + 60
    while len([p for p in q.recentProgress if p['numInputRows']]) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    q.stop()
    print('run', run, len([p for p in q.recentProgress if p['numInputRows']]))
slow = (s.readStream.format('rate').option('rowsPerSecond', 20).load().writeStream
        .foreachBatch(lambda df, i: time.sleep(0.4)).trigger(processingTime='100 milliseconds').start())
deadline = time.monotonic() + 60
while len(slow.recentProgress) < 5 and time.monotonic() < deadline:
    time.sleep(0.1)
slow.stop()
print('slow', len(slow.recentProgress))
store = 'org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider'
s._jvm.org.slf4j.LoggerFactory.getLogger(store).warn('a warning of the state store that must show')
s.stop()
"""


def test_a_local_driver_logs_none_of_sparks_chatter_at_start_resume_and_stop(tmp_path: Path) -> None:
    """Each `make run` starts two drivers and each Spark backtest one: their logs begin with
    what matters, not with Spark's default-profile lines and Hadoop's native-library warning;
    and a healthy streaming query starts, resumes and stops without Spark's warnings that an
    operator can do nothing about. Other warnings of the same classes still show. A query
    whose batches outlast their trigger says so once, not at every batch."""
    done = subprocess.run(
        [sys.executable, "-c", QUIET, str(tmp_path / "ck")], cwd=PROJECT_ROOT, env=child_env(),
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and "rows 3" in done.stdout, done.stderr[-3000:]
    batches = [int(ln.split()[2]) for ln in done.stdout.splitlines() if ln.startswith("run ")]
    assert len(batches) == 2 and min(batches) >= 2, done.stdout  # ran, stopped, resumed, ran
    for chatter in (
        "Using Spark's default log4j profile", "Setting default log level", "NativeCodeLoader",
        "doesn't exist in loadedMaps", "adaptive.enabled is not supported in streaming", "Disabling AQE",
        "Cannot find active jobs for it",
    ):  # fmt: skip
        assert chatter not in done.stderr, done.stderr[-3000:]
    assert "a warning of the state store that must show" in done.stderr, done.stderr[-3000:]
    slow = next(int(ln.split()[1]) for ln in done.stdout.splitlines() if ln.startswith("slow "))
    assert slow >= 5, done.stdout  # five batches behind their trigger: five warnings without the filter
    assert done.stderr.count("Current batch is falling behind") == 1, done.stderr[-3000:]


#: a stateful streaming query for a few micro-batches, once with each checkpoint manager; prints
#: how many ``readlink`` and ``chmod`` processes the JVM started during each (the fakes below
#: count them)
CHECKPOINTS = """
import sys, time
from jobs.session import CHECKPOINT_MANAGER, build_session
log, base, default = sys.argv[1:4]
s = build_session('local[1]', app_name='ck', shuffle_partitions=1, extra={'spark.ui.enabled': 'false'})
def forks(tool):
    return sum(line.split()[0] == tool for line in open(log).read().splitlines())
def batches(q):
    return len([p for p in q.recentProgress if p['numInputRows']])
for name, manager in (('ours', s.conf.get(CHECKPOINT_MANAGER)), ('context', default)):
    s.conf.set(CHECKPOINT_MANAGER, manager)
    before = {tool: forks(tool) for tool in ('readlink', 'chmod')}
    counts = s.readStream.format('rate').option('rowsPerSecond', 50).load().groupBy('value').count()
    q = (counts.writeStream.format('noop').outputMode('update').option('checkpointLocation', f'{base}/{name}')
         .trigger(processingTime='100 milliseconds').start())
    deadline = time.monotonic() + 60
    while batches(q) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    q.stop()
    print(name, batches(q), *(forks(tool) - n for tool, n in before.items()))
s.stop()
"""


def test_a_local_sessions_checkpoints_start_no_process_per_file(tmp_path: Path) -> None:
    """Without Hadoop's native library, its local file system forks the driver's JVM for two
    things each micro-batch does to its checkpoint files, several times per batch:
    ``FileContext`` reads a file's link status with ``readlink`` before renaming it, and a new
    file gets its permission from ``chmod``. Fakes first on the JVM's PATH count them: none
    with the session's checkpoint manager and file system (``jobs.local_fs``), some with
    Spark's default manager, whose ``FileContext`` also uses Hadoop's own file system."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "forks.log"
    log.write_text("")
    for tool in ("readlink", "chmod"):
        real = next(p for d in os.environ["PATH"].split(os.pathsep) if (p := Path(d) / tool).is_file())
        (fake / tool).write_text(f'#!/bin/sh\necho {tool} "$@" >> {log}\nexec {real} "$@"\n')
        (fake / tool).chmod(0o755)
    default = "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
    done = subprocess.run(
        [sys.executable, "-c", CHECKPOINTS, str(log), str(tmp_path / "ck"), default], cwd=PROJECT_ROOT,
        env=child_env(PATH=f"{fake}{os.pathsep}{os.environ['PATH']}"), capture_output=True, text=True,
        timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (ln.split() for ln in done.stdout.splitlines())
    found = {name: tuple(map(int, counts)) for name, *counts in lines}
    (ours, ours_readlinks, ours_chmods), (theirs, readlinks, chmods) = found["ours"], found["context"]
    assert ours >= 4 and theirs >= 4, found  # both ran micro-batches
    assert ours_readlinks == 0 and ours_chmods == 0, found
    assert readlinks >= theirs and chmods >= theirs, found  # at least one of each per micro-batch
