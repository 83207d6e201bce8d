"""`python -m app backtest --engine spark --watch`: a run after an edit of the rules, in the
session the first run started, gives the Faust engine's lines for the edited rules."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.main import main
from app.runtime.settings import PROJECT_ROOT
from tests.conftest import child_env
from tests.watch_helpers import RULE, readings, save, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def faust_lines(tmp_path: Path, rule: Path, events: Path) -> list[str]:
    out = tmp_path / "faust.jsonl"
    assert main(["backtest", "--rules", str(rule), "--input", str(events), "--out", str(out)]) == 0
    return out.read_text().splitlines()


def test_a_watched_spark_backtest_runs_each_edit_in_its_first_session(tmp_path: Path) -> None:
    rule, events, out, err = (tmp_path / n for n in ("r.yaml", "e.jsonl", "out.jsonl", "err.log"))
    rule.write_text(RULE.format(limit=30))
    events.write_bytes(readings())
    before = faust_lines(tmp_path, rule, events)
    argv = ["--engine", "spark", "--master", "local[1]", "--rules", str(rule), "--input", str(events)]
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "backtest", *argv, "--out", str(out), "--watch"],
            cwd=PROJECT_ROOT,
            env=child_env(),
            stderr=stderr,
        )
        try:
            wait_for(lambda: "watching the rule files" in err.read_text(), 240)
            assert sorted(out.read_text().splitlines()) == sorted(before)
            save(rule, RULE.format(limit=32))
            after = faust_lines(tmp_path, rule, events)
            assert after != before  # 31 °C no longer fires
            wait_for(lambda: "run 2 took" in err.read_text(), 240)
            assert sorted(out.read_text().splitlines()) == sorted(after)
            proc.send_signal(signal.SIGTERM)  # a supervisor's stop: the session ends
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = err.read_text()
    assert log.count("spark session ready") == 1, log  # one session, both runs
    assert "stopped watching after 2 runs" in log and "Traceback" not in log
