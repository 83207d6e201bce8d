"""Two-engine conformance of the native new-term path (``jobs.event_alerts``): the rules of
``new_terms.yaml``, which a Spark backtest runs natively (each group's first event and each
term's last sighting in the JVM, the evaluator's one-shot lifecycle on the new terms only),
must give exactly the Faust backtest's output lines (every status, in the same order),
per-fingerprint id sequences and report counts on crafted log lines over 1 partition
(``new_term_cases``; ``test_kinds.py`` runs a new-term rule natively over 2): the learning
period, a term seen within the horizon and one not seen for longer, new terms extending a
firing alert, a new term late by more than ``resolve_after`` (it resolves at once), an alert
still firing at the end, a line without the term, a ``where``, an integer term grouped by a
field that is not the topic key, no ``group_by``, and a group with 1,100 terms that the
evaluator prunes, where an out-of-order line finds its term forgotten.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from app.rules.loader import load_rules
from jobs import event_alerts
from tests.conformance.native_compare import Compared, compare_native, write_events
from tests.conformance.native_compare import transitions_of as seen
from tests.conformance.new_term_cases import RULES, crafted, t

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # a real Spark


def compare(spark: SparkSession, caplog: pytest.LogCaptureFixture, path: Path, partitions: int) -> Compared:
    return compare_native(
        spark, caplog, RULES, path, partitions=partitions, native=event_alerts.native_rules,
        said="native event alerts",
    )  # fmt: skip


def write(path: Path) -> Path:
    return write_events(path, crafted())


def test_crafted_lines_on_one_partition(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    found = compare(spark, caplog, write(tmp_path / "crafted.jsonl"), partitions=1)
    assert set(found.fell_back.values()) == {0}
    assert found.same_order  # every rule is native: the evaluator's order at each event too
    alerts = found.alerts
    assert seen(alerts, "nt-agent", "www-1") == [
        ("firing", t(70), None), ("resolved", t(70), t(77)),  # D at 72 extended it
        ("firing", t(65), None), ("resolved", t(65), t(70)),  # late by more than resolve_after
        ("firing", t(200), None), ("resolved", t(200), t(205)),
        ("firing", t(298), None),  # the input ends first
    ]  # fmt: skip
    assert seen(alerts, "nt-error-method") == [
        ("firing", t(100.5), None), ("resolved", t(100.5), t(110.5)),
        ("firing", t(140.5), None), ("resolved", t(140.5), t(150.5)),
    ]  # fmt: skip
    assert [s for s, _, _ in seen(alerts, "nt-client-status", "10.0.0.9")] == [
        "firing",
        "resolved",
    ] * 2
    assert seen(alerts, "nt-path") == [
        ("firing", t(90.5), None), ("resolved", t(90.5), t(93.5)),
        ("firing", t(94.5), None), ("resolved", t(94.5), t(96.5)),
    ]  # fmt: skip
    # 1,000 new request ids after the learning ten minutes, and the out-of-order r-120, whose
    # term the evaluator had pruned at 1,000 terms: one episode, 1,001 triggers
    (resolved,) = [a for a in alerts if a.rule_id == "nt-request" and a.status == "resolved"]
    assert resolved.values["count"] == 1001


def test_what_stays_on_the_stream_path_says_why() -> None:
    rule = load_rules([RULES]).rules[0]
    assert event_alerts.native_problem(rule) is None
    lateness = rule.rule.model_copy(update={"allowed_lateness": 60_000})
    assert event_alerts.native_problem(dataclasses.replace(rule, rule=lateness)) == (
        "'allowed_lateness' is not reproduced natively"
    )
    assert rule.rule.new_term is not None
    on_double = rule.rule.model_copy(
        update={"new_term": rule.rule.new_term.model_copy(update={"field": "duration_ms"})}
    )
    assert event_alerts.native_problem(dataclasses.replace(rule, rule=on_double)) == (
        "a term field of type double (Spark's text of it differs)"
    )
