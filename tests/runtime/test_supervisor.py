"""The supervisor with real child processes: restart on crash, one-shot roles, staged stop
that also kills grandchildren."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from app.runtime.supervisor import ERROR_CHARS, Role, Supervisor, last_error, stop_on_signals
from tests.conftest import make_settings
from tests.procs import processes_with_env, wait_for

pytestmark = [pytest.mark.slow]


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def supervisor(tmp_path: Path, roles: list[Role]) -> Supervisor:
    return Supervisor(make_settings(tmp_path), roles, tmp_path / "logs", quiet=True)


def test_crashed_role_is_restarted_and_one_shot_role_is_not(tmp_path: Path) -> None:
    counter = tmp_path / "starts"
    crash = Role("crasher", py(f"open({str(counter)!r}, 'a').write('x'); raise SystemExit(3)"))
    once = Role("once", py("print('done')"), one_shot=True)
    sup = supervisor(tmp_path, [crash, once])
    sup.start()
    try:

        def started_three_times() -> bool | None:
            sup.poll()
            return (counter.exists() and len(counter.read_text()) >= 3) or None

        wait_for(started_three_times, timeout_s=20, interval_s=0.1, what="three starts of the crashing role")
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            sup.poll()
            time.sleep(0.05)
        assert once.done and once.exit_code == 0
        assert crash.exit_code == 3 and not crash.done
        assert len(crash.restarts) >= 2
    finally:
        sup.stop()


def test_a_role_runs_at_its_niceness_and_its_children_inherit_it(tmp_path: Path) -> None:
    child = "import os, subprocess, sys; print(os.nice(0), subprocess.run([sys.executable, '-c', 'import os; print(os.nice(0))'], capture_output=True, text=True).stdout.strip())"  # noqa: E501
    base = os.nice(0)
    roles = [Role("spark", py(child), one_shot=True, nice=10), Role("worker", py(child), one_shot=True)]
    sup = supervisor(tmp_path, roles)
    sup.start()
    try:
        wait_for(lambda: (sup.poll(), all(r.done for r in roles))[1] or None, timeout_s=20, what="both roles")
    finally:
        sup.stop()
    said = {r.name: (tmp_path / "logs" / f"{r.name}.log").read_text().split() for r in roles}
    assert said == {"spark": [str(min(19, base + 10))] * 2, "worker": [str(base)] * 2}


def test_a_role_that_keeps_crashing_is_tried_again_every_minute_and_each_crash_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each crash is told with the role's last line, a traceback's exception and message, in
    the supervisor's own log and in the states the console shows: the CI run where store-sync
    crashed five times said only "failed (exit 1, gave up)", and its output was in its file.
    Nor is a role given up on: the supervisor did, and the console showed no alert for the
    rest of the run. Past MAX_RESTARTS crashes in a row it is tried again every minute."""
    monkeypatch.setattr("app.runtime.supervisor.MAX_RESTARTS", 2)
    caplog.set_level(logging.WARNING, logger="app.runtime.supervisor")
    crash = Role("crasher", py("print('starting'); raise TimeoutError('no answer from the broker in 10 s')"))
    state_file = tmp_path / "roles.json"
    sup = Supervisor(make_settings(tmp_path), [crash], tmp_path / "logs", quiet=True, state_file=state_file)
    sup.start()
    try:
        for _ in range(400):
            sup.poll()
            if crash.streak == 4:
                break
            if crash.proc is None:
                crash.next_start = 0  # skip the backoff wait in this test
            time.sleep(0.05)
        assert crash.streak == 4 and not crash.done and crash.exit_code == 1
        why = "TimeoutError: no answer from the broker in 10 s"
        assert crash.last_error == why
        said = [r.getMessage() for r in caplog.records]
        looping = ": {} crashes in a row, each within 60 s of its start; trying again every 60 s"
        assert said == [
            f"crasher exited with 1 ({why}); restarting in 1s",
            f"crasher exited with 1 ({why}); restarting in 2s",
            f"crasher exited with 1 ({why})" + looping.format(3),
            f"crasher exited with 1 ({why})" + looping.format(4),
        ], said
        assert [r.levelno for r in caplog.records][2:] == [logging.ERROR, logging.WARNING]
        assert crash.next_start - time.monotonic() > 50
        (state,) = orjson.loads(state_file.read_bytes())["roles"]
        assert (state["state"], state["crashes"], state["last_error"]) == ("crash-looping", 4, why)
        assert 50 < state["retry_at"] - time.time() <= 60
    finally:
        sup.stop()


def test_a_role_that_ran_a_while_before_it_crashed_starts_its_count_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.runtime.supervisor.RESTART_WINDOW_S", 0.5)
    starts = tmp_path / "starts"
    crash = Role(
        "crasher",
        py(f"import time; open({str(starts)!r}, 'a').write('x'); time.sleep(1); raise SystemExit(1)"),
    )
    sup = supervisor(tmp_path, [crash])
    sup.start()
    try:

        def started_three_times() -> bool | None:
            sup.poll()
            if crash.proc is None:
                crash.next_start = 0  # skip the backoff wait in this test
            return (starts.exists() and len(starts.read_text()) >= 3) or None

        wait_for(started_three_times, timeout_s=20, interval_s=0.05, what="two crashes and a third start")
        assert crash.streak == 1, "each crash came a second after its start, past the window: none in a row"
    finally:
        sup.stop()


def test_a_crash_is_told_by_the_last_line_said_cut_to_a_readable_length() -> None:
    assert last_error(["Traceback (most recent call last):\n", "ValueError: bad\n", "\n", "  \n"]) == (
        "ValueError: bad"
    )
    assert last_error([]) is None and last_error(["\n"]) is None
    long = last_error(["x" * 1000])
    assert long is not None and len(long) == ERROR_CHARS and long.endswith("…")


def test_stop_terminates_children_and_grandchildren_in_stage_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = f"SUPERVISOR_TEST_{os.getpid()}_{tmp_path.name}"
    order = tmp_path / "order"
    # a child that ignores nothing but spawns a long-lived grandchild in its group
    parent_code = (
        "import subprocess, sys, signal, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"def bye(*_):\n    open({str(order)!r}, 'a').write(sys.argv[1] + '\\n'); raise SystemExit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "time.sleep(600)\n"
    )
    first = Role("first", [*py(parent_code), "first"], stage=1, env={marker: "1"})
    second = Role("second", [*py(parent_code), "second"], stage=2, env={marker: "1"})
    stubborn = Role(
        "stubborn",
        py("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"),
        stage=2,
        env={marker: "1"},
    )
    sup = supervisor(tmp_path, [second, stubborn, first])
    sup.start()
    wait_for(
        lambda: len(processes_with_env(marker)) >= 5 or None, timeout_s=20, what="children and grandchildren"
    )
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="app.runtime.supervisor"):
        for stage in (1, 2):
            sup.stop_stage(stage, grace_s=2.0)
    assert time.monotonic() - started < 10
    assert order.read_text().split() == ["first", "second"]
    # where the stop spent its time: the stubborn role's 2 s grace, in stage 2
    took = {m.split()[2]: float(m.split()[-2]) for m in caplog.messages if m.startswith("stopped stage")}
    assert set(took) == {"1", "2"}
    assert took["1"] < 2.0 <= took["2"]
    assert "stopped stage 2 (second, stubborn) in" in caplog.text
    assert wait_for(lambda: processes_with_env(marker) == [] or None, timeout_s=5, what="no survivors")


def test_the_state_file_says_what_each_role_is_doing(tmp_path: Path) -> None:
    """What the console's pipeline health reads: running, waiting for a file, restarting after
    a crash, done, and stopped at the end; written when it changes."""
    state_file = tmp_path / "roles-state.json"
    roles = [
        Role("server", py("import time; time.sleep(60)")),
        Role("crasher", py("raise SystemExit(3)")),
        Role("once", py("pass"), one_shot=True),
        Role("later", py("import time; time.sleep(60)"), requires_file=tmp_path / "ready"),
    ]
    sup = Supervisor(make_settings(tmp_path), roles, tmp_path / "logs", quiet=True, state_file=state_file)
    sup.start()

    def states() -> dict[str, str]:
        return {r["name"]: r["state"] for r in orjson.loads(state_file.read_bytes())["roles"]}

    try:

        def settled() -> dict[str, str] | None:
            sup.poll()
            got = states()
            return got if got["crasher"] == "restarting" and got["once"] == "done" else None

        got = wait_for(settled, timeout_s=20, interval_s=0.1, what="the crash and the one-shot's end")
        assert got == {"server": "running", "crasher": "restarting", "once": "done", "later": "waiting"}
        crasher = next(r for r in orjson.loads(state_file.read_bytes())["roles"] if r["name"] == "crasher")
        assert crasher["exit_code"] == 3 and crasher["crashes"] >= 1
        (tmp_path / "ready").touch()
        wait_for(
            lambda: (sup.poll(), states()["later"] == "running")[1], timeout_s=10, what="the waiting role"
        )
    finally:
        sup.stop()
    assert set(states().values()) <= {"stopped", "done"}


def test_a_delayed_role_waits_its_delay_then_starts(tmp_path: Path) -> None:
    """A role with ``delay_s`` (the archive's JVM under make run) is not started with the
    others: it is ``waiting`` until its delay has passed, then ``poll`` starts it."""
    state_file = tmp_path / "roles-state.json"
    roles = [
        Role("now", py("import time; time.sleep(60)")),
        Role("later", py("import time; time.sleep(60)"), delay_s=2.0),
    ]
    sup = Supervisor(make_settings(tmp_path), roles, tmp_path / "logs", quiet=True, state_file=state_file)
    started = time.monotonic()
    sup.start()

    def states() -> dict[str, str]:
        return {r["name"]: r["state"] for r in orjson.loads(state_file.read_bytes())["roles"]}

    try:
        sup.poll()
        assert states() == {"now": "running", "later": "waiting"}
        wait_for(
            lambda: (sup.poll(), states()["later"] == "running")[1], timeout_s=20, what="the delayed role"
        )
        assert time.monotonic() - started >= 2.0
    finally:
        sup.stop()


STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(600)"
)


def _stubborn_in_every_stage(tmp_path: Path, marker: str) -> Supervisor:
    roles = [Role(f"stubborn{n}", py(STUBBORN), stage=n, env={marker: "1"}) for n in (1, 2, 3)]
    sup = supervisor(tmp_path, roles)
    sup.start()
    logs = [tmp_path / "logs" / f"{r.name}.log" for r in roles]
    up = lambda: all(p.exists() and "up" in p.read_text() for p in logs) or None  # noqa: E731
    wait_for(up, timeout_s=20, what="the roles ignoring SIGTERM")
    return sup


def test_a_stop_keeps_to_its_budget_when_every_stage_ignores_sigterm(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = f"SUPERVISOR_BUDGET_{os.getpid()}_{tmp_path.name}"
    sup = _stubborn_in_every_stage(tmp_path, marker)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="app.runtime.supervisor"):
        sup.stop(budget_s=2.0)
    took = time.monotonic() - started
    # stage 1 waits out the budget; the later stages get a last half second each, not 3 x 6 s
    assert 2.0 <= took < 6.0, took
    kills = [m for m in caplog.messages if "did not stop within" in m]
    assert [m.split()[0] for m in kills] == ["stubborn1", "stubborn2", "stubborn3"]
    assert "within 2.0s" in kills[0] and "within 0.5s" in kills[2]
    assert wait_for(lambda: processes_with_env(marker) == [] or None, timeout_s=5, what="no survivors")


def test_a_second_signal_kills_what_is_left_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marker = f"SUPERVISOR_FORCE_{os.getpid()}_{tmp_path.name}"
    sup = _stubborn_in_every_stage(tmp_path, marker)
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    force = threading.Event()
    try:
        stop = stop_on_signals("the test's roles", force)
        os.kill(os.getpid(), signal.SIGINT)  # the operator's Ctrl-C
        assert wait_for(stop.is_set, timeout_s=5, what="the stop") and not force.is_set()
        # and again, a second into the stop's first stage
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        started = time.monotonic()
        with caplog.at_level(logging.INFO):
            sup.stop(force=force)
        took = time.monotonic() - started
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    assert force.is_set()
    assert took < 3.0, took  # not the first stage's 6 s grace, nor the later ones'
    assert "received SIGTERM again: killing the test's roles now" in caplog.text
    assert [m for m in caplog.messages if m.startswith("killing stubborn")] == [
        "killing stubborn1 (a second signal)", "killing stubborn2 (a second signal)",
        "killing stubborn3 (a second signal)",
    ]  # fmt: skip
    assert wait_for(lambda: processes_with_env(marker) == [] or None, timeout_s=5, what="no survivors")


@pytest.mark.parametrize("stops_children", [True, False])
def test_a_role_that_stops_its_own_children_gets_the_signal_alone(
    tmp_path: Path, stops_children: bool
) -> None:
    """The Spark roles stop their query, then their JVM, on SIGTERM: the supervisor's signal
    must not reach the JVM first (its shutdown hooks stop Spark under the running query). Any
    other role gets it with its whole process group, children at once."""
    order, ready = tmp_path / "order", tmp_path / "ready"
    child_code = (
        "import signal, sys, time\n"
        f"def bye(*_):\n    open({str(order)!r}, 'a').write('child\\n'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"open({str(ready)!r}, 'w').write('1')\n"
        "time.sleep(600)\n"
    )
    role_code = (
        "import subprocess, sys, signal, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child_code!r}])\n"
        "def bye(*_):\n"
        "    time.sleep(0.5)  # time enough for a signal to the group to reach the child\n"
        "    state = 'running' if child.poll() is None else 'gone'\n"
        f"    open({str(order)!r}, 'a').write('role: child ' + state + '\\n')\n"
        "    child.terminate(); child.wait(5); raise SystemExit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "time.sleep(600)\n"
    )
    role = Role("engine", py(role_code), stage=1, stops_children=stops_children)
    sup = supervisor(tmp_path, [role])
    sup.start()
    try:
        wait_for(lambda: ready.exists() or None, timeout_s=20, what="the role's child")
    finally:
        sup.stop_stage(1, grace_s=5.0)
    expected = ["role: child running", "child"] if stops_children else ["child", "role: child gone"]
    assert order.read_text().splitlines() == expected
    assert role.exit_code == 0


def test_a_hang_up_stops_everything_as_ctrl_c_does_but_not_under_nohup() -> None:
    """A terminal closed under `make run` sends SIGHUP: it stops the run as Ctrl-C does (before,
    it killed the supervisor alone, and the roles ran on). Under `nohup` it stays ignored."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.getsignal(s) for s in signals}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup make run
        stop_on_signals("the run")
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        stop = stop_on_signals("the run")
        os.kill(os.getpid(), signal.SIGHUP)
        assert wait_for(stop.is_set, timeout_s=5, what="the stop")
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
