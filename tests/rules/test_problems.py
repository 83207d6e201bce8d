"""A rule file and a rule test file say their problems in the same words (app/rules/problems.py):
the same slip reads the same in both, each named by where it is (a rule's id and key, a test
case and the path to the value), and past the cap the same line counts the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import RuleConfigError
from app.rules.loader import load_rules
from app.rules.problems import MAX_PROBLEMS
from app.rules.ruletest import run_tests

RULE = "  - id: r\n    source: sensors\n    where: temperature > 1\n"
CASE = (
    '  - name: c\n    input: [{device_id: m1, ts: "2024-01-01T00:00:00Z", temperature: 1}]\n    expect: []\n'
)


def problems_of_rule_file(tmp_path: Path, text: str) -> list[str]:
    f = tmp_path / "r.yaml"
    f.write_text(text)
    with pytest.raises(RuleConfigError) as info:
        load_rules([f])
    return [str(p).removeprefix(f"{f}:") for p in info.value.problems]


def problems_of_test_file(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "r.yaml").write_text("rules:\n" + RULE)
    f = tmp_path / "t.test.yaml"
    f.write_text(text)
    (result,) = run_tests([f]).results
    assert result.error, result
    return [line.removeprefix(f"{f}:") for line in result.detail.splitlines()]


@pytest.mark.parametrize(
    ("rule_file", "rule_problem", "test_file", "test_problem"),
    [
        (
            "rules:\n" + RULE + "    consecutive: abc\n",
            "5:18: r: 'consecutive': expected a whole number, got text 'abc'",
            "rule_files: [r.yaml]\npartitions: abc\ntests:\n" + CASE,
            "2:13: 'partitions': expected a whole number, got text 'abc'",
        ),
        (
            "rules: []\n",
            "1:8: -: 'rules': must not be empty",
            "rule_files: []\ntests:\n" + CASE,
            "1:13: 'rule_files': must not be empty",
        ),
        (
            "rules:\n  - just text\n",
            "2:5: -: expected a mapping, got text 'just text'",
            "rule_files: [r.yaml]\ntests:\n  - just text\n",
            "3:5: case 1: expected a mapping, got text 'just text'",
        ),
        (
            "rules:\n" + RULE.replace("id: r", "id: yes"),
            """2:9: -: 'id': read as the boolean true, not a string; quote it: id: "yes\"""",
            "rule_files: [r.yaml]\ntests:\n" + CASE.replace("name: c", "name: yes"),
            """3:11: case 1: 'name': read as the boolean true, not a string; quote it: name: "yes\"""",
        ),
        (
            "rules:\n" + RULE + "    no_data: {after: 5m, when: x}\n",
            "5:32: r: 'no_data': unknown key 'when'",
            "rule_files: [r.yaml]\ntests:\n" + CASE.replace("expect: []", "expect: [{rule: r, when: x}]"),
            "5:30: case 1 'c': expect 1: unknown key 'when'",
        ),
    ],
    ids=["whole-number", "empty-list", "not-a-mapping", "not-a-string", "nested-unknown-key"],
)
def test_a_slip_reads_the_same_in_a_rule_file_and_a_test_file(
    tmp_path: Path, rule_file: str, rule_problem: str, test_file: str, test_problem: str
) -> None:
    assert problems_of_rule_file(tmp_path, rule_file) == [rule_problem]
    assert problems_of_test_file(tmp_path, test_file) == [test_problem]


def test_past_the_cap_both_files_count_the_rest_in_one_line(tmp_path: Path) -> None:
    n = MAX_PROBLEMS + 50
    more = f"1:1: -: 50 more problem(s) in this file; only the first {MAX_PROBLEMS} are listed"
    got = problems_of_rule_file(tmp_path, "rules:\n" + RULE.replace("where", "wher") * n)
    assert len(got) == MAX_PROBLEMS + 1 and got[-1] == more, got[-1]
    case = CASE.replace(
        "expect: []", "expect: [" + ", ".join(f"{{rule: r, k{i}: x}}" for i in range(n)) + "]"
    )
    got = problems_of_test_file(tmp_path, "rule_files: [r.yaml]\ntests:\n" + case)
    assert len(got) == MAX_PROBLEMS + 1 and got[-1] == more.replace("-: ", ""), got[-1]
