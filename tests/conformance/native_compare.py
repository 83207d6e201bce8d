"""What the native-plan conformance tests share: both backtests of one rule file over one
input, asserted identical (every status, per-fingerprint ids, report counts), and the real
NAB series for several devices."""

from __future__ import annotations

import io
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import SparkSession

from app.alerts import Alert
from app.backtest import BacktestReport, backtest, parse_statuses, read_events
from app.rules.loader import CompiledRule, RuleSet, load_rules
from app.tables import Tables
from ingest.adapters.nab import nab_events
from jobs.backtest import file_records, run_backtest
from jobs.compile import SparkPlan, plan_rules
from tests.conformance.threshold_cases import by_fingerprint
from tests.conftest import NAB_MACHINE_TEMP, require_dataset

EVERY_STATUS = parse_statuses("all")


@dataclass(frozen=True)
class Compared:
    """The Spark backtest's alerts and report, per native rule how many partitions it left to
    the stream path, and whether its output's line order is the Faust backtest's too."""

    alerts: list[Alert]
    report: BacktestReport
    fell_back: dict[str, int]
    same_order: bool


def compare_backtests(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, ruleset: RuleSet, path: Path, *,
    partitions: int, said: str, max_skew_ms: int = -1, tables: Tables | None = None,
) -> Compared:  # fmt: skip
    """Both backtests of ``ruleset`` over ``path``, asserted identical; ``said``: the log
    line's head (``native windows``, ``native thresholds``) naming every rule of ``ruleset``
    with its partitions left to the stream path."""
    faust_report, faust_out = BacktestReport(statuses=EVERY_STATUS), io.StringIO()
    with path.open("rb") as f:
        faust = backtest(
            ruleset, read_events(f, str(path), faust_report), faust_out, faust_report,
            partitions=partitions, max_skew_ms=max_skew_ms, tables=tables,
        )  # fmt: skip
    spark_report, spark_out = BacktestReport(statuses=EVERY_STATUS), io.StringIO()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jobs.backtest"):
        on_spark = run_backtest(
            spark, ruleset, file_records(spark, path), str(path), spark_out, spark_report,
            partitions=partitions, max_skew_ms=max_skew_ms, tables=tables,
        )  # fmt: skip
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{said}:")]
    assert logged, f"the {said} path did not run"
    fell_back = {m[1]: int(m[2]) for m in re.finditer(r"([\w-]+) \((\d+) partition", logged[-1])}
    assert set(fell_back) == {r.id for r in ruleset.rules}

    assert {a.alert_id for a in on_spark} == {a.alert_id for a in faust}
    assert by_fingerprint(on_spark) == by_fingerprint(faust)
    assert Counter(spark_out.getvalue().splitlines()) == Counter(faust_out.getvalue().splitlines())
    assert spark_out.getvalue().splitlines() == faust_out.getvalue().splitlines()  # and in order
    assert (spark_report.events, spark_report.skipped, spark_report.alerts, spark_report.late) == (
        faust_report.events, faust_report.skipped, faust_report.alerts, faust_report.late,
    )  # fmt: skip
    late = (spark_report.late_events, faust_report.late_events)  # the events a rule found too late
    assert late[0] == late[1], f"late events: {late[0]} on Spark, {late[1]} on the Faust engine"
    assert (spark_report.refused, sorted(spark_report.problems)) == (
        faust_report.refused, sorted(faust_report.problems),
    )  # fmt: skip
    return Compared(on_spark, spark_report, fell_back, spark_out.getvalue() == faust_out.getvalue())


def compare_native(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, rules: Path, path: Path, *, partitions: int,
    native: Callable[[SparkPlan], Sequence[CompiledRule]], said: str, max_skew_ms: int = -1,
    tables: Tables | None = None,
) -> Compared:  # fmt: skip
    """:func:`compare_backtests` of the rules in ``rules``, once ``native`` (a native module's
    ``native_rules``) is found to take every one of them."""
    ruleset = load_rules([rules])
    plan = plan_rules(ruleset, keyed_path=max_skew_ms < 0, every_rule=True)
    assert {r.id for r in native(plan)} == {r.id for r in ruleset.rules}
    return compare_backtests(
        spark, caplog, ruleset, path, partitions=partitions, said=said, max_skew_ms=max_skew_ms, tables=tables
    )


def nab_devices(path: Path, devices: int, future: list[dict[str, object]], rows_per_device: int = -1) -> None:
    """The real NAB series once per device (its first ``rows_per_device`` rows; -1: all),
    interleaved row by row; ``future`` events go in after the first 1,000 rows."""
    rows = [r for r in nab_events(str(require_dataset(NAB_MACHINE_TEMP)), device="x", field="temperature")]
    rows = rows if rows_per_device < 0 else rows[:rows_per_device]
    lines: list[bytes] = []
    for i, r in enumerate(r for r in rows if isinstance(r, dict)):
        if i == 1000:
            lines += [orjson.dumps(e) for e in future]
        lines += [orjson.dumps({**r, "device_id": f"nab-{d}"}) for d in range(devices)]
    path.write_bytes(b"\n".join(lines) + b"\n")


def write_events(path: Path, events: Iterable[dict[str, Any]]) -> Path:
    """``events`` as a JSON-lines file at ``path``."""
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in events) + b"\n")
    return path


def transitions_of(alerts: list[Alert], rule: str, group: str = "") -> list[tuple[str, str, str | None]]:
    """``(status, starts_at, ends_at)`` of ``rule``'s alerts, of the group with a label ``group``."""
    return [
        (a.status, a.starts_at, a.ends_at)
        for a in alerts
        if a.rule_id == rule and (not group or group in a.labels.values())
    ]
