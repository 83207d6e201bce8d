"""kill -9 of the Spark driver mid-stream: the restarted job loses no alert and invents no id,
with either Kafka source (Spark's connector and the kafka_py fallback).

The driver is ``python -m app spark`` in its own process group (Python, its JVM and
its Python workers die together); the restart runs in this test's Spark session on
the same checkpoint and data directory."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.kafka.broker import KafkaBroker
from app.runtime.settings import Settings
from jobs.engine import marker_path
from jobs.sink import BatchMarker
from tests.conftest import child_env
from tests.kafka_helpers import consume_json, produce
from tests.procs import role, wait_for
from tests.spark.conftest import FORMATS
from tests.spark.helpers import RULES, both_engines, by_fingerprint, expected, nab_lines, run_once

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PER_TRIGGER = 1500


def spark_role(rules: Path) -> list[str]:
    return ["app", "spark", "--master", "local[2]", "--rules", str(rules), "--max-offsets-per-trigger",
            str(PER_TRIGGER), "--trigger", "200 milliseconds"]  # fmt: skip


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_killed_driver_resumes_without_lost_alerts_or_new_ids(
    spark: SparkSession,
    broker: KafkaBroker,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
) -> None:
    monkeypatch.setenv("APP_SPARK_KAFKA_FORMAT", fmt)  # the restart below, in this process
    ruleset = both_engines()
    rules = RULES
    lines = nab_lines(9000)  # six micro-batches, holding several alert episodes
    produce(broker.bootstrap, "events.sensors", [(b"machine-temp-1", v) for v in lines])
    env = child_env(
        KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
        APP_DATA_DIR=str(settings.data_dir),
        APP_PARTITIONS="2",
        APP_SPARK_KAFKA_FORMAT=fmt,
    )
    marker = BatchMarker(marker_path(settings))
    with role(spark_role(rules), env, tmp_path / "spark-1.log") as proc:
        wait_for(lambda: marker.last() >= 1, timeout_s=120, what="two committed micro-batches")
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers, at once
        proc.wait(10)
    killed_at = marker.last()
    assert killed_at < len(lines) // PER_TRIGGER, "the kill must land before the end of the stream"
    before = consume_json(broker.bootstrap, "alerts", timeout_s=3)

    run_once(spark, settings, ruleset, per_trigger=PER_TRIGGER)  # the restart, on the killed checkpoint
    alerts = consume_json(broker.bootstrap, "alerts", timeout_s=3)
    want = expected(ruleset, lines)
    got = by_fingerprint(alerts)
    assert {i for ids in got.values() for i in ids} == {i for ids in want.values() for i in ids}
    # a replayed batch may repeat ids (at least once); dropping repeats leaves the exact sequence
    assert {fp: list(dict.fromkeys(ids)) for fp, ids in got.items()} == want
    assert len(alerts) >= len(before)
