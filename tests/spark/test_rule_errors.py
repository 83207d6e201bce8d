"""A rule whose evaluation raises on Spark does what it does in the Faust worker: the event is
skipped for that rule, the error is logged, and the micro-batch goes on; an ``error`` row
carries the count to the sink, which adds it to ``spark_rule_errors_total{rule}``. Here the
rule raises on a state it cannot read (a corrupted one). No Spark: :class:`jobs.state.GroupRunner`
and :class:`jobs.streams.StreamRunner` are what the workers run."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.backtest import BacktestReport
from app.rules.loader import load_rules
from jobs.backtest import report_rows
from jobs.compile import KEY_SEPARATOR, plan_rules
from jobs.state import OUTPUT_COLUMNS, GroupRunner
from jobs.streams import StreamRunner, stream_key
from tests.rules.helpers import sensor

KEYED = """engine: spark
rules:
  - {id: hot, source: sensors, where: temperature > 100, group_by: [device_id]}
"""
STREAMED = """engine: spark
rules:
  - id: spread
    source: sensors
    group_by: [device_id]
    window: {type: sliding, size: 30s}
    aggregate: {lo: min(temperature), hi: max(temperature)}
    having: hi - lo > 5
"""


def task_row(minute: int, temp: float, device: str = "d1", offset: int = 0) -> tuple[Any, ...]:
    """A task row ``(fields_json, holds, ts_ms, part, offset, source, dlq, conds)``."""
    ev = sensor(minute, temp, device)[1]
    holds = None if temp is None else temp > 100
    return (orjson.dumps(ev.fields).decode(), holds, ev.ts_ms, 0, offset, "sensors", None, None)


def stream_row(minute: int, temp: float, device: str = "d1", offset: int = 0) -> tuple[Any, ...]:
    """A stream-path task row: no ``holds`` (False would make it a tick, ``jobs.streams``)."""
    row = task_row(minute, temp, device, offset)
    return (row[0], None, *row[2:])


def plan_of(tmp_path: Path, body: str) -> Any:
    (tmp_path / "r.yaml").write_text(body)
    return plan_rules(load_rules([tmp_path / "r.yaml"]))


def errors(out: list[tuple[Any, ...]]) -> list[tuple[str, str]]:
    return [(r[7], r[3]) for r in out if r[0] == "error"]


def test_a_keyed_rule_that_raises_skips_the_event_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It used to fail the task, and after Spark's retries the whole query."""
    plan = plan_of(tmp_path, KEYED)
    assert [r.rule.id for r in plan.rules] == ["hot"]  # the keyed path
    runner = GroupRunner(plan)
    key = KEY_SEPARATOR.join(["hot", "d1"])
    out, state = runner.run_key(key, [task_row(0, 101)], None)
    assert [r[8] for r in out if r[0] == "alert"] == ["firing"] and errors(out) == []
    state["firing_since"] = "not a time"  # resolving reads it
    out, state = runner.run_key(key, [task_row(1, 50, offset=1), task_row(2, 40, offset=2)], state)
    assert errors(out) == [("hot", "2")]
    assert [r for r in out if r[0] == "alert"] == []
    assert "rule hot failed" in caplog.text


def test_a_stream_path_rule_that_raises_is_counted_and_the_others_go_on(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, STREAMED)
    runner = StreamRunner(plan.stream_rules, plan.streams, 1, max_skew_ms=-1)
    (spec,) = plan.streams
    key = stream_key(spec.name, 0)
    out, state = runner.run_key(key, [stream_row(0, 20), stream_row(0, 30, "d2", 1)], None)
    assert errors(out) == []
    d1 = next(k for k, st in state["s"].items() if st["group"] == ["d1"])
    state["s"][d1]["through"] = "not a time"  # every event of d1 reads it
    restored = orjson.loads(orjson.dumps(state))
    out, after = runner.run_key(
        key, [stream_row(1, 40, offset=2), stream_row(1, 31, "d2", 3), stream_row(1, 50, offset=4)], restored
    )
    # d1's timer as the clock passed its next change point, and d1's two events
    assert errors(out) == [("spread", "3")]
    d2 = next(st for st in after["s"].values() if st["group"] == ["d2"])
    assert [v for _ts, (_lo, v) in d2["buffer"]] == [31.0]  # d2 went on being evaluated
    # a backtest (`backtest --engine spark`) reads the same rows: the report is incomplete,
    # which makes the command exit 1 naming the rule
    report = BacktestReport()
    report_rows([dict(zip(OUTPUT_COLUMNS, r, strict=True)) for r in out], io.StringIO(), report, "in")
    assert report.rule_errors == {"spread": 3} and not report.complete
