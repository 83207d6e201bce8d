"""Which rules the Spark engine runs, and the refusal of everything else at load time."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import RuleConfigError
from app.rules.loader import load_rules
from app.runtime.settings import PROJECT_ROOT
from jobs.compile import KEYED, STREAM, plan_rules

GOLDEN = PROJECT_ROOT / "tests/rules/golden/issue-examples.good.yaml"


def both(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(text.replace("rules:\n", "engine: both\nrules:\n", 1))
    return path


def test_every_kind_is_planned_on_the_keyed_or_the_stream_path(tmp_path: Path) -> None:
    path = both(tmp_path, GOLDEN.read_text())
    plan = plan_rules(load_rules([path]))
    # the two plain threshold rules ride the sensors topic-key stream, which runs anyway
    assert plan.rules == ()
    streamed = [r.id for r in plan.stream_rules]
    assert streamed[:2] == ["hot-machine", "low-reading-streak"]  # file order: the evaluator's
    assert set(streamed[2:]) == {
        "forbidden-burst", "hourly-heat", "device-silent", "stock-jump", "brute-force-then-success",
        "too-hot-for-its-site", "vehicle-left-depot", "trade-size-branch",
    }  # fmt: skip
    specs = {s.name: s for s in plan.streams}
    assert set(specs) == {"sensors", "logs.by.client_ip", "finance"}
    # native where where Spark SQL can say it; pct_change() and enrichment stay with the evaluator
    assert specs["logs.by.client_ip"].native == (("forbidden-burst", "(`__logs`.`status` = 403L)"),)
    assert not {rid for s in specs.values() for rid, _ in s.native} & {"stock-jump", "too-hot-for-its-site"}
    # from_json parses only what Spark SQL reads: conditions and the keyed rules' group fields
    assert plan.needed("logs") == {"status"}
    assert plan.needed("sensors") == {"temperature"}  # not lat, lon, battery, ...
    assert plan.needed("finance") == frozenset()  # pct_change() and branch arms run in Python


def test_absence_of_registry_keys_takes_the_stream_path(tmp_path: Path) -> None:
    """``expect_from`` runs: the stream path's evaluator reads the registry
    (``tests/conformance/test_kinds.py`` compares its alerts with the Faust engine's)."""
    path = both(
        tmp_path,
        "rules:\n  - {id: gone, source: sensors, group_by: [device_id], absent_for: 5m,"
        " expect_from: devices}\n",
    )
    plan = plan_rules(load_rules([path]))
    assert (plan.rules, [r.id for r in plan.stream_rules]) == ((), ["gone"])


def test_a_feature_spark_cannot_run_is_refused_naming_rule_and_feature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is refused today; the one place that would refuse a feature still stops the
    load with every rule and reason, never a rule silently left out."""
    path = both(tmp_path, "rules:\n  - {id: ok, source: sensors, where: temperature > 1}\n"
                "  - {id: odd, source: sensors, where: temperature > 2}\n")  # fmt: skip
    said = "'x' is not supported on the spark engine"
    monkeypatch.setattr("jobs.compile.spark_problems", lambda rule: [said] * (rule.id == "odd"))
    with pytest.raises(RuleConfigError) as err:
        plan_rules(load_rules([path]))
    assert [str(p) for p in err.value.problems] == [f"{path}:4:1: odd: {said}"]


def test_threshold_rules_are_planned_in_file_order_and_faust_only_rules_are_left_out(tmp_path: Path) -> None:
    path = PROJECT_ROOT / "tests/spark/rules.yaml"
    faust_only = tmp_path / "faust.yaml"
    faust_only.write_text(
        "rules:\n  - {id: f1, source: logs, where: status >= 500, engine: faust}\n"
        "  - {id: s1, source: logs, where: \"path like '%.php'\", engine: spark, group_by: [host]}\n"
    )
    plan = plan_rules(load_rules([path, faust_only]))
    assert [(r.idx, r.rule.id) for r in plan.rules] == [
        (0, "machine-overheat"),
        (1, "machine-cold"),
        (2, "s1"),
    ]
    assert plan.topics == ["events.logs", "events.sensors"]
    overheat = next(r for r in plan.rules if r.rule.id == "machine-overheat")
    assert overheat.holds_sql == "(`__sensors`.`temperature` > 100L)"


def test_keep_firing_for_takes_the_stream_path(tmp_path: Path) -> None:
    path = both(
        tmp_path, "rules:\n  - {id: k, source: sensors, where: temperature > 1, keep_firing_for: 5m}\n"
    )
    plan = plan_rules(load_rules([path]))
    assert (plan.rules, [r.id for r in plan.stream_rules]) == ((), ["k"])
    assert plan.streams[0].name == "sensors.by.all"
    assert plan.streams[0].native == (("k", "(`__sensors`.`temperature` > 1L)"),)


def test_no_data_takes_the_stream_path(tmp_path: Path) -> None:
    path = both(
        tmp_path,
        "rules:\n  - {id: nd, source: sensors, where: temperature > 1, group_by: [device_id],"
        " no_data: {after: 5m, state: alerting}}\n",
    )
    plan = plan_rules(load_rules([path]))
    assert (plan.rules, [r.id for r in plan.stream_rules]) == ((), ["nd"])
    assert plan.stream_rules[0].rule.no_data is not None  # the evaluator gets the option itself


def test_a_threshold_rule_stays_keyed_unless_its_topic_key_stream_runs_anyway(tmp_path: Path) -> None:
    hot = "  - {id: hot, source: sensors, where: temperature > 99, for: 5m, group_by: [device_id]}\n"
    by_kind = "  - {id: by-kind, source: sensors, where: temperature > 99, group_by: [kind]}\n"
    window = (
        "  - {id: w, source: sensors, group_by: [device_id], window: {type: tumbling, size: 1m},"
        " aggregate: {n: 'count(*)'}, having: n > 1}\n"
    )
    alone = plan_rules(load_rules([both(tmp_path, "rules:\n" + hot + by_kind)]))
    assert ([r.rule.id for r in alone.rules], alone.stream_rules) == (["hot", "by-kind"], ())
    mixed = plan_rules(load_rules([both(tmp_path, "rules:\n" + hot + by_kind + window)]))
    assert [r.rule.id for r in mixed.rules] == ["by-kind"]  # another grouping: its own stream
    assert [(s.name, s.rule_ids) for s in mixed.streams] == [("sensors", ("hot", "w"))]
    assert mixed.streams[0].native == (("hot", "(`__sensors`.`temperature` > 99L)"),)


def test_a_rule_keeps_the_path_its_state_lives_on_while_its_version_stays(tmp_path: Path) -> None:
    """A streaming query's checkpoint records where each rule ran (``SparkPlan.placement``); the
    next plan keeps an unchanged rule there, although the other rules would now place it
    elsewhere: its state lives on that path only. A new version goes where its set puts it."""
    hot = "  - {id: hot, source: sensors, where: temperature > 99, for: 5m, group_by: [device_id]}\n"
    window = (
        "  - {id: w, source: sensors, group_by: [device_id], window: {type: tumbling, size: 1m},"
        " aggregate: {n: 'count(*)'}, having: n > 1}\n"
    )
    alone = plan_rules(load_rules([both(tmp_path, "rules:\n" + hot)]))
    placed = alone.placement()
    assert list(placed.values()) == [KEYED] and next(iter(placed)).startswith("hot@")
    # a window rule of the same source: hot would ride its stream, but stays keyed
    added = plan_rules(load_rules([both(tmp_path, "rules:\n" + hot + window)]), placed=placed)
    assert ([r.rule.id for r in added.rules], [r.id for r in added.stream_rules]) == (["hot"], ["w"])
    # hot rode the stream: with the window rule gone it stays there, on a stream of its own
    riding = plan_rules(load_rules([both(tmp_path, "rules:\n" + hot + window)]))
    assert riding.placement()[next(iter(placed))] == STREAM
    removed = plan_rules(load_rules([both(tmp_path, "rules:\n" + hot)]), placed=riding.placement())
    assert (removed.rules, [(s.name, s.rule_ids) for s in removed.streams]) == ((), [("sensors", ("hot",))])
    # a new version of hot starts fresh anyway: where its set puts it
    edited = hot.replace("> 99", "> 98")
    moved = plan_rules(load_rules([both(tmp_path, "rules:\n" + edited + window)]), placed=placed)
    assert (moved.rules, [r.id for r in moved.stream_rules]) == ((), ["hot", "w"])
    # without the event-time bound's keyed path, a rule placed keyed goes to the stream path
    unbound = plan_rules(load_rules([both(tmp_path, "rules:\n" + hot)]), keyed_path=False, placed=placed)
    assert (unbound.rules, [r.id for r in unbound.stream_rules]) == ((), ["hot"])
