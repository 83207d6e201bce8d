"""Two-engine conformance of the native window path (``jobs.windows``): the tumbling and
hopping rules of ``windows.yaml``, which a Spark backtest runs natively (clock, lateness and
aggregates in the JVM, the evaluator's lifecycle on the closed windows only), must give
exactly the Faust backtest's output lines, per-fingerprint id sequences and report counts on

* the suite's whole input (real NAB, access log and OHLC rows, crafted events late beyond
  the lateness, out of order within it, duplicated, a device going silent) over 2 partitions;
* the crafted window events alone on 1 partition (a firing group running through the empty
  windows of a silent device, a late event copied aside);
* the real NAB series for 3 devices with the time bound on (APP_MAX_EVENT_SKEW 5m), where
  no event is held, so every partition is native, and again with future-dated events, so
  the partitions they are on run the rules on the stream path (the bound holds events there).

The output lines come in the Faust backtest's order too: at one event, the windows that the
partition clock closed for many groups, rule by rule, by due and state key as the
evaluator's timer heap runs them, and around the transitions of the other native plans and
of the stream path (``jobs.transitions.AT_EVENT``).
"""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import orjson
import pytest
from pyspark.sql import SparkSession

from app.alerts import Alert
from app.backtest import BacktestReport, backtest, read_events
from app.rules.loader import load_rules
from jobs.backtest import file_records, run_backtest
from jobs.compile import plan_rules
from jobs.windows import native_rules
from tests.conformance.kind_cases import crafted_windows, lines_for_test
from tests.conformance.native_compare import EVERY_STATUS, compare_backtests, nab_devices

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a real Spark

WINDOWS = Path(__file__).with_name("windows.yaml")
SKEW_MS = 5 * 60_000


def compare(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, path: Path, partitions: int, max_skew_ms: int = -1
) -> tuple[list[Alert], BacktestReport, dict[str, int]]:
    """Both backtests of ``windows.yaml`` over ``path``; asserts that they are identical and
    returns the Spark one's alerts, report, and per rule how many partitions it left to the
    stream path."""
    ruleset = load_rules([WINDOWS])
    assert {r.id for r in native_rules(plan_rules(ruleset, every_rule=True))} == {r.id for r in ruleset.rules}
    found = compare_backtests(
        spark, caplog, ruleset, path, partitions=partitions, said="native windows", max_skew_ms=max_skew_ms
    )
    assert found.same_order  # at each event, in the evaluator's order
    return found.alerts, found.report, found.fell_back


def test_every_case_of_the_suite_on_two_partitions(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines_for_test()) + b"\n")
    alerts, report, fell_back = compare(spark, caplog, path, partitions=2)
    assert set(fell_back.values()) == {0}  # the time bound is off: every partition is native
    assert {a.rule_id for a in alerts} == set(fell_back), "a rule that never fires makes the comparison weak"
    assert {a.status for a in alerts if a.rule_id == "win-hourly"} >= {"pending", "firing", "resolved"}
    assert report.late > 0  # win-quiet (late_policy: side) copied the 200-degree reading aside


def test_a_silent_device_and_late_events_on_one_partition(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = tmp_path / "crafted.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in crafted_windows()) + b"\n")
    alerts, report, _ = compare(spark, caplog, path, partitions=1)
    quiet = [(a.status, a.values["n"]) for a in alerts if a.rule_id == "win-quiet"]
    assert quiet[-2:] == [("pending", 2), ("firing", 2)]  # from minute 115 empty windows, all matching
    talks = [(a.status, a.values["n"]) for a in alerts if a.rule_id == "win-w1-talks"]
    assert ("resolved", 0) in talks, "the silent device's first empty window did not end its alert"
    assert report.late == 1


def test_the_real_nab_series_with_the_time_bound_on(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = tmp_path / "nab.jsonl"
    nab_devices(path, 3, [])
    _, report, fell_back = compare(spark, caplog, path, partitions=2, max_skew_ms=SKEW_MS)
    assert report.events == 3 * 22_695
    assert set(fell_back.values()) == {0}  # the series never jumps ahead by 5m: nothing is held


def test_partitions_where_the_time_bound_holds_events_run_on_the_stream_path(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = tmp_path / "nab-future.jsonl"
    future = {"ts": "2099-12-31T00:00:00Z", "temperature": 200.0}
    nab_devices(path, 3, [{**future, "device_id": "nab-0"}])
    _, report, fell_back = compare(spark, caplog, path, partitions=2, max_skew_ms=SKEW_MS)
    assert report.refused == 3  # once per sensors stream: by device, by status, by nothing
    assert fell_back["win-hourly"] == 1 and fell_back["win-all"] == 1  # nab-0's partitions only
    assert fell_back["win-busy-client"] == 0


MIXED = """\
rules:
  - {id: hot, source: sensors, where: temperature > 80, clear: temperature < 75, group_by: [device_id]}
  - id: hourly
    source: sensors
    group_by: [device_id]
    window: {type: tumbling, size: 1h}
    allowed_lateness: 10m
    aggregate: {avg_t: avg(temperature), n: count(*)}
    having: avg_t > 80
  - {id: spike, source: sensors, group_by: [device_id], window: {type: sliding, size: 30m},
     aggregate: {hi: max(temperature)}, having: hi > 90}
  - id: half-hourly
    source: sensors
    group_by: [device_id]
    window: {type: tumbling, size: 30m}
    aggregate: {lo: min(temperature)}
    having: lo < 70
  - {id: silent, source: sensors, group_by: [device_id], absent_for: 20m}
"""


def test_the_evaluator_order_at_each_event_across_native_plans_and_the_stream_path(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Window closes of eight devices at the same events, two tumbling rules, next to a native
    threshold, a native absence (a device heard once) and a sliding window (the stream path):
    the same lines in the same order as the Faust backtest. Before every plan's rows were
    sorted by partition, offset and ``AT_EVENT`` together, the closes at one event came in the
    order of Spark's sort, not the evaluator's (by due, then state key)."""
    rules = tmp_path / "mixed.yaml"
    rules.write_text(MIXED)
    ruleset = load_rules([rules])
    path = tmp_path / "nab.jsonl"
    # a device heard once, in time, then silent
    nab_devices(
        path, 8, [{"device_id": "ghost", "ts": "2013-12-06T08:35:00.000Z", "temperature": 50.0}], 2_000
    )
    faust_report, faust_out = BacktestReport(statuses=EVERY_STATUS), io.StringIO()
    with path.open("rb") as f:
        backtest(ruleset, read_events(f, str(path), faust_report), faust_out, faust_report, partitions=2)
    spark_report, spark_out = BacktestReport(statuses=EVERY_STATUS), io.StringIO()
    run_backtest(spark, ruleset, file_records(spark, path), str(path), spark_out, spark_report, partitions=2)
    lines = faust_out.getvalue().splitlines()
    closes = Counter((d["rule"], d["event_ts"]) for d in map(orjson.loads, lines) if d["rule"] == "hourly")
    assert max(closes.values()) >= 4, "no event closed several groups' windows: the test is weak"
    assert {orjson.loads(x)["rule"] for x in lines} == {"hot", "hourly", "spike", "half-hourly", "silent"}
    assert spark_out.getvalue().splitlines() == lines
