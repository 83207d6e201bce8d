"""The stream path (windows, absence with and without expect_from, change, sequences,
keep_firing_for, enrichment) in the streaming Spark engine against the real broker: small
micro-batches and a restart on the same checkpoint give the Faust-engine backtest's alert
ids, with registry rows read from the table topic."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import SparkSession

from app.backtest import BacktestReport, backtest, read_events
from app.kafka.broker import KafkaBroker
from app.rules.loader import load_rules
from app.runtime.settings import Settings
from app.topics import DEVICES_TABLE
from jobs.compile import plan_rules
from jobs.engine import ensure_output_topics, state_layout
from jobs.sink import state_groups
from jobs.streams import RegistryFollower
from tests.conformance.kind_cases import DEVICES, RULES, crafted_windows, tables
from tests.conftest import reset_topics
from tests.kafka_helpers import consume_json, produce
from tests.regrouped import REGROUPED, regrouped_logs
from tests.spark.helpers import nab_lines, run_once

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def ids_by_fingerprint(alerts: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in alerts:
        out.setdefault(a["fingerprint"], []).append(a["alert_id"])
    return out


@pytest.mark.parametrize(("split", "decoder"), [("1", "python"), ("3", "jvm")])
def test_stream_path_matches_the_backtest_across_batches_and_a_restart(
    spark: SparkSession, broker: KafkaBroker, settings: Settings, monkeypatch: pytest.MonkeyPatch,
    split: str, decoder: str,
) -> None:  # fmt: skip
    """Also with each stream partition split in three parts (``APP_SPARK_STREAM_SPLIT``), the
    records decoded in the JVM where they can be."""
    monkeypatch.setenv("APP_SPARK_STREAM_SPLIT", split)
    monkeypatch.setenv("APP_SPARK_DECODE", decoder)
    ruleset = load_rules([RULES])
    sensors = [(b"machine-temp-1", v) for v in nab_lines(3000)]
    crafted = [e for e in crafted_windows() if "device_id" in e]
    sensors += [(e["device_id"].encode(), orjson.dumps(e)) for e in crafted]
    produce(broker.bootstrap, DEVICES_TABLE, [(d["device_id"].encode(), orjson.dumps(d)) for d in DEVICES])
    asyncio.run(ensure_output_topics(plan_rules(ruleset), settings))  # as `jobs.engine.run` does
    first, second = sensors[:3040], sensors[3040:]  # the cut falls inside the crafted windows
    produce(broker.bootstrap, "events.sensors", first)
    before = state_groups()
    run_once(spark, settings, ruleset, per_trigger=400)
    assert state_layout(settings).split == int(split)
    groups = {k: n - before[k] for k, n in state_groups().items()}
    # each stateful group's state, after its first micro-batch, is live in the worker that got
    # its task or in the one that ran it last (jobs.peers): none restored from the store
    assert groups["new"] >= 2 and groups["live"] + groups["peer"] >= 8 and groups["stored"] == 0, groups
    produce(broker.bootstrap, "events.sensors", second)
    run_once(spark, settings, ruleset, per_trigger=25)  # same checkpoint: state, clocks, offsets resume
    got = consume_json(broker.bootstrap, "alerts", timeout_s=3)

    report = BacktestReport()
    lines = [v for _, v in sensors]
    want = backtest(
        ruleset, read_events(lines, "s", report), io.StringIO(), report,
        partitions=settings.partitions, tables=tables(), max_skew_ms=settings.max_event_skew_ms,
    )  # fmt: skip
    assert {a.rule_id for a in want} >= {"hourly-heat", "heat-rising", "device-silent", "overheat-held"}
    assert {a.rule_id for a in want} >= {"too-hot-for-its-site", "status-change", "hot-quarter"}
    ghosts = {a.labels["device_id"] for a in want if a.rule_id == "registry-silent"}  # expect_from
    assert ghosts >= {"ghost-1"}
    assert ids_by_fingerprint(got) == ids_by_fingerprint(a.to_dict() for a in want)
    late = consume_json(broker.bootstrap, "events.late", timeout_s=2)
    assert [(d["rule_id"], d["event"]["temperature"]) for d in late] == [("hot-quarter", 200.0)]


def test_the_registry_follower_reads_a_recreated_table_topic_again(broker: KafkaBroker) -> None:
    follower = RegistryFollower(broker.bootstrap, every_s=0)
    rows = [{"device_id": f"d-{i}", "site": "old", "max_temp": 90.0} for i in range(5)]
    bad = [(b"d-x", b'{"device_id": "d-x", "lat": 999.0}'), (b"d-y", b"not json")]
    produce(broker.bootstrap, DEVICES_TABLE, [(r["device_id"].encode(), orjson.dumps(r)) for r in rows] + bad)
    assert follower.poll().get("devices", "d-4") == rows[4]  # a bad row is skipped: the task goes on
    assert follower.poll().get("devices", "d-x") is None

    asyncio.run(reset_topics(broker.bootstrap))  # recreated: empty, its end before what was read
    new = {"device_id": "d-9", "site": "new", "max_temp": 80.0}
    produce(broker.bootstrap, DEVICES_TABLE, [(b"d-9", orjson.dumps(new))])
    assert follower.poll().get("devices", "d-9") == new  # not skipped as already read


def test_a_stream_regrouped_from_two_partitions_runs_its_events_in_time_order(
    spark: SparkSession, broker: KafkaBroker, settings: Settings, tmp_path: Path
) -> None:
    """Rules grouped by ``client_ip`` on logs keyed by host: each group's events come from both
    partitions of the topic. A micro-batch runs them merged by arrival (then event time), as the
    live worker meets them on its regroup topic, so the query gives the Faust backtest's alerts
    for the log in time order (233 transitions). It ran one partition's events of the batch,
    then the other's: the second partition's went back in time by the batch's span and were
    late for every window, and the streaks broke where they should not have. That gave 142:
    no ``burst-403`` at all (50), 22 ``per-ip-minute`` (3: flapping) and 120 of the 180 streak
    transitions."""
    rules = tmp_path / "regrouped.yaml"
    rules.write_text("engine: spark\n" + REGROUPED)
    ruleset = load_rules([rules])
    records = regrouped_logs(1200)
    produce(broker.bootstrap, "events.logs", records)
    run_once(spark, settings, ruleset, per_trigger=2000)  # one micro-batch: the whole log
    got = consume_json(broker.bootstrap, "alerts", timeout_s=3)

    report = BacktestReport()
    want = backtest(
        ruleset, read_events([v for _, v in records], "logs", report), io.StringIO(), report,
        engine="spark", partitions=settings.partitions, max_skew_ms=settings.max_event_skew_ms,
    )  # fmt: skip
    assert {a.rule_id for a in want} == {"burst-403", "per-ip-minute", "forbidden-streak"}
    assert len(want) == 233
    assert ids_by_fingerprint(got) == ids_by_fingerprint(a.to_dict() for a in want)
