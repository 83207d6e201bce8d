"""The streaming Spark engine against the real broker: alert ids equal to the Faust-engine
backtest across micro-batches and a restart (with either Kafka source), DLQ reasons equal
to the worker's, an idempotent sink, and a query started again after a Python worker
missed its start."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from pyspark.sql import DataFrame, SparkSession

import jobs.engine
from app.errors import ConfigError, IngestDecodeError
from app.events import SENSORS
from app.kafka.broker import KafkaBroker
from app.runtime.settings import Settings
from jobs.engine import (
    WORKER_MISSED_ITS_START,
    StateLayout,
    checkpoint_dir,
    layout_path,
    marker_path,
    state_layout,
)
from jobs.sink import BatchMarker, KafkaSink
from jobs.state import LEGACY_STATE_BUCKETS, LEGACY_STATE_CODEC, OUTPUT_SCHEMA, STATE_BUCKETS, STATE_CODEC
from tests.kafka_helpers import consume_json, produce
from tests.spark.conftest import FORMATS
from tests.spark.helpers import both_engines, by_fingerprint, expected, nab_lines, run_once

pytestmark = [pytest.mark.slow, pytest.mark.integration]

BAD = [
    b"{this is not json",
    b'{"device_id": "machine-temp-1", "ts": "2013-12-11T05:00:00Z", "temperature": "hot"}',
    b'{"device_id": "machine-temp-1", "ts": "2013-12-11T05:00:00Z", "colour": "red"}',
]


#: each Kafka source with the default decoder, and Spark's connector with the JVM decode too
SOURCES_AND_DECODERS = [*((fmt, "python") for fmt in FORMATS), ("kafka", "jvm")]


@pytest.mark.parametrize(("fmt", "decoder"), SOURCES_AND_DECODERS)
def test_alert_ids_match_the_backtest_across_batches_and_a_restart(
    spark: SparkSession,
    broker: KafkaBroker,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
    decoder: str,
) -> None:
    monkeypatch.setenv("APP_SPARK_KAFKA_FORMAT", fmt)
    monkeypatch.setenv("APP_SPARK_DECODE", decoder)
    ruleset = both_engines()
    lines = nab_lines(6000)  # several overheat episodes and a cold streak
    first, second = lines[:2409], lines[2409:]  # the cut: inside an overheat episode (05:35-06:55)
    produce(
        broker.bootstrap,
        "events.sensors",
        [(b"machine-temp-1", v) for v in [*first[:1000], *BAD, *first[1000:]]],
    )
    run_once(spark, settings, ruleset, per_trigger=700)
    after_first = consume_json(broker.bootstrap, "alerts", timeout_s=3)
    assert by_fingerprint(after_first) == expected(ruleset, first)

    produce(broker.bootstrap, "events.sensors", [(b"machine-temp-1", v) for v in second])
    run_once(spark, settings, ruleset, per_trigger=1500)  # same checkpoint: state and offsets resume
    alerts = consume_json(broker.bootstrap, "alerts", timeout_s=3)
    want = expected(ruleset, lines)
    assert sum(map(len, want.values())) >= 6 and by_fingerprint(alerts) == want
    assert {a["rule_id"] for a in alerts} == {"machine-overheat", "machine-cold"}
    assert marker_path(settings).parent == checkpoint_dir(settings)

    dlq = consume_json(broker.bootstrap, "dlq.events", min_count=3, timeout_s=5)
    reasons = []
    for raw in BAD:
        with pytest.raises(IngestDecodeError) as err:
            SENSORS.decode(raw)
        reasons.append((err.value.reason, err.value.field, raw.decode()))
    assert [(d["reason"], d["field"], d["raw"]) for d in dlq] == reasons
    assert {d["adapter"] for d in dlq} == {"spark-engine"} and {d["source"] for d in dlq} == {"sensors"}


def test_a_checkpoint_written_before_the_layout_record_resumes_with_its_state(
    spark: SparkSession, broker: KafkaBroker, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine of before the layout record hashed the keyed path's state into 64 buckets,
    stored it as JSON text and wrote no record: resumed by this one, the checkpoint keeps 64
    and JSON, and the overheat episode the restart cuts goes on with the same alert ids (with
    8 buckets its key's state would be looked for in another group, and its alerts would
    start over; with the compressed state Spark refuses the checkpoint's state schema)."""
    ruleset = both_engines()
    lines = nab_lines(6000)
    first, second = lines[:2409], lines[2409:]  # the cut: inside an overheat episode (05:35-06:55)
    produce(broker.bootstrap, "events.sensors", [(b"machine-temp-1", v) for v in first])
    with monkeypatch.context() as before:
        before.setattr(jobs.engine, "STATE_BUCKETS", LEGACY_STATE_BUCKETS)  # the engine before
        before.setattr(jobs.engine, "STATE_CODEC", LEGACY_STATE_CODEC)
        run_once(spark, settings, ruleset, per_trigger=700)
    layout_path(settings).unlink()  # which recorded nothing
    assert (STATE_BUCKETS, STATE_CODEC) != (LEGACY_STATE_BUCKETS, LEGACY_STATE_CODEC)

    produce(broker.bootstrap, "events.sensors", [(b"machine-temp-1", v) for v in second])
    run_once(spark, settings, ruleset, per_trigger=1500)
    assert state_layout(settings) == StateLayout(
        LEGACY_STATE_BUCKETS, LEGACY_STATE_CODEC
    )  # found so, recorded
    alerts = consume_json(broker.bootstrap, "alerts", timeout_s=3)
    assert by_fingerprint(alerts) == expected(ruleset, lines)


def test_the_sink_writes_a_batch_once_by_its_id(
    spark: SparkSession, broker: KafkaBroker, settings: Settings, tmp_path: Path
) -> None:
    rows = [
        ("alert", "alerts", "fp1", '{"alert_id": "a1"}', 0, 5, 0, "r", "firing", "a1"),
        ("late", None, None, "2", None, None, 0, "r", None, None),
        ("error", None, None, "3", None, None, 0, "r-err", None, None),
        ("dlq", "dlq.events", "sensors", '{"reason": "x"}', 0, 3, -1, None, None, None),
    ]
    errors_before = REGISTRY.get_sample_value("spark_rule_errors_total", {"rule": "r-err"}) or 0.0
    df = spark.createDataFrame(rows, OUTPUT_SCHEMA)
    marker = BatchMarker(tmp_path / "marker.json")
    sink = KafkaSink(settings, marker)
    try:
        sink(df, 7)
        sink(df, 7)  # re-run of the same batch after a restart
        sink(df, 6)
    finally:
        sink.close()
    assert marker.last() == 7
    # counted once (the re-run and the older batch are not produced again), never produced
    assert REGISTRY.get_sample_value("spark_rule_errors_total", {"rule": "r-err"}) == errors_before + 3
    assert consume_json(broker.bootstrap, "alerts", timeout_s=2) == [{"alert_id": "a1"}]
    assert consume_json(broker.bootstrap, "dlq.events", timeout_s=2) == [{"reason": "x"}]


def test_a_wrong_app_spark_decode_stops_the_role_before_spark_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused with the variable named (the role exits 2) before the output topics are made
    and the session is started: the broker given here does not exist."""
    rules = tmp_path / "r.yaml"
    rules.write_text("engine: spark\nrules:\n  - {id: hot, source: sensors, where: temperature > 100}\n")
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "APP_DATA_DIR": str(tmp_path)})
    monkeypatch.setenv("APP_SPARK_DECODE", "java")
    with pytest.raises(ConfigError, match="APP_SPARK_DECODE='java'"):
        jobs.engine.run(settings, jobs.engine.EngineOptions(rules=(rules,)), threading.Event())


def test_the_skip_of_what_came_while_spark_had_no_rule_counts_every_micro_batch(
    spark: SparkSession, broker: KafkaBroker, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The skip's log line summed the query's recent progress reports, which Spark keeps for
    the last 99 micro-batches only (here 2): a long skip was logged short."""
    ruleset = both_engines()
    lines = nab_lines(80)
    produce(broker.bootstrap, "events.sensors", [(b"machine-temp-1", v) for v in lines[:50]])
    run_once(spark, settings, ruleset, per_trigger=1000)  # the checkpoint has read something
    produce(broker.bootstrap, "events.sensors", [(b"machine-temp-1", v) for v in lines[50:]])
    spark.conf.set(jobs.engine.PROGRESS_KEPT, "3")
    caplog.set_level(logging.INFO, logger="jobs.engine")
    try:
        opts = jobs.engine.EngineOptions(max_offsets_per_trigger=4)  # 30 records: 8 micro-batches
        assert jobs.engine.skip_unruled(spark, settings, opts, threading.Event()) is None
    finally:
        assert spark.conf.get(jobs.engine.PROGRESS_KEPT) == "3", "the session's setting is left as it was"
        spark.conf.unset(jobs.engine.PROGRESS_KEPT)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("read past")]
    assert len(said) == 1 and said[0].startswith("read past 30 record(s) that came while"), said


def test_a_query_whose_python_worker_missed_its_start_goes_on_from_its_checkpoint(
    spark: SparkSession, broker: KafkaBroker, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark gives a fresh Python worker a fixed 10 s to connect back, which a loaded host can
    miss: the query fails. The role starts it again in its session, on its checkpoint: the
    failed micro-batch runs again and every alert id comes once, as without the failure.
    Before, the failure ended the role (here: the run failed)."""
    ruleset = both_engines()
    lines = nab_lines(2409)  # into an overheat episode (05:35-06:55)
    produce(broker.bootstrap, "events.sensors", [(b"machine-temp-1", v) for v in lines])
    produce_batch = KafkaSink.__call__
    calls: list[int] = []

    def missing_once(sink: KafkaSink, df: DataFrame, batch_id: int) -> None:
        calls.append(batch_id)
        if calls.count(2) == 1 and batch_id == 2:  # as the JVM reports it, under the query
            raise RuntimeError(f"org.apache.spark.SparkException: {WORKER_MISSED_ITS_START}")
        produce_batch(sink, df, batch_id)

    monkeypatch.setattr(KafkaSink, "__call__", missing_once)
    before = REGISTRY.get_sample_value("spark_query_restarts_total", {"query": "rules"}) or 0
    run_once(spark, settings, ruleset, per_trigger=700)
    assert calls == [0, 1, 2, 2, 3], "batch 2 again, after the restart, and no batch twice else"
    assert REGISTRY.get_sample_value("spark_query_restarts_total", {"query": "rules"}) == before + 1
    alerts = consume_json(broker.bootstrap, "alerts", timeout_s=3)
    want = expected(ruleset, lines)
    assert sum(map(len, want.values())) >= 2 and by_fingerprint(alerts) == want
