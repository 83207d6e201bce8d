"""Helpers of the streaming Spark engine tests: the rules both engines run, the real NAB
series as records, the Faust-engine backtest's alert ids per fingerprint, and one run of
the engine until its input is drained."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

import orjson
from pyspark.sql import SparkSession

from app.backtest import BacktestReport, backtest, read_events
from app.rules.loader import RuleSet, load_rules
from app.runtime.settings import Settings
from ingest.adapters.nab import nab_events
from jobs.compile import plan_rules
from jobs.engine import EngineOptions, serve
from tests.conftest import NAB_MACHINE_TEMP, require_dataset

RULES = Path(__file__).with_name("rules.yaml")  # machine-overheat and machine-cold, engine: both
#: a rule of the stream path (a sliding window grouped by the topic key), as an item of ``rules:``
SPIKE = """\
  - id: spike
    source: sensors
    group_by: [device_id]
    window: {type: sliding, size: 5m}
    aggregate: {hi: max(temperature)}
    having: hi > 100
"""


def both_engines() -> RuleSet:
    return load_rules([RULES])


def nab_lines(n: int) -> list[bytes]:
    rows = islice(
        nab_events(str(require_dataset(NAB_MACHINE_TEMP)), device="machine-temp-1", field="temperature"), n
    )
    return [orjson.dumps(r) for r in rows]


def expected(ruleset: RuleSet, lines: list[bytes]) -> dict[str, list[str]]:
    """The Faust-engine backtest's alert ids, per fingerprint (the order Kafka keeps)."""
    report = BacktestReport()
    with open(os.devnull, "w") as out:
        return by_fingerprint(
            a.to_dict() for a in backtest(ruleset, read_events(lines, "nab", report), out, report)
        )


def by_fingerprint(alerts: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in alerts:
        out.setdefault(a["fingerprint"], []).append(a["alert_id"])
    return out


def run_once(
    spark: SparkSession, settings: Settings, ruleset: RuleSet, per_trigger: int, timeout_s: float = 120
) -> None:
    """The engine's query over what its topics hold (``Trigger.AvailableNow``), as the role
    runs it (:func:`jobs.engine.serve`: also started again after a Python worker missed its
    start); a failure, or not caught up within ``timeout_s``, fails the test."""
    opts = EngineOptions(once=True, max_offsets_per_trigger=per_trigger)
    stop = threading.Event()
    deadline = threading.Timer(timeout_s, stop.set)
    deadline.start()
    try:
        failure = serve(spark, plan_rules(ruleset), settings, opts, None, stop)
    finally:
        deadline.cancel()
    assert not stop.is_set(), f"the engine's query did not catch up within {timeout_s} s"
    assert failure is None, failure
