"""Property-based fuzzing of the rule loader and the expression compiler (issue 23).

Whatever the text, loading answers with rules or with :class:`RuleConfigError` whose
problems each name the file and a line and column inside it; compiling answers with an
expression or :class:`ExpressionError`. Nothing else may escape: no RecursionError,
no ValueError from a YAML constructor, no stall (each example has a deadline). The
linear-time replacements of regexes (LIKE, string literal splitting, template braces)
give exactly what the regexes gave. Bounded: a few hundred examples each, ~10-20 s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.errors import ExpressionError, RuleConfigError
from app.events import SCHEMAS
from app.rules import template, yamlpos
from app.rules.expr import compile_expr, split_strings
from app.rules.functions import FUNCTIONS, like_matcher
from app.rules.loader import load_rules
from app.rules.spark_sql import to_spark_sql
from tests.rules.like_oracle import old_like_regex

FUZZ = settings(
    max_examples=150,
    deadline=timedelta(seconds=5),  # a stall, not a slow machine: examples take milliseconds
    database=None,  # no .hypothesis/ directory in the tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SCHEMA = SCHEMAS["logs"].all_fields()

# -- expressions ---------------------------------------------------------------------------

FIELDS = [*SCHEMA, "temperature", "nope", "device.site", "`status`", "a.b.c"]
OPERATORS = ["=", "!=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "%", "AND", "OR", "||", "&", "|"]
CALLS = [*FUNCTIONS, "pct_change", "prev", "count", "sum", "now", "cast", "nope"]
LITERALS = ["1e999", "0.5", ".5", "5.", "1e-999", "NULL", "TRUE", "false", "5m", "1d", "15ms", "3w"]
PUNCTUATION = ["'", '"', "`", "\\", "(", ")", ",", "[0]", "''", "'\\'", "*", "?", ";", "--", "/*"]
CLOSERS = {"(": ")", "abs(": ")", "[": "]", "NOT (": ")"}

atoms = st.one_of(
    st.sampled_from(FIELDS),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=False).map(repr),
    st.sampled_from(LITERALS),
    st.text(st.sampled_from("ab%_\\'\" \n"), max_size=8).map(lambda s: "'" + s.replace("'", "''") + "'"),
    st.sampled_from(PUNCTUATION),
)


def _call(c: tuple[str, list[str]]) -> str:
    return f"{c[0]}({', '.join(c[1])})"


def _in(c: tuple[str, list[str]]) -> str:
    return f"{c[0]} IN ({', '.join(c[1])})"


def _nested(c: tuple[str, int]) -> str:
    return c[0] * c[1] + "status = 1" + CLOSERS.get(c[0], "") * c[1]


def _expressions(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(OPERATORS), inner).map(" ".join),
        inner.map(lambda x: f"NOT {x}"),
        inner.map(lambda x: f"-{x}"),
        inner.map(lambda x: f"({x})"),
        st.tuples(st.sampled_from(CALLS), st.lists(inner, max_size=4)).map(_call),
        st.tuples(inner, st.lists(inner, min_size=1, max_size=4)).map(_in),
        st.tuples(inner, inner, inner).map(lambda c: f"{c[0]} BETWEEN {c[1]} AND {c[2]}"),
        st.tuples(inner, st.sampled_from(["LIKE", "ILIKE", "NOT LIKE"]), inner).map(" ".join),
        inner.map(lambda x: f"{x} IS NULL"),
        inner.map(lambda x: f"{x} IS NOT NULL"),
        st.tuples(inner, inner).map(lambda c: f"CASE WHEN {c[0]} THEN {c[1]} END"),
        inner.map(lambda x: f"CAST({x} AS DOUBLE)"),
    )


expressions = st.one_of(
    st.recursive(atoms, _expressions, max_leaves=12),
    st.lists(atoms | st.sampled_from(OPERATORS + CALLS), max_size=12).map(" ".join),  # token soup
    st.tuples(st.sampled_from([*CLOSERS, "NOT ", "- ", "CASE WHEN "]), st.integers(0, 60)).map(_nested),
)


@settings(FUZZ, max_examples=300)
@given(text=expressions, boolean=st.booleans(), intervals=st.booleans())
def test_the_compiler_answers_an_expression_or_an_expression_error(
    text: str, boolean: bool, intervals: bool
) -> None:
    try:
        compiled = compile_expr(text, SCHEMA, boolean=boolean, allow_intervals=intervals)
    except ExpressionError as exc:
        assert str(exc)
        return
    for row in ({}, {"status": 200, "message": "a%b", "duration_ms": 1.5, "path": "/x"}):
        compiled(row)
    try:
        to_spark_sql(text, SCHEMA)
    except ExpressionError as exc:
        assert str(exc)


# -- rule files ----------------------------------------------------------------------------

ODD = [
    "~", "null", "yes", "No", "on", ".inf", "-.NaN", "0x1F", "0o17", "0b101", "1:30", "1_000", "+12e3",
    "2024-01-01", "2024-01-01T10:00:00Z", "!!int abc", "!!float x", "!!bool x", "!!timestamp x",
    "!!binary aGk=", "!!str 1", "!!set {a}", "!!omap [a: 1]", "!!python/object:os.system x", "!custom x",
    "'quoted'", '"dq \\u0041"', '"bad \\x"', "|\n  block", ">-\n  folded", "&a x", "*a", "<<: *a", "? k",
    "1" * 150, "1:2" * 60, "\t", "\x00", "\ufeff", "\x85", "\u2028", "é", "%", "{{ x }}", "{{", "- ", ":",
    "[", "]", "{", "}", ",", "#", "---", "...", "%YAML 1.1", "&a [*a]", "[" * 70, "- " * 70, "{a: " * 70,
]  # fmt: skip

printable = st.characters(exclude_categories=("Cc", "Cs"))  # control characters: in ODD
scalars = st.one_of(
    st.sampled_from(ODD),
    st.text(printable, max_size=12),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.booleans(),
    st.none(),
)


def _collections(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(printable, max_size=6), inner, max_size=4)


values = st.recursive(scalars, _collections, max_leaves=10)
conditions = st.one_of(
    st.sampled_from(["status >= 400", "message LIKE '%a%b_'", "path ILIKE '/x%'", "duration_ms > 1.5"]),
    expressions,
)
templates = st.text(st.sampled_from("{} |ab.x\n"), max_size=20) | st.sampled_from(["{{ status }}", "{{ n }}"])


def _rules(pick: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Rules of every kind, their keys' values drawn from ``pick`` (``least``: the fewest
    sequence steps and branch arms)."""
    common = {"id": pick["id"], "source": pick["source"]}
    optional = {k: pick[k] for k in ("group_by", "annotations", "labels", "severity", "engine")}
    steps = st.fixed_dictionaries({"name": st.sampled_from(["a", "b"]), "where": conditions})
    arms = st.fixed_dictionaries({"when": conditions, "to": pick["topic"]})
    aggregates = st.dictionaries(pick["aggregate"], st.sampled_from(["count(*)"]) | expressions, min_size=1)
    return st.one_of(
        st.fixed_dictionaries(
            {**common, "where": conditions},
            optional={**optional, "for": pick["duration"], "clear": conditions},
        ),
        st.fixed_dictionaries(
            {**common, "window": pick["window"], "aggregate": aggregates, "having": conditions},
            optional={**optional, "where": conditions},
        ),
        st.fixed_dictionaries(
            {**common, "sequence": st.lists(steps, min_size=pick["least"]), "within": pick["duration"]}
        ),
        st.fixed_dictionaries({**common, "branch": st.lists(arms, min_size=pick["least"], max_size=3)}),
    )


#: rules whose keys are all well formed, so that their expressions reach the compiler
plausible_rules = _rules(
    {
        "id": st.sampled_from(["r", "hot", "r.2", "a-b"]),
        "source": st.sampled_from(["logs", "logs", "sensors"]),
        "group_by": st.lists(st.sampled_from(FIELDS), max_size=2),
        "annotations": st.dictionaries(st.just("summary"), templates, max_size=1),
        "labels": st.dictionaries(st.sampled_from(["team", "env"]), st.text(printable, max_size=5)),
        "severity": st.sampled_from(["critical", "warning", "info"]),
        "engine": st.sampled_from(["faust", "spark", "both"]),
        "topic": st.sampled_from(["t1", "t2"]),
        "aggregate": st.sampled_from(["n", "s", "status"]),
        "duration": st.sampled_from(["5m", "1h", "30s", "1d", "0s"]),
        "window": st.sampled_from(
            [
                {"type": "tumbling", "size": "5m"},
                {"type": "sliding", "size": "1m"},
                {"type": "session", "gap": "1m"},
            ]
        ),
        "least": 2,
    }
)
#: rules with anything in their keys
wild_rules = _rules(
    {
        "id": st.sampled_from(["r", "Bad Id", ""]) | st.text(printable, max_size=4),
        "source": st.sampled_from(["logs", "nope"]) | values,
        "group_by": values,
        "annotations": st.dictionaries(st.sampled_from(["summary", "x"]), templates | values),
        "labels": values,
        "severity": values,
        "engine": st.sampled_from(["faust", "flink"]) | values,
        "topic": st.sampled_from(["t1", "t 2"]) | values,
        "aggregate": st.text(printable, max_size=4),
        "duration": st.sampled_from(["5m", "30", "-1m", "1y", "999999999d", "1.5m", ""]) | values,
        "window": values,
        "least": 0,
    }
)
rules = st.one_of(plausible_rules, plausible_rules, wild_rules, st.dictionaries(st.text(max_size=6), values))
engines = st.sampled_from(["spark", "faust", "x"])
rule_files = st.fixed_dictionaries(
    {"rules": st.lists(rules, min_size=1, max_size=3)}, optional={"engine": engines}
)
documents = st.one_of(rule_files, rule_files, rule_files, values)


@st.composite
def rule_texts(draw: st.DrawFn) -> str:
    """A YAML document of rule-like data, with odd fragments spliced into some lines."""
    text = yaml.safe_dump(
        draw(documents), allow_unicode=True, sort_keys=False, default_flow_style=draw(st.booleans())
    )
    lines = text.splitlines()
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 0, 1, 3]))):
        at = draw(st.integers(0, len(lines)))
        piece = draw(st.sampled_from(ODD) | st.text(max_size=10))  # control characters too
        if at < len(lines) and draw(st.booleans()):
            lines[at] += piece  # at the end of a line: a value's tail
        else:
            lines.insert(at, draw(st.sampled_from(["", "  ", "- ", "key: "])) + piece)
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "rules.yaml"


def _lines(text: str) -> int:
    """One more than the lines of ``text`` as YAML counts them (NEL, LS and PS break lines too)."""
    return sum(text.count(c) for c in "\n\r\x85\u2028\u2029") + 2


def _loads_or_locates(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_rules([path])
    except RuleConfigError as exc:
        lines = _lines(text)
        for p in exc.problems:
            assert p.path == str(path) and p.message, p
            assert 1 <= p.line <= lines and p.col >= 1, (p, lines)


@FUZZ
@given(text=rule_texts())
def test_the_loader_answers_rules_or_located_problems(rule_file: Path, text: str) -> None:
    _loads_or_locates(rule_file, text)


yaml_soup = st.text(st.sampled_from("-:[]{},&*!|>'\"#?% \n\tab01.~é\x00\x85\ufeff\ud800"), max_size=80)


@FUZZ
@given(text=yaml_soup)
def test_the_loader_survives_yaml_punctuation(rule_file: Path, text: str) -> None:
    _loads_or_locates(rule_file, text)


@FUZZ
@given(text=yaml_soup | rule_texts())
def test_both_yaml_parsers_answer_data_or_a_located_problem(text: str) -> None:
    # libyaml's parser when PyYAML has it (its wheels do), PyYAML's own otherwise
    for parser in (yamlpos.CLoader, yamlpos.PyLoader):
        with _parsing_with(parser):
            try:
                yamlpos.load_with_positions(text)
            except yamlpos.YamlProblem as exc:
                assert 1 <= exc.line <= _lines(text) and exc.col >= 1 and exc.message


@contextmanager
def _parsing_with(parser: type) -> Iterator[None]:
    chosen, yamlpos.LOADER = yamlpos.LOADER, parser
    try:
        yield
    finally:
        yamlpos.LOADER = chosen


@FUZZ
@given(
    kind=st.sampled_from(["[", "{a: ", "- ", "  - ", "? "]),
    depth=st.integers(0, 400),
    anchor=st.sampled_from(["", "&x ", "*x"]),
)
def test_the_loader_bounds_nesting_and_aliases(rule_file: Path, kind: str, depth: int, anchor: str) -> None:
    closing = {"[": "]", "{a: ": "}"}.get(kind, "")
    indent = kind == "  - "
    body = "".join(("  " * i if indent else "") + kind + ("\n" if indent else "") for i in range(depth))
    _loads_or_locates(rule_file, "rules: " + anchor + body + "x" + closing * depth + "\n")


# -- the linear-time replacements of regexes ------------------------------------------------


def _old_like(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    return re.compile(old_like_regex(pattern), re.DOTALL | (re.IGNORECASE if ignore_case else 0))


@settings(FUZZ, max_examples=400)
@given(
    pattern=st.text(st.sampled_from("aAbß%_\\\n"), max_size=10),
    values=st.lists(st.text(st.sampled_from("aAbBßẞ\n\\%_"), max_size=12), min_size=1, max_size=8),
    ignore_case=st.booleans(),
)
def test_like_answers_as_the_regex_it_replaced(pattern: str, values: list[str], ignore_case: bool) -> None:
    like, rx = like_matcher(pattern, ignore_case), _old_like(pattern, ignore_case)
    for value in values:
        assert like(value) is (rx.fullmatch(value) is not None), (pattern, value, ignore_case)


@settings(FUZZ, max_examples=400)
@given(text=st.text(st.sampled_from("'\\a\n 5m"), max_size=20))
def test_string_literals_split_as_the_regex_did(text: str) -> None:
    assert split_strings(text) == re.split(r"('(?:[^'\\]|\\.|'')*')", text)


@settings(FUZZ, max_examples=400)
@given(text=st.text(st.sampled_from("{} a|\n"), max_size=20))
def test_template_braces_are_found_as_the_regex_did(text: str) -> None:
    assert template.braces(text) == re.findall(r"\{\{.*?\}\}", text)
    try:
        template.placeholders(text)
    except ValueError as exc:
        assert "bad placeholder" in str(exc)
