"""The worker's per-rule counters (``worker_rule_events_total``, ``worker_rule_matched_total``):
the engine's per-batch counts added once a second and before a reload swaps the engine. The
runtime alone, on in-memory stores: no broker."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from prometheus_client import REGISTRY

from agents.runtime import Runtime
from agents.state_store import TableStore
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
