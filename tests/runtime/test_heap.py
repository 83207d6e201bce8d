"""The backtest command runs the evaluator with the Faust worker's collector settings
(``app.runtime.heap``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli.main import main
from app.runtime.heap import GC_THRESHOLDS
from app.runtime.settings import PROJECT_ROOT


@pytest.fixture
def default_collector() -> Iterator[None]:
    """Python's default thresholds for the test, the session's own restored after it."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*before)


@pytest.mark.usefixtures("default_collector")
def test_the_backtest_command_runs_with_the_workers_collector(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text('{"device_id": "d1", "ts": "2024-01-01T00:00:00Z", "temperature": 20.5}\n')
    rules = str(PROJECT_ROOT / "rules" / "iot.yaml")
    assert main(["backtest", "--rules", rules, "--input", str(events), "--out", str(tmp_path / "out")]) == 0
    assert gc.get_threshold() == GC_THRESHOLDS
    assert GC_THRESHOLDS[0] > 700  # not Python's default
