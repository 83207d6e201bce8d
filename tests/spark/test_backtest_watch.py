"""`python -m app backtest --engine spark --watch`: a run after an edit of the rules, in the
session the first run started, gives the Faust engine's lines for the edited rules; its input
is decoded again only when the edit changes what the decoder does (jobs.backtest.KeptInput)."""

from __future__ import annotations

import io
import signal
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.backtest import BacktestReport
from app.cli.main import main
from app.rules.loader import load_rules
from jobs.backtest import KeptInput, file_records, run_backtest
from tests.watch_helpers import RULE, backtest_process, readings, save, wait_for

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
    args = [*argv, "--out", str(out), "--watch"]
    with backtest_process(args, err) as proc:
        wait_for(lambda: "watching the rule files" in err.read_text(), 240)
        assert sorted(out.read_text().splitlines()) == sorted(before)
        save(rule, RULE.format(limit=32))
        after = faust_lines(tmp_path, rule, events)
        assert after != before  # 31 °C no longer fires
        wait_for(lambda: "run 2 took" in err.read_text(), 240)
        assert sorted(out.read_text().splitlines()) == sorted(after)
        events.rename(events.with_suffix(".gone"))  # a later run's input gone: reported, not run
        save(rule, RULE.format(limit=33))
        wait_for(lambda: "run 3 did not run" in err.read_text(), 240)
        proc.send_signal(signal.SIGTERM)  # a supervisor's stop: the session ends
        assert proc.wait(timeout=60) == 2  # the last run's: its input is gone
    log = err.read_text()
    assert log.count("spark session ready") == 1, log  # one session, every run
    assert log.count("read again from the cache") == 1, log  # a condition edited: no second decode
    assert f"error: --input {events}: no such file" in log, log
    assert "stopped watching after 3 runs" in log and "Traceback" not in log


def backtest_lines(spark: SparkSession, rules: str, events: Path, kept: KeptInput | None) -> list[str]:
    rule = events.with_name("kept.yaml")
    rule.write_text(rules)
    out = io.StringIO()
    raw = kept.records(spark) if kept is not None else file_records(spark, events)
    run_backtest(spark, load_rules([rule]), raw, str(events), out, BacktestReport(), kept=kept)
    return out.getvalue().splitlines()


#: a window rule: the stream path, so its grouping is the decoder's routing (jobs.streams.router)
WINDOW = (
    "  - id: warm-minutes\n    source: sensors\n    group_by: [{by}]\n"
    "    window: {{type: tumbling, size: 5m}}\n    aggregate: {{top: max(temperature)}}\n"
    "    having: top > 30\n"
)


def test_a_kept_input_is_decoded_again_only_when_the_decoder_or_the_file_changes(
    spark: SparkSession, tmp_path: Path
) -> None:
    events = tmp_path / "e.jsonl"
    events.write_bytes(readings().replace(b'"temperature"', b'"kind":"boiler","temperature"'))
    kept = KeptInput(events)
    try:
        for rules, decodes in [
            (RULE.format(limit=30) + WINDOW.format(by="device_id"), 1),
            (RULE.format(limit=32) + WINDOW.format(by="device_id"), 1),  # a condition tuned: the cache
            (RULE.format(limit=32) + WINDOW.format(by="kind"), 2),  # another routing: decoded again
        ]:
            lines = backtest_lines(spark, rules, events, kept)
            assert lines and lines == backtest_lines(spark, rules, events, None)
            assert kept.decodes == decodes
        save(events, events.read_text().replace('"d1"', '"d2"'))  # the file itself changed: read again
        lines = backtest_lines(spark, rules, events, kept)
        assert kept.decodes == 3 and lines == backtest_lines(spark, rules, events, None)
        assert all('"d2"' in line for line in lines if "too-hot" in line)
    finally:
        kept.release()
