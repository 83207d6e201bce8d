"""Which rules the Spark engine runs, and the refusal of everything else at load time."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import PROJECT_ROOT
from app.errors import RuleConfigError
from app.rules.loader import load_rules
from jobs.compile import plan_rules

GOLDEN = PROJECT_ROOT / "tests/rules/golden/issue-examples.good.yaml"


def both(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(text.replace("rules:\n", "engine: both\nrules:\n", 1))
    return path


def test_unsupported_kinds_and_features_are_named_with_their_rule(tmp_path: Path) -> None:
    path = both(tmp_path, GOLDEN.read_text())
    with pytest.raises(RuleConfigError) as err:
        plan_rules(load_rules([path]))
    found = {(p.rule_id, p.message) for p in err.value.problems}
    assert ("forbidden-burst", "window rules are not supported on the spark engine yet") in found
    assert ("device-silent", "absence rules are not supported on the spark engine yet") in found
    assert ("brute-force-then-success", "sequence rules are not supported on the spark engine yet") in found
    assert ("trade-size-branch", "branch rules are not supported on the spark engine yet") in found
    assert ("too-hot-for-its-site", "'enrich' is not supported on the spark engine") in found
    assert any(
        r == "stock-jump" and "pct_change() is not supported on the spark engine" in m for r, m in found
    )
    assert not {"hot-machine", "low-reading-streak"} & {r for r, _ in found}
    assert all(str(p).startswith(f"{path}:") for p in err.value.problems)


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


def test_keep_firing_for_is_refused_until_spark_implements_it(tmp_path: Path) -> None:
    path = both(
        tmp_path, "rules:\n  - {id: k, source: sensors, where: temperature > 1, keep_firing_for: 5m}\n"
    )
    with pytest.raises(RuleConfigError, match="k: 'keep_firing_for' is not supported on the spark engine"):
        plan_rules(load_rules([path]))
