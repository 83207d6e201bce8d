"""`python -m app backtest --watch`: the same backtest again at each edit of its rules that
loads, the last results kept at one that does not, until Ctrl-C (app/cli/watch.py)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from app.backtest import BacktestReport
from app.cli.watch import changes, watch
from app.rules.loader import RuleSet, load_rules
from tests.watch_helpers import RULE, backtest_process, readings, save, wait_for


def test_changes_names_each_rule_whose_count_moved() -> None:
    assert list(changes({"a": 3, "b": 1}, {"a": 3, "b": 0, "c": 2})) == [
        "b: 1 -> 0 transitions (-1)",
        "c: 0 -> 2 transitions (+2)",
    ]
    assert list(changes({"a": 3}, {"a": 3})) == ["no rule's transitions changed"]


def test_watch_runs_again_at_each_edit_that_loads_and_not_at_one_that_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rule = tmp_path / "r.yaml"
    rule.write_text(RULE.format(limit=30))
    seen: list[RuleSet] = []

    def run(rules: RuleSet) -> tuple[int, BacktestReport | None]:
        seen.append(rules)
        report = BacktestReport()
        report.by_rule = {"too-hot": len(seen)}
        return 0, report

    stop = threading.Event()
    result: list[int] = []
    watcher = threading.Thread(
        target=lambda: result.append(watch([rule], load_rules([rule]), run, poll_s=0.02, stop=stop))
    )
    watcher.start()
    try:
        wait_for(lambda: len(seen) == 1)
        save(rule, RULE.format(limit=32))
        wait_for(lambda: len(seen) == 2)
        assert seen[1].rules[0].where.text == "temperature > 32"
        save(rule, RULE.format(limit=""))  # does not parse: reported, not run
        wait_for(lambda: "rule files rejected" in capsys.readouterr().err)
        time.sleep(0.2)  # ten more checks of the same bad file: reported once, never run
        assert len(seen) == 2 and "rejected" not in capsys.readouterr().err
        save(rule, RULE.format(limit=28))
        wait_for(lambda: len(seen) == 3)
    finally:
        stop.set()
        watcher.join(10)
    assert result == [0]
    err = capsys.readouterr().err
    assert "too-hot: 2 -> 3 transitions (+1)" in err and "run 3 took" in err
    assert "stopped watching after 3 runs" in err


def test_watch_ends_at_once_on_an_input_error_and_goes_on_past_a_refused_set(tmp_path: Path) -> None:
    rule = tmp_path / "r.yaml"
    rule.write_text(RULE.format(limit=30))
    # the input is wrong (exit code 2, no report): no edit can mend it, so no watch
    assert watch([rule], load_rules([rule]), lambda _rules: (2, None), poll_s=0.01) == 2

    runs: list[int] = []

    def refused_then_run(_rules: RuleSet) -> tuple[int, BacktestReport | None]:
        runs.append(1)
        return (1, None) if len(runs) == 1 else (0, BacktestReport())

    stop = threading.Event()
    result: list[int] = []
    watcher = threading.Thread(
        target=lambda: result.append(
            watch([rule], load_rules([rule]), refused_then_run, poll_s=0.02, stop=stop)
        )
    )
    watcher.start()
    try:
        wait_for(lambda: len(runs) == 1)
        save(rule, RULE.format(limit=31))  # e.g. the edit gives the engine a rule again
        wait_for(lambda: len(runs) == 2)
    finally:
        stop.set()
        watcher.join(10)
    assert result == [0]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_the_backtest_command_watches_until_stopped(tmp_path: Path, stop: signal.Signals) -> None:
    rule, events, out, err = (tmp_path / n for n in ("r.yaml", "e.jsonl", "out.jsonl", "err.log"))
    rule.write_text(RULE.format(limit=30))
    events.write_bytes(readings())
    argv = ["--rules", str(rule), "--input", str(events), "--out", str(out), "--watch"]
    with backtest_process(argv, err) as proc:
        wait_for(lambda: "watching the rule files" in err.read_text(), 60)
        first = out.read_text().splitlines()
        assert len(first) == 7  # four firing at 31, three resolved at 25
        save(rule, RULE.format(limit=100))
        wait_for(lambda: "run 2 took" in err.read_text(), 60)
        assert out.read_text() == ""  # rewritten with the new rules' results
        proc.send_signal(stop)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 30 s after {stop.name}:\n{err.read_text()}")
        assert code == 0, err.read_text()
    log = err.read_text()
    assert "too-hot: 7 -> 0 transitions (-7)" in log, log
    assert "stopped watching after 2 runs" in log and "Traceback" not in log


def test_a_watched_input_gone_by_a_later_run_is_reported_and_the_watch_goes_on(tmp_path: Path) -> None:
    rule, events, err = (tmp_path / n for n in ("r.yaml", "e.jsonl", "err.log"))
    rule.write_text(RULE.format(limit=30))
    events.write_bytes(readings())
    argv = ["--rules", str(rule), "--input", str(events), "--out", str(tmp_path / "out.jsonl"), "--watch"]
    with backtest_process(argv, err) as proc:
        wait_for(lambda: "watching the rule files" in err.read_text(), 60)
        events.unlink()
        save(rule, RULE.format(limit=32))
        wait_for(lambda: "run 2 did not run" in err.read_text(), 60)
        save(rule, RULE.format(limit=33))  # still watching: the next edit is tried too
        wait_for(lambda: "run 3 did not run" in err.read_text(), 60)
        proc.terminate()
        assert proc.wait(timeout=30) == 2  # the last run's: its input is gone
    log = err.read_text()
    assert log.count(f"error: --input {events}: no such file") == 2, log
    assert "stopped watching after 3 runs" in log and "Traceback" not in log
