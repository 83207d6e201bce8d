"""The engine on separate executor JVMs: ``local-cluster[2,1,1024]`` (a standalone master and
two workers with one core and 1 GiB each, started by Spark inside the driver's JVM, the
executors as processes of their own) gives the alerts of ``local[2]``.

The cluster's backtest runs as its own ``python -m app backtest`` process (one JVM holds one
SparkContext); the ``local[2]`` one in the test session's, with the arguments the command
gives it (its JVM start saved: about 30 s of the suite).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from pyspark.sql import SparkSession

from app.backtest import BacktestReport, parse_statuses
from app.rules.loader import load_rules
from app.runtime.settings import PROJECT_ROOT, Settings
from jobs.backtest import file_records, run_backtest
from tests.conformance.threshold_cases import RULES, crafted

pytestmark = [pytest.mark.slow, pytest.mark.integration]

KINDS = RULES.with_name("kinds.yaml")


def backtest(tmp_path: Path, master: str, events: Path) -> list[str]:
    out = tmp_path / f"{master}.jsonl"
    argv = ["backtest", "--engine", "spark", "--master", master, "--rules", str(RULES), str(KINDS)]
    argv += ["--input", str(events), "--statuses", "all", "--partitions", "2", "--out", str(out)]
    env = {**os.environ, "APP_DATA_DIR": str(tmp_path / "data"), "KAFKA_BOOTSTRAP_SERVERS": ""}
    done = subprocess.run(
        [sys.executable, "-m", "app", *argv], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out.read_text().splitlines()


def backtest_here(spark: SparkSession, events: Path) -> list[str]:
    """What ``backtest`` above runs, on ``spark``: the command's arguments to ``run_backtest``."""
    out = io.StringIO()
    report = BacktestReport(statuses=parse_statuses("all"))
    run_backtest(
        spark, load_rules([RULES, KINDS]), file_records(spark, events), str(events), out, report,
        partitions=2, max_skew_ms=Settings.from_env().max_event_skew_ms,
    )  # fmt: skip
    return out.getvalue().splitlines()


def per_fingerprint(lines: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in lines:
        alert = orjson.loads(line)
        out.setdefault(alert["fingerprint"], []).append(alert["alert_id"])
    return out


@pytest.mark.timeout(1900)  # two Spark start-ups, the cluster's ~3 min on this loaded host
def test_local_cluster_gives_the_alerts_of_local(spark: SparkSession, tmp_path: Path) -> None:
    events = tmp_path / "crafted.jsonl"
    events.write_bytes(b"\n".join(orjson.dumps(e) for e in crafted()) + b"\n")
    assert spark.sparkContext.master == "local[2]"
    local = backtest_here(spark, events)
    cluster = backtest(tmp_path, "local-cluster[2,1,1024]", events)
    assert len(local) >= 4
    # what the conformance suite asserts: the same lines in the same order (the evaluator's at
    # each event, whichever plan or executor gave a row), so each fingerprint's transitions too
    assert cluster == local
    assert per_fingerprint(cluster) == per_fingerprint(local)
