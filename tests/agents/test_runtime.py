"""The worker's runtime: its per-rule counters (``worker_rule_events_total``,
``worker_rule_matched_total``: the engine's per-batch counts added once a second and before a
reload swaps the engine), and the sweep that ends the alerts of rules no longer running
(:meth:`Runtime.retire`). The runtime alone, on in-memory stores: no broker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import REGISTRY

from agents.runtime import Runtime
from agents.state_store import TableStore
from agents.wiring import release_quiet
from app.placement import partition_for
from app.tables import Tables
from tests.agents.worker_helpers import fake_table
from tests.rules.helpers import HOT, rules, sensor

SPARK_ONLY = """  - id: spark-only
    source: sensors
    engine: spark
    where: temperature > 0
    group_by: [device_id]
    severity: info
"""


def sample(name: str, rule: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"rule": rule})


def test_rule_counts_reach_the_counters_per_rule_and_survive_a_reload(tmp_path: Path) -> None:
    hot = "hot-" + tmp_path.name  # the counters are the process's: a rule id of this test's own
    body = HOT.replace("id: hot", f"id: {hot}")
    names = ("sensors", "sensors.regroup", "logs", "logs.regroup", "finance", "finance.regroup")
    stores = {name: TableStore(fake_table(), 10_000) for name in names}
    settings = SimpleNamespace(partitions=1, max_event_skew_ms=-1)
    rt = Runtime(settings, rules(tmp_path, body + SPARK_ONLY), Tables(), stores)  # type: ignore[arg-type]
    assert sample("worker_rule_events_total", hot) == 0.0  # declared before any event
    assert sample("worker_rule_events_total", "spark-only") is None  # not run by this worker

    rt.engine.process_batch([sensor(m, t) for m, t in enumerate([90, 101, 102])])
    assert rt.count_rules() == {hot: (3, 2)}
    assert (sample("worker_rule_events_total", hot), sample("worker_rule_matched_total", hot)) == (3.0, 2.0)
    assert rt.count_rules() == {}  # nothing counted twice

    rt.engine.process_batch([sensor(5, 120)])
    rt.swap(rules(tmp_path, body.replace("> 100", "> 200")))  # the old engine's count is kept
    rt.engine.process_batch([sensor(6, 150)])
    rt.count_rules()
    assert (sample("worker_rule_events_total", hot), sample("worker_rule_matched_total", hot)) == (5.0, 3.0)


def test_a_rule_that_raises_is_counted_per_rule_and_the_worker_goes_on(tmp_path: Path) -> None:
    """A state the rule cannot read (here a corrupted one) makes its evaluation raise: the
    error is counted in ``worker_rule_errors_total{rule}`` (declared at 0 before), once, and
    the next events still evaluate."""
    hot = "hot-err-" + tmp_path.name
    names = ("sensors", "sensors.regroup", "logs", "logs.regroup", "finance", "finance.regroup")
    stores = {name: TableStore(fake_table(), 10_000) for name in names}
    settings = SimpleNamespace(partitions=1, max_event_skew_ms=-1)
    rt = Runtime(settings, rules(tmp_path, HOT.replace("id: hot", f"id: {hot}")), Tables(), stores)  # type: ignore[arg-type]
    assert sample("worker_rule_errors_total", hot) == 0.0
    rt.engine.process_batch([sensor(0, 101)])
    (state,) = stores["sensors"].live.values()
    state["firing_since"] = "not a time"
    rt.engine.process_batch([sensor(1, 50)])  # resolving reads firing_since: raises
    rt.count_rules()
    assert sample("worker_rule_errors_total", hot) == 1.0
    rt.count_rules()
    assert sample("worker_rule_errors_total", hot) == 1.0  # nothing counted twice
    fired = rt.engine.process_batch([sensor(2, 120, "d2")]).alerts  # another group: as before
    assert [(a.status, a.labels["device_id"]) for a in fired] == [("firing", "d2")]
    rt.count_rules()
    assert sample("worker_rule_events_total", hot) == 3.0
    assert sample("worker_rule_errors_total", hot) == 1.0


def retired_count(outcome: str) -> float:
    return REGISTRY.get_sample_value("worker_retired_states_total", {"outcome": outcome}) or 0.0


def test_a_reload_ends_the_alerts_of_the_rules_it_removes(tmp_path: Path) -> None:
    """Alerts firing when their rule's file goes: the first sweep of the partition after the
    swap (before its first batch with the new rules) resolves them, from the outgoing rules
    (these states predate any rule record), deletes their states, writes the deletions to
    the changelog, counts them, and runs once per rule set."""
    hot = "hot-gone-" + tmp_path.name
    names = ("sensors", "sensors.regroup", "logs", "logs.regroup", "finance", "finance.regroup")
    stores = {name: TableStore(fake_table(), 10_000) for name in names}
    settings = SimpleNamespace(partitions=1, max_event_skew_ms=-1)
    rt = Runtime(
        settings, rules(tmp_path, HOT.replace("id: hot", f"id: {hot}") + SPARK_ONLY), Tables(), stores
    )  # type: ignore[arg-type]
    fired = rt.engine.process_batch([sensor(0, 101), sensor(1, 102, "d2")]).alerts
    assert [a.status for a in fired] == ["firing", "firing"]
    before = retired_count("ended")

    rt.swap(rules(tmp_path, SPARK_ONLY))
    ended = rt.retire("sensors", 0)
    assert [(a.status, a.fingerprint, a.starts_at) for a in ended] == [
        ("resolved", a.fingerprint, a.starts_at) for a in fired
    ]
    assert rt.retire("sensors", 0) == []  # once per partition and rule set
    assert not [k for k in stores["sensors"].live if k.startswith(hot)]
    tombstones = [(k, v) for _, _, k, v in stores["sensors"].changes() if hot.encode() in k]
    assert len(tombstones) == 2 and all(v is None for _, v in tombstones)
    assert retired_count("ended") == before + 2


def test_a_worker_started_after_an_edit_ends_the_old_versions_alerts(tmp_path: Path) -> None:
    """A restart with the rule edited meanwhile: nothing of the old rule is in memory, the
    rule record the last run kept in the store stands in for it. The new version's alert
    then fires on its own, after the old one's resolution."""
    hot = "hot-edit-" + tmp_path.name
    body = HOT.replace("id: hot", f"id: {hot}")
    names = ("sensors", "sensors.regroup", "logs", "logs.regroup", "finance", "finance.regroup")
    stores = {name: TableStore(fake_table(), 10_000) for name in names}
    settings = SimpleNamespace(partitions=1, max_event_skew_ms=-1)
    first = Runtime(settings, rules(tmp_path, body), Tables(), stores)  # type: ignore[arg-type]
    assert first.retire("sensors", 0) == []  # as a batch would: before the rules run
    (fired,) = first.engine.process_batch([sensor(0, 101)]).alerts

    again = Runtime(settings, rules(tmp_path, body.replace("> 100", "> 200")), Tables(), stores)  # type: ignore[arg-type]
    (ended,) = again.retire("sensors", 0)
    assert (ended.status, ended.fingerprint, ended.starts_at, ended.rule_version) == (
        "resolved", fired.fingerprint, fired.starts_at, fired.rule_version,
    )  # fmt: skip
    (new,) = again.engine.process_batch([sensor(5, 250)]).alerts
    assert new.status == "firing" and new.rule_version != fired.rule_version


def test_quiet_partitions_are_swept_into_their_own_transaction(tmp_path: Path) -> None:
    """A partition no event comes to is swept by the worker's timer (``release_quiet``), each
    partition's endings sent as that partition's outputs (under exactly-once, its own
    transaction: before, the timer's outputs went to partition 0's, which another worker may
    own); nothing is swept while the tables are being restored."""
    hot = "hot-quiet-" + tmp_path.name
    names = ("sensors", "sensors.regroup", "logs", "logs.regroup", "finance", "finance.regroup")
    stores = {name: TableStore(fake_table(), 10_000) for name in names}
    settings = SimpleNamespace(partitions=2, max_event_skew_ms=-1)
    rt = Runtime(settings, rules(tmp_path, HOT.replace("id: hot", f"id: {hot}")), Tables(), stores)  # type: ignore[arg-type]
    devices = [f"d{i}" for i in range(6)]
    rt.engine.process_batch([sensor(i, 101, d) for i, d in enumerate(devices)])
    assert {partition_for(d.encode(), 2) for d in devices} == {0, 1}
    rt.swap(rules(tmp_path, SPARK_ONLY))

    class Sent:
        def __init__(self) -> None:
            self.calls: list[tuple[int, list[str]]] = []

        def records(self, out: Any, _source: str) -> list[str]:
            return [a.labels["device_id"] for a in out.alerts]

        async def send_all(self, records: list[str], source_partition: int = 0) -> None:
            if records:
                self.calls.append((source_partition, records))

    outbox = Sent()
    assigned = {("events.sensors", 0), ("events.sensors", 1)}
    asyncio.run(release_quiet(rt, outbox, assigned, 0, retire=False))  # type: ignore[arg-type]
    assert outbox.calls == []
    asyncio.run(release_quiet(rt, outbox, assigned, 0))  # type: ignore[arg-type]
    assert sorted(p for p, _ in outbox.calls) == [0, 1]
    for partition, sent in outbox.calls:
        assert sorted(sent) == sorted(d for d in devices if partition_for(d.encode(), 2) == partition)
