"""`python -m app rules test` on test files written wrong (app/rules/ruletest.py): a slip is an
error naming the file, line, case and field, exit 2, never a test that checks nothing and
passes, nor a traceback; and one invalid file does not stop the others."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from app.cli.main import main
from app.rules.ruletest import run_tests

RULES = """rules:
  - id: hot
    source: sensors
    where: temperature > 50
    group_by: [device_id]
"""
EVENT = '{device_id: m1, ts: "2024-01-01T00:00:00Z", temperature: 96}'
GOOD = f"""rule_files: [r.yaml]
tests:
  - name: fires
    input:
      - {EVENT}
    expect:
      - {{rule: hot, status: firing}}
"""


@pytest.fixture
def write(tmp_path: Path) -> Callable[..., Path]:
    (tmp_path / "r.yaml").write_text(RULES)

    def _write(text: str, name: str = "t.test.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write


def run(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, str, str]:
    code = main(["rules", "test", *map(str, paths)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_passing_file_prints_as_before(write, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(GOOD)
    assert run(capsys, f) == (0, f"ok   {f}: fires\n", "1 passed, 0 failed\n")


def test_a_failing_case_is_still_a_failure_with_a_diff(write, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(GOOD.replace("status: firing", "status: resolved"))
    code, out, err = run(capsys, f)
    assert code == 1 and out.startswith(f"FAIL {f}: fires\n") and "-rule=hot status=resolved" in out
    assert err == "0 passed, 1 failed\n"


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        (
            f"""    input:\n      - {EVENT}\n    expect:\n"""
            """      - {rule: hot, stauts: resolved, strats_at: "2030-01-01T00:00:00Z"}\n""",
            ":7:29: case 1 'x': expect 1: unknown key 'stauts'",
        ),
        (f"""    inptu:\n      - {EVENT}\n    expect: []\n""", ":5:7: case 1 'x': unknown key 'inptu'"),
        (
            f"""    rules: [hott]\n    input:\n      - {EVENT}\n    expect: []\n""",
            ":4:13: case 1 'x': rules 1: no rule 'hott' in the rule files; did you mean 'hot'?",
        ),
        (
            f"""    rules: hot\n    input:\n      - {EVENT}\n    expect: []\n""",
            ":4:12: case 1 'x': 'rules': expected a list, got text 'hot'",
        ),
        (
            f"""    input:\n      - {EVENT}\n    expect:\n      - {{rule: hott}}\n""",
            ":7:16: case 1 'x': expect 1: 'rule': no rule 'hott' in the rule files; did you mean 'hot'?",
        ),
        ("""    input: []\n    expect: []\n""", ":3:5: case 1 'x': no input events"),
    ],
    ids=["expect-key", "case-key", "unknown-rule-id", "rules-string", "expect-rule", "no-input"],
)
def test_a_test_that_would_check_nothing_is_an_error(
    write, capsys: pytest.CaptureFixture[str], case: str, problem: str
) -> None:
    f = write(f"rule_files: [r.yaml]\ntests:\n  - name: x\n{case}")
    code, out, err = run(capsys, f)
    assert code == 2, out
    assert out.startswith(f"ERR  {f}\n") and f"     {f}{problem}" in out
    assert err == "0 passed, 0 failed, 1 error(s) (invalid test files, not run)\n"


def test_a_file_without_rule_files_or_whose_rule_files_load_no_rule_is_an_error(
    write, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = write(GOOD.replace("rule_files: [r.yaml]\n", ""), "missing.test.yaml")
    (tmp_path / "empty").mkdir()
    empty = write(GOOD.replace("[r.yaml]", "[empty]"), "empty.test.yaml")
    code, out, _ = run(capsys, missing, empty)
    assert code == 2
    assert f"{missing}:1:1: missing required key 'rule_files'" in out
    assert f"{empty}:1:13: 'rule_files': the rule files hold no rule" in out


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("tests: hello\n", ":2:8: 'tests': expected a list, got text 'hello'"),
        ("tests:\n  - just a string\n", ":3:5: case 1: expected a mapping, got text 'just a string'"),
        (
            "tests:\n  - name: x\n    input: [42]\n    expect: []\n",
            ":4:13: case 1 'x': input 1: expected a mapping, got a number 42",
        ),
        (
            f"tests:\n  - name: x\n    input: [{EVENT}]\n    expect: [firing]\n",
            ":5:14: case 1 'x': expect 1: expected a mapping, got text 'firing'",
        ),
        (
            f"tests:\n  - name: x\n    input: [{EVENT}]\n    expect: {{rule: hot}}\n",
            ":5:13: case 1 'x': 'expect': expected a list, got a mapping",
        ),
        (
            f"tests:\n  - name: x\n    input: [{EVENT}]\n    expect: [{{rule: hot, labels: m1}}]\n",
            ":5:34: case 1 'x': expect 1: 'labels': expected a mapping, got text 'm1'",
        ),
        (
            f"tables: [devices]\ntests:\n  - name: x\n    input: [{EVENT}]\n    expect: []\n",
            ":2:9: 'tables': expected a mapping, got a list",
        ),
        (
            f"tests:\n  - name: x\n    partitions: 0\n    input: [{EVENT}]\n    expect: []\n",
            ":4:17: case 1 'x': 'partitions': Input should be greater than or equal to 1 (got 0)",
        ),
        (
            f"tests:\n  - name: x\n    partitions: abc\n    input: [{EVENT}]\n    expect: []\n",
            ":4:17: case 1 'x': 'partitions': expected a whole number, got text 'abc'",
        ),
        (
            "tests:\n  - name: x\n    statuses: [firing, fired]\n    input: []\n    expect: []\n",
            ":4:24: case 1 'x': statuses 2: Input should be 'pending', 'firing', 'resolved', 'inactive' "
            "or 'no_data' (got 'fired')",
        ),
    ],
    ids=[
        "tests-string",
        "case-string",
        "input-number",
        "expect-string",
        "expect-mapping",
        "labels-string",
        "tables-list",
        "partitions-zero",
        "partitions-text",
        "statuses",
    ],
)
def test_a_malformed_file_is_an_error_naming_file_line_case_and_field(
    write, capsys: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    f = write(f"rule_files: [r.yaml]\n{text}")
    code, out, _ = run(capsys, f)
    assert code == 2, out
    assert f"     {f}{problem}" in out.splitlines()[1:], out


def test_a_bad_time_names_its_file_case_and_field_not_ts(write, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(GOOD.replace("status: firing", 'status: firing, starts_at: "garbage"'))
    (result,) = run_tests([f]).results
    assert result.error and result.name == "-"
    assert result.detail == (
        f"{f}:7:48: case 1 'fires': expect 1: 'starts_at': expected an RFC 3339 time with an offset, "
        "such as 2024-01-01T00:00:00Z, got 'garbage'"
    )


def test_a_bad_row_or_input_line_names_its_file_case_and_field(write, tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text(
        '{"device_id":"m1","ts":"2024-01-01T00:00:00Z","temperature":96}\n'
        '{"device_id":"m1","ts":"2024-01-01T00:01:00Z","temperature":96\n'
        '{"device_id":"m1","ts":"2024-01-01 00:02","temperature":96}\n'
    )
    f = write(
        "rule_files: [r.yaml]\n"
        "tables:\n"
        "  devices: [{device_id: d1, max_temp: hot}]\n"
        "tests:\n"
        "  - name: late\n"
        "    input_file: in.jsonl\n"
        "    expect: []\n"
    )
    (result,) = run_tests([f]).results
    assert result.error and result.name == "-"
    assert result.detail.splitlines() == [
        f"{f}:3:39: 'tables': devices 1: column 'max_temp' must be a number, got str \"hot\"",
        f"{f}:6:17: case 1 'late': 'input_file': {tmp_path / 'in.jsonl'}:2: not valid JSON: "
        "unexpected end of data",
        f"{f}:6:17: case 1 'late': 'input_file': {tmp_path / 'in.jsonl'}:3: field 'ts' has no UTC offset "
        "(use 'Z' or '+00:00'): '2024-01-01 00:02'",
    ]


def test_an_invalid_file_does_not_stop_the_others(write, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(
        GOOD.replace("status: firing", 'status: firing, starts_at: "2024-01-01 00:00"'), "a.test.yaml"
    )
    good = write(GOOD, "b.test.yaml")
    code, out, err = run(capsys, bad.parent)
    assert code == 2
    assert out.splitlines()[0] == f"ERR  {bad}"
    assert f"{bad}:7:48: case 1 'fires': expect 1: 'starts_at': expected an RFC 3339 time" in out
    assert out.splitlines()[-1] == f"ok   {good}: fires"
    assert err == "1 passed, 0 failed, 1 error(s) (invalid test files, not run)\n"


def test_ends_at_null_expects_a_transition_that_has_not_ended(write) -> None:
    f = write(GOOD.replace("status: firing", "status: firing, ends_at: null"))
    g = write(
        GOOD.replace("status: firing", 'status: firing, ends_at: "2024-01-01T00:00:00Z"'), "g.test.yaml"
    )
    assert [(r.ok, r.error) for r in run_tests([f, g]).results] == [(True, False), (False, False)]


def test_a_rule_on_the_spark_engine_alone_is_tested_too(
    write, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both engines run the one evaluator: a test of a rule marked ``engine: spark`` runs it
    (it ran nothing, so ``expect: []`` passed and a firing was "missing")."""
    (tmp_path / "r.yaml").write_text("engine: spark\n" + RULES)
    f = write(GOOD)
    assert run(capsys, f) == (0, f"ok   {f}: fires\n", "1 passed, 0 failed\n")
    f = write(GOOD.replace("    expect:\n      - {rule: hot, status: firing}\n", "    expect: []\n"))
    code, out, _ = run(capsys, f)
    assert code == 1 and "+rule=hot status=firing" in out, out


def test_a_test_file_ending_in_test_yml_in_any_case_runs(write, tmp_path: Path) -> None:
    """Neither a rule file (the loader skips rule tests) nor run: such a file was lost."""
    names = [write(GOOD, name).name for name in ("a.test.yml", "b.Test.YAML", "c.TEST.YML")]
    results = run_tests([tmp_path]).results
    assert [(Path(r.file).name, r.name, r.ok) for r in results] == [(n, "fires", True) for n in names]
