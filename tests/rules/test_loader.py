"""Rule loading: golden good and bad files, every problem reported with file:line:col."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import RuleConfigError
from app.rules.loader import check_rule_files, load_rules, rule_files
from app.runtime.settings import PROJECT_ROOT

GOLDEN = Path(__file__).parent / "golden"


def problems_of(path: Path) -> list[str]:
    with pytest.raises(RuleConfigError) as info:
        load_rules([path])
    return [str(p) for p in info.value.problems]


def test_good_file_loads_with_engines_and_versions() -> None:
    rs = load_rules([GOLDEN / "threshold.good.yaml"])
    assert [r.id for r in rs.rules] == ["hot", "forbidden", "big-trade"]
    hot = rs.get("hot")
    assert hot is not None and hot.rule.for_ms == 15 * 60_000 and hot.line == 3
    assert [r.id for r in rs.for_source("finance", "spark")] == ["big-trade"]
    assert rs.for_source("sensors", "spark") == []
    assert len({r.version for r in rs.rules}) == 3


def test_version_changes_when_the_rule_changes(tmp_path: Path) -> None:
    text = (GOLDEN / "threshold.good.yaml").read_text()
    a = tmp_path / "a.yaml"
    a.write_text(text)
    v1 = load_rules([a]).get("hot")
    a.write_text(text.replace("temperature > 100", "temperature > 101"))
    v2 = load_rules([a]).get("hot")
    assert v1 is not None and v2 is not None and v1.version != v2.version


def test_every_problem_is_reported_with_position() -> None:
    path = GOLDEN / "many-problems.bad.yaml"
    got = problems_of(path)
    p = str(path)
    assert any(s.startswith(f"{p}:2:") and "Bad Id" in s for s in got), got
    # the pydantic phase reports every structural problem at once
    assert any(s.startswith(f"{p}:8:") and "typo" in s and "duration" in s for s in got), got
    assert any(s.startswith(f"{p}:12:") and "unknown key 'windw'" in s for s in got), got
    assert any(s.startswith(f"{p}:14:") and "metrics" in s for s in got), got
    # a structural problem in one rule does not hide semantic problems in another
    assert any(s.startswith(f"{p}:19:") and "bad-group" in s and "'site'" in s for s in got), got
    assert any(s.startswith(f"{p}:21:") and "nope" in s for s in got), got


def test_a_rule_with_an_invalid_key_still_has_its_conditions_checked(tmp_path: Path) -> None:
    """A rule whose `severity` (say) is invalid is not compiled; its conditions' errors came
    out only once that was fixed. Now in the same round: syntax, and the fields of its source."""
    f = tmp_path / "two.yaml"
    f.write_text(
        "rules:\n  - id: two\n    source: sensors\n    where: temperature >\n    clear: temprature < 1\n"
        "    severity: warnin\n"
    )
    got = problems_of(f)
    assert any(s.startswith(f"{f}:6:") and "'severity'" in s for s in got), got
    assert f"{f}:4:12: two: cannot parse 'temperature >': '>' needs a value after it (character 13)" in got
    assert any(s.startswith(f"{f}:5:") and "unknown field 'temprature'" in s for s in got), got
    assert len(got) == 3, got


def test_an_invalid_rule_s_conditions_are_checked_against_what_is_known(tmp_path: Path) -> None:
    """Fields are checked only where they are known: not with a bad `source`, nor with an
    `enrich` (its tables' fields), nor in `having` (the aggregates' names); a baseline or
    pct_change() call is taken; syntax is checked in every case."""
    f = tmp_path / "three.yaml"
    f.write_text(
        "rules:\n"
        "  - {id: a, source: sensorz, where: temprature > 1, severity: warnin}\n"
        "  - {id: b, source: sensors, where: site_max > 1, severity: warnin,\n"
        "     enrich: [{table: devices, on: device_id, as: d}]}\n"
        "  - {id: c, source: sensors, where: 'zscore(temperature, 1d) > 3', severity: warnin}\n"
        "  - {id: d, source: sensors, having: 'n >', severity: warnin}\n"
        "  - {id: e, source: sensors, where: \"temperature > 'hot'\", severity: warnin}\n"
    )
    got = problems_of(f)
    assert not any("temprature" in s or "site_max" in s or "zscore" in s for s in got), got
    assert any(s.startswith(f"{f}:6:") and "'>' needs a value" in s for s in got), got
    assert any(s.startswith(f"{f}:7:") and " e: " in s for s in got), got  # a number against a string
    assert sum("'severity'" in s for s in got) == 5, got


def test_semantic_problems_are_all_reported(tmp_path: Path) -> None:
    f = tmp_path / "sem.yaml"
    f.write_text(
        "rules:\n"
        "  - id: typo\n    source: sensors\n    where: temprature > 100\n"
        "  - id: bad-group\n    source: sensors\n    where: temperature > 1\n"
        "    group_by: [site]\n    annotations:\n      summary: '{{ nope }}'\n"
    )
    got = problems_of(f)
    assert (
        f"{f}:4:12: typo: in 'temprature > 100': unknown field 'temprature'; did you mean 'temperature'?"
        in got
    )
    assert any(s.startswith(f"{f}:8:") and "bad-group" in s and "'site'" in s for s in got), got
    assert any(s.startswith(f"{f}:10:") and "nope" in s for s in got), got


def test_yaml_syntax_and_duplicate_keys() -> None:
    assert any("invalid YAML" in s for s in problems_of(GOLDEN / "yaml-syntax.bad.yaml"))
    dup = problems_of(GOLDEN / "duplicate-key.bad.yaml")
    assert any(":5:5:" in s and "duplicate key 'where'" in s for s in dup), dup


def test_duplicate_rule_ids_across_files(tmp_path: Path) -> None:
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text(
            "rules:\n  - id: same\n    source: sensors\n    where: temperature > 1\n"
        )
    got = problems_of(tmp_path)
    assert any("b.yaml:2:" in s and "duplicate rule id" in s and "a.yaml:2" in s for s in got), got


def rule_text(rule_id: str) -> str:
    return f"rules:\n  - id: {rule_id}\n    source: sensors\n    where: temperature > 1\n"


def test_rule_files_are_found_whatever_the_case_of_their_extension(tmp_path: Path) -> None:
    for name in ("a.YAML", "b.Yml", "c.yml", "d.yaml.bak", "e.Test.YAML", "tests/f.yaml"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(rule_text(name.split(".")[0].split("/")[-1]))
    assert [f.name for f in rule_files([tmp_path])] == ["a.YAML", "b.Yml", "c.yml"]
    assert [r.id for r in load_rules([tmp_path]).rules] == ["a", "b", "c"]


def test_a_reload_takes_a_rule_file_with_an_upper_case_extension(tmp_path: Path) -> None:
    """The engines' hot reload (agents/, jobs/) reads the files through check_rule_files."""
    (tmp_path / "a.yaml").write_text(rule_text("a"))
    running = load_rules([tmp_path])
    (tmp_path / "b.YML").write_text(rule_text("b"))
    check = check_rule_files([tmp_path], running, None)
    assert check.error is None and check.ruleset is not None
    assert [r.id for r in check.ruleset.rules] == ["a", "b"]


def test_shipped_rule_packs_are_valid() -> None:
    rs = load_rules([PROJECT_ROOT / "rules"])
    assert rs.rules


@pytest.mark.slow
def test_rules_check_cli_exit_codes() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "app", "rules", "check", str(GOLDEN / "threshold.good.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PROJECT_ROOT,
    )
    assert ok.returncode == 0, ok.stderr
    assert "hot: ok" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "app", "rules", "check", str(GOLDEN / "many-problems.bad.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PROJECT_ROOT,
    )
    assert bad.returncode == 1
    lines = [line for line in bad.stdout.splitlines() if line]
    assert len(lines) >= 4
    assert all(line.startswith(str(GOLDEN / "many-problems.bad.yaml") + ":") for line in lines)


def test_a_pickled_rule_is_compiled_again_as_the_same_rule() -> None:
    """Spark ships rules to its Python workers by pickle. A rule travels as its validated
    model and is compiled again there (compiled closures cannot be pickled), into a rule
    with the same identity, version and behaviour."""
    rules = load_rules([PROJECT_ROOT / "rules"]).rules
    back = pickle.loads(pickle.dumps(rules))  # noqa: S301 - our own bytes
    assert [(r.id, r.version, r.engine, r.path, r.line) for r in back] == [
        (r.id, r.version, r.engine, r.path, r.line) for r in rules
    ]
    row = {"device_id": "d1", "temperature": 31.0, "humidity": 80.0, "battery": 5.0, "lat": 1.0, "lon": 2.0}
    with_where = [
        (a, b) for a, b in zip(rules, back, strict=True) if a.where is not None and a.rule.source == "sensors"
    ]
    assert with_where
    for a, b in with_where:
        assert b.where is not None and a.where is not None
        assert b.where.text == a.where.text
        assert b.where(row) == a.where(row), a.id
    assert all(b.parts is not None for b in back)
