"""Two-engine conformance of the native change path (``jobs.event_alerts``): the change rules of
``changes.yaml``, which a Spark backtest runs natively (late events and the previous on-time
value in the JVM, the evaluator's one-shot lifecycle on the changes only), must give exactly
the Faust backtest's output lines (every status, in the same order), per-fingerprint id
sequences and report counts on crafted events over 1 partition (``change_cases``; ``test_kinds.py``
runs a change rule natively over 2): a
change that fires and one that extends the alert, a late event that differs (skipped), an
event without the field, the same value again, an exact duplicate, a change late by more
than ``resolve_after`` (it resolves at once), an alert still firing at the end, a ``where``,
an integer field grouped by a field that is not the topic key, and no ``group_by``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.rules.loader import load_rules
from jobs import event_alerts
from tests.conformance.change_cases import RULES, crafted, t
from tests.conformance.native_compare import Compared, compare_native, write_events
from tests.conformance.native_compare import transitions_of as seen

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a real Spark


def compare(spark: SparkSession, caplog: pytest.LogCaptureFixture, path: Path, partitions: int) -> Compared:
    return compare_native(
        spark, caplog, RULES, path, partitions=partitions, native=event_alerts.native_rules,
        said="native event alerts",
    )  # fmt: skip


def test_crafted_events_on_one_partition(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    found = compare(spark, caplog, write_events(tmp_path / "crafted.jsonl", crafted()), partitions=1)
    assert set(found.fell_back.values()) == {0}
    assert found.same_order  # every rule is native: the evaluator's order at each event too
    alerts = found.alerts
    assert seen(alerts, "ch-status", "s-1") == [
        ("firing", t(10), None), ("resolved", t(10), t(19)),  # the change back at 14 extended it
        ("firing", t(30), None), ("resolved", t(30), t(35)),  # not the late 11 nor the same 20
        ("firing", t(60), None), ("resolved", t(60), t(65)),
        ("firing", t(120.5), None),  # the input ends first
    ]  # fmt: skip
    # s-2's late 3 is skipped; 6 is on time, a change behind the clock: it resolves at once
    assert seen(alerts, "ch-status", "s-2")[2:] == [("firing", t(6), None), ("resolved", t(6), t(11))]
    assert seen(alerts, "ch-status", "s-5") == [("firing", t(50), None), ("resolved", t(50), t(55))]
    assert seen(alerts, "ch-hot-status", "h-1") == [("firing", t(20.5), None), ("resolved", t(20.5), t(30.5))]
    assert seen(alerts, "ch-http", "10.0.0.4") == [("firing", t(6.5), None), ("resolved", t(6.5), t(13.5))]
    (kind,) = [a for a in alerts if a.rule_id == "ch-kind" and a.status == "firing"]
    assert (kind.values["previous"], kind.values["kind"]) == ("pacer", "gadget")
    # late, counted once per rule: s-1's 11 and 12.5 (no status) and s-2's 3 for ch-status; for
    # ch-kind (one group) the readings older than a pacer's, with or without a kind
    assert found.report.late_events == 3 + 5


def test_what_stays_on_the_stream_path_says_why() -> None:
    rule = load_rules([RULES]).rules[0]
    assert event_alerts.native_problem(rule) is None
    side = rule.rule.model_copy(update={"late_policy": "side"})
    assert event_alerts.native_problem(dataclasses.replace(rule, rule=side)) == (
        "'late_policy' is not reproduced natively"
    )
    on_double = rule.rule.model_copy(update={"change": "temperature"})
    assert event_alerts.native_problem(dataclasses.replace(rule, rule=on_double)) == (
        "a changing field of type double (Spark's text of it differs)"
    )
