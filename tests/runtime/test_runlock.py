"""One run per data dir: a second `python -m app run` is refused while the first runs, and the
roles of a run whose supervisor died stop, or are killed, before the next run starts.

Before: a `kill -9` of the supervisor (or a terminal's hang-up) left every role running;
the next `make run` started a second worker, Spark query and archive beside them, and its
dispatcher crash-looped on the dead run's lock of `dispatch.sqlite3`."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import ConfigError
from app.runtime import runlock
from app.runtime.settings import PROJECT_ROOT
from app.runtime.system import wipe
from tests.conftest import child_env
from tests.procs import run_script, wait_for

pytestmark = [pytest.mark.slow]

# A supervisor in a process of its own, to be killed with -9: it locks the data dir, starts a
# role that stops on SIGTERM and one that ignores it (and says so with a file), prints their
# pids and waits.
FAKE_RUN = """
import sys, time
from pathlib import Path
from app.errors import ConfigError
from app.runtime import runlock
from app.runtime.supervisor import Role, Supervisor
from tests.conftest import make_settings

data = Path(sys.argv[1])
lock = runlock.hold(data)
stops = Role("stops", [sys.executable, "-c", "import time; time.sleep(120)"])
stubborn = Role("stubborn", [sys.executable, "-c",
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(sys.argv[1], 'w').close(); time.sleep(120)", str(data / "deaf")])
sup = Supervisor(make_settings(data), [stops, stubborn], data / "logs", quiet=True, hold_fds=(lock,))
sup.start()
print(stops.proc.pid, stubborn.proc.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes (its parent, the test, has not reaped it)
    return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()


def test_a_second_run_on_a_data_dir_in_use_is_refused_naming_the_first(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lock = runlock.hold(data)  # this test is "the first run"
    try:
        env = child_env(APP_DATA_DIR=str(data))
        code, _out, err = run_script(
            "import sys; from app.cli.main import main; sys.exit(main(['run', '--no-dashboard']))",
            env=env, timeout_s=60,
        )  # fmt: skip
        assert code == 2, err
        assert f"another `python -m app run` (pid {os.getpid()}) is running on {data}" in err
        assert sorted(p.name for p in data.iterdir()) == ["run.lock"]  # it touched nothing
    finally:
        os.close(lock)
    runlock.hold(data)  # released with its descriptor: the next run takes it


def test_fresh_wipes_all_but_the_lock_of_the_run_that_wipes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lock = runlock.hold(data)
    try:
        (data / "kafka" / "log").mkdir(parents=True)
        (data / "alerts.sqlite3").write_text("x")
        wipe(data)
        assert sorted(p.name for p in data.iterdir()) == ["run.lock"]
        other = os.open(data / "run.lock", os.O_RDONLY)
        try:  # still locked: the lock belongs to the file the run opened, which it did not remove
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    finally:
        os.close(lock)


def test_roles_die_with_their_supervisor_and_the_next_run_kills_one_that_does_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.runtime.runlock")
    data = tmp_path / "data"
    sup = subprocess.Popen(
        [sys.executable, "-c", FAKE_RUN, str(data)], cwd=PROJECT_ROOT, env=child_env(),
        stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    pids: list[int] = []
    try:
        assert sup.stdout is not None
        pids = [int(p) for p in sup.stdout.readline().split()]
        stops, stubborn = pids
        wait_for(lambda: (data / "deaf").exists() or None, timeout_s=30, interval_s=0.05, what="SIG_IGN")
        assert runlock.holders_of(data / "run.lock") == {sup.pid, stops, stubborn}
        sup.kill()
        sup.wait(timeout=10)
        # the role that stops on SIGTERM got it as its supervisor died
        wait_for(lambda: not _alive(stops) or None, timeout_s=10, interval_s=0.05, what="the role to stop")
        assert _alive(stubborn)
        assert runlock.holders_of(data / "run.lock") == {stubborn}
        lock = runlock.hold(data, wait_s=1.0)  # the next run: waits, then kills the one left
        os.close(lock)
        assert not _alive(stubborn)
        said = caplog.text
        assert f"its supervisor, pid {sup.pid}, is gone" in said
        assert f"killing pid {stubborn} of the earlier run" in said
    finally:
        for pid in (sup.pid, *pids):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_make_clean_refuses_while_a_run_holds_the_data_dir(tmp_path: Path) -> None:
    """`make clean` removed `.data` under a running `make run`; it refuses while the lock is held."""
    shutil.copy(PROJECT_ROOT / "Makefile", tmp_path / "Makefile")
    lock = runlock.hold(tmp_path / ".data")  # a run on the copy's .data
    try:
        held = subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert held.returncode != 0 and "a make run is using .data" in held.stderr
        assert (tmp_path / ".data" / "run.lock").exists()
    finally:
        os.close(lock)
    done = subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / ".data").exists()


def test_a_data_dir_that_cannot_be_written_is_refused_naming_it(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(ConfigError, match=f"cannot lock the data dir {blocked / 'data'}"):
        runlock.hold(blocked / "data")
