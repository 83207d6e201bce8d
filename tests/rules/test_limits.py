"""Rule files cannot crash, stall or exhaust the loader (issue 23): each limit is a
``file:line:col`` problem naming it, never a traceback, and LIKE never backtracks."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.errors import ExpressionError, RuleConfigError
from app.events import LOGS, MAX_STRING_LEN
from app.rules import loader as loader_module
from app.rules import template, yamlpos
from app.rules.expr import MAX_DEPTH, compile_expr, rewrite_durations
from app.rules.functions import MAX_LIKE_RUN, like_runs
from app.rules.loader import MAX_FILE_BYTES, load_rules
from app.rules.problems import MAX_PROBLEMS
from tests.rules.like_oracle import old_like_regex

SCHEMA = LOGS.all_fields()


def problems_in(tmp_path: Path, text: str, name: str = "r.yaml") -> list[str]:
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(RuleConfigError) as info:
        load_rules([f])
    return [str(p) for p in info.value.problems]


def rule(where: str) -> str:
    return f"rules:\n  - id: r\n    source: logs\n    where: '{where}'\n"


def test_two_thousand_parentheses_are_a_problem_at_the_expression(tmp_path: Path) -> None:
    deep = "(" * 2000 + "status = 1" + ")" * 2000  # 4,010 characters, under the 4,096 cap
    got = problems_in(tmp_path, rule(deep))
    assert len(got) == 1 and got[0].startswith(f"{tmp_path / 'r.yaml'}:4:12: r: "), got
    assert f"nests more than {MAX_DEPTH} levels deep" in got[0], got


def _at_stack_depth(frames: int, call: Callable[[], Any]) -> Any:
    return call() if frames == 0 else _at_stack_depth(frames - 1, call)


@pytest.mark.parametrize(
    "make",
    [
        lambda n: "(" * n + "status = 1" + ")" * n,
        lambda n: "abs(" * n + "status" + ")" * n + " = 1",
        lambda n: "NOT " * n + "status = 1",
        lambda n: "- " * n + "status = 1",
        lambda n: "round(" * n + "duration_ms" + ", 1)" * n + " = 1",
    ],
    ids=["parentheses", "calls", "not", "unary minus", "calls with two arguments"],
)
def test_nesting_compiles_up_to_the_limit_even_deep_in_a_stack(make: Callable[[int], str]) -> None:
    # a hot reload parses under the worker's own frames: the limit leaves sqlglot room
    compiled = _at_stack_depth(300, lambda: compile_expr(make(MAX_DEPTH), SCHEMA, boolean=True))
    assert compiled.type == "boolean"
    with pytest.raises(ExpressionError, match=f"more than {MAX_DEPTH} levels"):
        compile_expr(make(MAX_DEPTH + 1), SCHEMA, boolean=True)


def test_a_ten_thousand_deep_yaml_list_is_a_problem(tmp_path: Path) -> None:
    got = problems_in(tmp_path, "rules: " + "[" * 10_000 + "]" * 10_000 + "\n")
    # the 65th "[" opens the level past the limit: line 1, column 7 + 64
    assert got == [
        f"{tmp_path / 'r.yaml'}:1:71: -: mappings and lists nest deeper than 64 levels (the limit)"
    ]


def alias_bomb(levels: int) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join([*lines, f"rules: *a{levels}"]) + "\n"


def test_an_alias_bomb_is_refused_at_its_first_anchor(tmp_path: Path) -> None:
    started = time.monotonic()
    got = problems_in(tmp_path, alias_bomb(10))  # 9**10 values once expanded
    assert time.monotonic() - started < 2  # it took minutes and gigabytes
    assert got == [
        f"{tmp_path / 'r.yaml'}:1:5: -: anchor &a0: anchors and aliases are not allowed; write the value out"
    ]


def test_aliases_and_merge_keys_are_refused_where_they_are(tmp_path: Path) -> None:
    text = "rules:\n  - id: r\n    source: logs\n    where: status = 1\n    labels: *team\n"
    got = problems_in(tmp_path, text)
    assert len(got) == 1 and ":5:13: -: alias *team: anchors and aliases are not allowed" in got[0], got


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("!!int abc", "'abc' is not a valid int"),
        ("!!bool maybe", "'maybe' is not a valid bool"),
        ("!!timestamp yesterday", "'yesterday' is not a valid timestamp"),
        ("1" * 5000, "int value of 5000 characters; the limit is 100 (quote it if it is text)"),
        ("1:2" * 40_000, "int value of 120000 characters; the limit is 100"),  # base 60: quadratic
    ],
)
def test_odd_scalars_are_problems_at_their_position(tmp_path: Path, value: str, message: str) -> None:
    got = problems_in(tmp_path, f"rules:\n  - id: r\n    source: logs\n    description: {value}\n")
    assert len(got) == 1 and ":4:18: -: " in got[0] and message in got[0], got


def test_a_file_over_the_size_cap_is_refused_unread(tmp_path: Path) -> None:
    text = rule("status = 1") + "#" * MAX_FILE_BYTES
    got = problems_in(tmp_path, text)
    assert got == [
        f"{tmp_path / 'r.yaml'}:1:1: -: file is larger than {MAX_FILE_BYTES} bytes (the limit); "
        "split it into several files"
    ]


def test_a_fifo_is_refused_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "r.yaml"
    os.mkfifo(fifo)
    with pytest.raises(RuleConfigError) as info:
        load_rules([tmp_path])
    assert [str(p) for p in info.value.problems] == [f"{fifo}:1:1: -: cannot read file: not a regular file"]


def test_problems_past_the_cap_are_counted_not_listed(tmp_path: Path) -> None:
    text = "rules:\n" + "".join(f"  - id: r{i}\n    source: nope\n" for i in range(MAX_PROBLEMS + 50))
    got = problems_in(tmp_path, text)
    assert len(got) == MAX_PROBLEMS + 1, len(got)
    assert got[-1].endswith(f"50 more problem(s) in this file; only the first {MAX_PROBLEMS} are listed")


def test_a_branch_to_a_name_kafka_refuses_is_a_problem(tmp_path: Path) -> None:
    text = 'rules:\n  - id: b\n    source: logs\n    branch:\n      - {when: status = 1, to: ".."}\n'
    want = f"{tmp_path / 'r.yaml'}:5:32: b: 'to': '..' is not a Kafka topic name"
    assert problems_in(tmp_path, text) == [want]


@pytest.mark.parametrize("topic", ["alerts", "commands", "notifications", "dlq.events", "tables.devices",
                                   "alerts.oncall", "__consumer_offsets"])  # fmt: skip
def test_a_branch_to_one_of_the_systems_own_topics_is_a_problem(tmp_path: Path, topic: str) -> None:
    text = f'rules:\n  - id: b\n    source: logs\n    branch:\n      - {{when: status = 1, to: "{topic}"}}\n'
    (got,) = problems_in(tmp_path, text)
    assert (
        got.startswith(f"{tmp_path / 'r.yaml'}:5:") and f"{topic!r} is one of the system's own topics" in got
    )


def test_too_many_values_are_a_problem(tmp_path: Path) -> None:
    got = problems_in(tmp_path, "rules: [" + "0," * yamlpos.MAX_NODES + "0]\n")
    assert len(got) == 1 and f"more than {yamlpos.MAX_NODES} values in one file (the limit)" in got[0], got


def test_a_recursion_or_memory_error_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def exhausted(_text: str, _path: str) -> Any:
        raise MemoryError

    monkeypatch.setattr(loader_module, "load_text", exhausted)
    got = problems_in(tmp_path, rule("status = 1"))
    assert got == [f"{tmp_path / 'r.yaml'}:1:1: -: file needs too much memory to load (MemoryError)"]


def test_unclosed_template_braces_take_linear_time(tmp_path: Path) -> None:
    summary = "{{" * 100_000  # the regex {{.*?}} rescanned the line from every one
    started = time.monotonic()
    assert template.placeholders(summary) == []
    assert time.monotonic() - started < 2
    for text in ("{{ a }} {{b|upper}}", "{{ a\n}} {{{}}", "{{ {{ x }} }}", "}} {{"):
        assert template.braces(text) == re.findall(r"\{\{.*?\}\}", text), text


def test_escaped_quotes_in_an_expression_take_linear_time() -> None:
    text = "'" + "\\'" * 2040  # an unterminated literal: the regex split rescanned it from every quote
    started = time.monotonic()
    for _ in range(50):
        assert rewrite_durations(text) == text
    assert time.monotonic() - started < 2
    assert rewrite_durations("a > 5m and b = '5m' and c = 'it''s 5m'") == (
        "a > INTERVAL '5' MINUTE and b = '5m' and c = 'it''s 5m'"
    )


def test_the_issues_redos_like_uses_no_regex_and_answers_at_once() -> None:
    where = compile_expr("message LIKE '%a%a%a%a%b'", SCHEMA, boolean=True)
    assert all(run.rx is None for run in like_runs("%a%a%a%a%b"))  # string searches only
    started = time.monotonic()
    assert where({"message": "a" * 350}) is False  # held a worker's alerts for 30 s
    assert where({"message": "a" * MAX_STRING_LEN}) is False
    assert where({"message": "a" * MAX_STRING_LEN + "b"}) is True
    assert where({"message": "xaxaxaxab"}) is True
    assert where({"message": None}) is None
    assert time.monotonic() - started < 2


def test_ilike_and_underscores_stay_within_their_run_cap() -> None:
    started = time.monotonic()
    value = "a" * MAX_STRING_LEN + "b"
    for pattern in ("%" + "a_" * (MAX_LIKE_RUN // 2 - 1) + "ac%b", "%" + "A" * (MAX_LIKE_RUN - 1) + "C%B"):
        where = compile_expr(f"message ILIKE '{pattern}'", SCHEMA, boolean=True)
        assert where({"message": value}) is False
    assert time.monotonic() - started < 2
    with pytest.raises(ExpressionError, match=f"at most {MAX_LIKE_RUN} characters when it has _"):
        compile_expr("message LIKE '%" + "a_" * MAX_LIKE_RUN + "%'", SCHEMA, boolean=True)
    with pytest.raises(ExpressionError, match=r"ILIKE pattern: .* this one has 129"):
        compile_expr("message ILIKE '%" + "a" * 129 + "%'", SCHEMA, boolean=True)
    # a case-sensitive run without _ is a string search: no cap
    assert (
        compile_expr("message LIKE '%" + "a" * 3000 + "%'", SCHEMA, boolean=True)({"message": "a"}) is False
    )


@pytest.mark.parametrize(
    ("pattern", "value", "want"),
    [
        ("abc", "abc", True),
        ("abc", "abcd", False),
        ("a_c", "a\nc", True),
        ("a%", "a", True),
        ("%a", "ba", True),
        ("%b%", "abc", True),
        ("a%c", "ac", True),
        ("ab%bc", "abc", False),  # the ends may not overlap
        ("%a_b%", "xxaxbyy", True),
        ("a\\%b", "a%b", True),
        ("a\\%b", "axb", False),
        ("a\\", "a\\", True),
        ("%", "", True),
        ("", "", True),
        ("_", "", False),
    ],
)
def test_like_matches_as_the_regex_did(pattern: str, value: str, want: bool) -> None:
    where = compile_expr(f"message LIKE {quote(pattern)}", SCHEMA, boolean=True)
    assert where({"message": value}) is want
    assert (re.fullmatch(old_like_regex(pattern), value, re.DOTALL) is not None) is want


def quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
