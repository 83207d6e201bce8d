"""The console's rule catalog: every rule with file:line, rejected files, chart specs."""

from __future__ import annotations

from pathlib import Path

from app.console.catalog import chart_spec, files_key, load_catalog
from app.runtime.settings import PROJECT_ROOT


def test_the_project_rules_load_with_their_file_and_line() -> None:
    cat = load_catalog(PROJECT_ROOT / "rules")
    assert not cat.rejected
    r = cat.get("machine-overheat")
    assert r is not None and r.path.endswith("rules/iot.yaml") and r.line == 4
    assert (r.kind, r.engine, r.field, r.threshold, r.op) == ("threshold", "faust", "temperature", 100.0, ">")
    hourly = cat.get("machine-hourly-heat")
    assert hourly is not None and hourly.window_ms == 3_600_000 and hourly.field == "temperature"


def test_a_bad_file_is_rejected_with_its_problems_and_the_good_ones_stay(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(
        "rules:\n  - id: hot\n    source: sensors\n    where: temperature > 5\n    group_by: [device_id]\n"
    )
    bad = "rules:\n  - id: broken\n    source: sensors\n    where: temperature >\n"
    (tmp_path / "bad.yaml").write_text(bad)
    cat = load_catalog(tmp_path)
    assert [r.id for r in cat.rules] == ["hot"]
    ((path, problems),) = cat.rejected
    assert path.endswith("bad.yaml") and "bad.yaml:4" in problems and "broken" in problems


def test_chart_spec() -> None:
    assert chart_spec("temp_c >= 80.5", {}) == ("temp_c", 80.5, ">=")
    assert chart_spec("status == 'x' and temp > 3", {}) == ("status", None, None)
    assert chart_spec(None, {"avg_t": "avg(temperature)"}) == ("temperature", None, None)


def test_the_files_key_follows_every_rule_file_the_catalog_reads(tmp_path: Path) -> None:
    rule = "rules:\n  - id: hot\n    source: sensors\n    where: temperature > 5\n"
    (tmp_path / "r.YAML").write_text(rule)
    assert [r.id for r in load_catalog(tmp_path).rules] == ["hot"]
    before = files_key(tmp_path)
    assert [name for name, _, _ in before] == [str(tmp_path / "r.YAML")]
    (tmp_path / "r.YAML").write_text(rule.replace("> 5", "> 50"))
    assert files_key(tmp_path) != before
