"""Two-engine conformance of the native absence path (``jobs.absence``): the absence rules of
``absences.yaml``, which a Spark backtest runs natively (clocks, newest times, deadlines and
the gaps that can fire in the JVM, the evaluator's ``AbsenceLogic`` on the rows around them),
must give exactly the Faust backtest's output lines (every status), per-fingerprint id
sequences and report counts on

* crafted events on 1 partition (``absence_cases``; ``test_kinds.py`` runs absence natively
  over 2): a silence that resolves, one that
  never does, a first event late by more than the silence (it fires at once), a backlog older
  than the silence's start (it does not resolve it), an old event, an exact duplicate, an
  event exactly at the deadline, a ``where`` that ignores some events, allowed lateness,
  registry keys never seen and one first seen after its wait ran out (``expect_from``), no
  ``group_by``, and a group on a field that is not the topic key;
* the real NAB series for 3 devices with a future-dated event, which moves one partition's
  clock past every silence at once: every group there fires and no later event resolves
  it; with the time bound on (APP_MAX_EVENT_SKEW 5m) that partition stays on the stream path.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.rules.loader import load_rules
from jobs import absence
from tests.conformance.absence_cases import RULES, crafted, t, tables
from tests.conformance.native_compare import Compared, compare_native, nab_devices, write_events
from tests.conformance.native_compare import transitions_of as seen

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a real Spark

SKEW_MS = 5 * 60_000


def compare(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, path: Path, partitions: int, max_skew_ms: int = -1
) -> Compared:
    return compare_native(
        spark, caplog, RULES, path, partitions=partitions, native=absence.native_rules, said="native absence",
        max_skew_ms=max_skew_ms, tables=tables(),
    )  # fmt: skip


def write(path: Path) -> Path:
    return write_events(path, crafted())


def test_crafted_events_on_one_partition(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    found = compare(spark, caplog, write(tmp_path / "crafted.jsonl"), partitions=1)
    assert set(found.fell_back.values()) == {0}
    assert found.same_order  # every rule is native: the evaluator's order at each event too
    alerts = found.alerts
    assert seen(alerts, "abs-30m", "a-1") == [
        ("firing", t(60), None), ("resolved", t(60), t(100)), ("firing", t(135), None),
    ]  # fmt: skip
    assert seen(alerts, "abs-30m", "a-2") == [("firing", t(50), None)]
    # late by more than the silence: fires at its own event, resolves at the next
    assert seen(alerts, "abs-30m", "a-3") == [
        ("firing", t(130), None), ("resolved", t(130), t(205)), ("firing", t(235), None),
    ]  # fmt: skip
    # the backlog (40) does not resolve the silence begun at 60; it moves its newest time
    a4 = [a for a in alerts if a.rule_id == "abs-30m" and a.labels.get("device_id") == "a-4"]
    assert [(a.status, a.starts_at, a.ends_at) for a in a4] == [
        ("firing", t(60), None),
        ("resolved", t(60), t(125)),
    ]
    assert a4[1].values["silent_since"] == a4[0].values["silent_since"] + 10 * 60_000
    assert seen(alerts, "abs-30m", "a-7") == [("firing", t(60), None), ("resolved", t(60), t(75))]
    assert not seen(alerts, "abs-30m", "a-5")  # back exactly at its deadline
    assert seen(alerts, "abs-lateness", "a-2") == [("firing", t(40), None)]  # 20m; fired 10m later
    assert [s for s, _, _ in seen(alerts, "abs-hot-readings", "a-6")] == [
        "firing",
        "resolved",
    ] * 2 + ["firing"]
    for ghost in ("ghost-a", "ghost-c"):  # never seen: their wait began at the first event
        assert seen(alerts, "abs-registry", ghost) == [("firing", t(45), None)]
    assert seen(alerts, "abs-registry", "r-1") == [
        ("firing", t(45), None),
        ("resolved", t(45), t(100)),
    ]
    assert seen(alerts, "abs-fleet-hot")[:2] == [
        ("firing", t(10.5), None),
        ("resolved", t(10.5), t(40.5)),
    ]
    assert seen(alerts, "abs-client", "10.1.1.4") == [
        ("firing", t(10), None), ("resolved", t(10), t(30)), ("firing", t(40), None),
    ]  # fmt: skip


def test_a_clock_jump_fires_the_groups_of_its_partition_again_and_again(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = tmp_path / "nab-future.jsonl"
    nab_devices(path, 3, [{"device_id": "nab-0", "ts": "2099-12-31T00:00:00Z", "temperature": 20.0}], 5_000)
    found = compare(spark, caplog, path, partitions=2)
    assert found.same_order
    count = Counter((a.labels.get("device_id"), a.status) for a in found.alerts if a.rule_id == "abs-30m")
    # partition 0's clock is in 2099 from the jump on: nab-2's silence fires there; its next
    # events are older than the silence's start (no resolution) until 30 minutes of its own
    # series later, and each resolution is again late by more than the silence: it fires at once
    assert count[("nab-2", "firing")] > 300
    assert count[("nab-2", "resolved")] == count[("nab-2", "firing")] - 1
    assert not count[("nab-1", "firing")]  # partition 1: no jump, no silence


def test_partitions_where_the_time_bound_holds_events_run_on_the_stream_path(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    path = tmp_path / "nab-future.jsonl"
    nab_devices(path, 3, [{"device_id": "nab-0", "ts": "2099-12-31T00:00:00Z", "temperature": 20.0}], 5_000)
    found = compare(spark, caplog, path, partitions=2, max_skew_ms=SKEW_MS)
    assert found.report.refused == 2  # once per sensors stream: by device, by nothing
    assert found.fell_back["abs-30m"] == 1  # nab-0's partition only
    assert found.fell_back["abs-client"] == 0  # no log event at all


def test_what_stays_on_the_stream_path_says_why() -> None:
    ruleset = load_rules([RULES])
    rule = ruleset.rules[0]
    assert absence.native_problem(rule) is None
    enriched = rule.rule.model_copy(update={"enrich": ({"table": "devices", "on": "device_id", "as": "d"},)})
    assert (
        absence.native_problem(dataclasses.replace(rule, rule=enriched))
        == "'enrich' is not reproduced natively"
    )
    ordered = rule.rule.model_copy(update={"order": "event_time"})
    assert (
        absence.native_problem(dataclasses.replace(rule, rule=ordered))
        == "'order' is not reproduced natively"
    )
