"""Rule files that passed ``rules check`` and then failed or misbehaved on every event (the
bad-input audit of 2026-11-30): each is now refused when it loads, at the file, line and
column of the value at fault, with the key or function it names; and what a valid rule reads
at run time stays NULL in, NULL out."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import ExpressionError, RuleConfigError
from app.events import LOGS, SENSORS
from app.rules.evaluator import Engine
from app.rules.expr import compile_expr
from app.rules.functions import inside_polygon
from app.rules.loader import load_rules
from app.rules.spark_sql import to_spark_sql
from tests.rules.helpers import T0, rules

FIELDS = SENSORS.all_fields()


def problems(tmp_path: Path, body: str) -> list[str]:
    """Every problem of a rule file holding ``body`` under ``rules:`` (it must not load)."""
    f = tmp_path / "r.yaml"
    f.write_text("rules:\n" + body)
    with pytest.raises(RuleConfigError) as info:
        load_rules([f])
    return [str(p) for p in info.value.problems]


def one_problem(tmp_path: Path, body: str, line: int, message: str) -> str:
    (problem,) = problems(tmp_path, body)
    assert problem.startswith(f"{tmp_path / 'r.yaml'}:{line}:"), problem
    assert message in problem, problem
    return problem


def window(spec: str) -> str:
    head = f"  - id: w\n    source: sensors\n    window: {spec}\n"
    return head + "    aggregate: {n: count(*)}\n    having: n > 3\n"


# -- 1. durations that must be above 0 ----------------------------------------------------


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        (window("{type: tumbling, size: 0s}"), 4, "'size' must be above 0"),
        (window("{type: hopping, size: 10m, advance: 0s}"), 4, "'advance' must be above 0"),
        (window("{type: sliding, size: 0ms}"), 4, "'size' must be above 0"),
        (window("{type: session, gap: 0s}"), 4, "'gap' must be above 0"),
        ("  - id: t\n    source: sensors\n    new_term: {field: kind, horizon: 0s}\n", 4, "'horizon' must"),
        (
            "  - id: s\n    source: sensors\n    within: 0s\n"
            "    sequence: [{name: a, where: temperature > 5}, {name: b, where: temperature > 6}]\n",
            4,
            "'within' must be above 0",
        ),
        (
            "  - id: a\n    source: sensors\n    absent_for: 0s\n    group_by: [device_id]\n",
            4,
            "'absent_for' must",
        ),
        (
            "  - id: p\n    source: sensors\n    where: pct_change(temperature, 0s) > 5\n",
            4,
            "pct_change(): the lookback must be above 0",
        ),
        (
            "  - id: n\n    source: sensors\n    where: temperature > 5\n    no_data: {after: 0m}\n",
            5,
            "'after' must be above 0",
        ),
    ],
    ids=[
        "tumbling",
        "hopping",
        "sliding",
        "session",
        "new_term",
        "within",
        "absent_for",
        "pct_change",
        "no_data",
    ],
)
def test_a_zero_duration_is_refused_at_its_key(tmp_path: Path, body: str, line: int, message: str) -> None:
    """A tumbling ``size: 0s`` divided by zero on every event; ``advance: 0s`` ran as a
    tumbling window; the others were accepted and meant nothing (no window, no wait)."""
    one_problem(tmp_path, body, line, message)


def test_resolve_after_zero_is_refused(tmp_path: Path) -> None:
    """``resolve_after: 0s`` is refused, not kept. The evaluator resolves an event alert when
    the clock reaches its last trigger + ``resolve_after``: with 0 that is the trigger's own
    time, so every alert resolves the instant it fires (``ends_at`` = ``starts_at``), a
    second trigger can never extend it, and each trigger is a firing and a resolution sent
    together: an alert that is never firing at any event time."""
    body = "  - id: c\n    source: sensors\n    change: kind\n    resolve_after: 0s\n"
    one_problem(tmp_path, body, 5, "'resolve_after' must be above 0")


def test_durations_that_may_be_zero_still_load(tmp_path: Path) -> None:
    """``for``, ``keep_firing_for`` and ``allowed_lateness`` mean "at once" and "none" at 0,
    their defaults, so 0 stays valid; and 1ms is above 0 everywhere."""
    body = (
        "  - id: z\n    source: sensors\n    where: temperature > 5\n    for: 0s\n"
        "    keep_firing_for: 0s\n    allowed_lateness: 0s\n"
        "  - id: tiny\n    source: sensors\n    window: {type: session, gap: 1ms}\n"
        "    aggregate: {n: count(*)}\n    having: n > 3\n"
    )
    assert [r.id for r in rules(tmp_path, body).rules] == ["z", "tiny"]


# -- 2 and 3. geo literals ------------------------------------------------------------------


def where(condition: str) -> str:
    return f'  - id: g\n    source: sensors\n    where: "{condition}"\n'


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        ("inside_polygon(lat, lon, 'foo bar, 1 2')", "inside_polygon(): polygon vertex 'foo bar' is not"),
        ("inside_polygon(lat, lon, '0 0, 1 1')", "inside_polygon(): a polygon needs at least three"),
        ("inside_polygon(lat, lon, '95 0, 10 10, 0 10')", "polygon vertex '95 0' is out of range"),
        ("inside_polygon(lat, lon, 'NaN 0, 10 10, 0 10')", "polygon vertex 'NaN 0' is out of range"),
        ("distance_km(lat, lon, 999, -500) > 5", "distance_km(): argument 3 is a latitude, from -90 to 90"),
        ("distance_km(lat, lon, 45, -500) > 5", "distance_km(): argument 4 is a longitude"),
        ("inside_radius(lat, lon, 91, 181, 5)", "inside_radius(): argument 3 is a latitude"),
        ("inside_radius(lat, lon, 45, 7, -5)", "inside_radius(): argument 5 is a radius in km, 0 or more"),
        ("inside_polygon(200, lon, '0 0, 0 10, 10 10')", "inside_polygon(): argument 1 is a latitude"),
    ],
)
def test_a_geo_literal_that_cannot_be_meant_is_refused(tmp_path: Path, condition: str, message: str) -> None:
    one_problem(tmp_path, where(condition), 4, message)


def test_geo_literals_in_range_still_load(tmp_path: Path) -> None:
    body = where("inside_radius(lat, lon, -90, 180, 0) or inside_polygon(lat, lon, '0 0, 0 10, 10 10')")
    assert [r.id for r in rules(tmp_path, body).rules] == ["g"]


@pytest.mark.parametrize("polygon", ["foo bar, 1 2", "0 0, 1 1", "95 0, 10 10, 0 10", "nan 0, 1 1, 2 2", ""])
def test_a_malformed_polygon_read_at_run_time_is_null(polygon: str) -> None:
    """A polygon from an event or a table is only known per event: a bad one gives NULL, as
    bad coordinates do in the other geo functions, instead of raising on every event. (The
    Spark engine's UDF wraps this same function.)"""
    compiled = compile_expr("inside_polygon(lat, lon, kind)", FIELDS, boolean=True)
    assert compiled({"lat": 5.0, "lon": 5.0, "kind": polygon}) is None
    assert inside_polygon(5.0, 5.0, polygon) is None
    assert compiled({"lat": 5.0, "lon": 5.0, "kind": "0 0, 0 10, 10 10, 10 0"}) is True


def test_a_rule_reading_a_bad_polygon_goes_on_without_an_error(tmp_path: Path) -> None:
    engine = Engine(rules(tmp_path, where("inside_polygon(lat, lon, kind) IS NULL")))
    event = {"device_id": "d1", "ts": T0.isoformat(), "lat": 5.0, "lon": 5.0, "kind": "0 0, 1 1"}
    assert [a.status for a in engine.process("sensors", SENSORS.validate(event)).alerts] == ["firing"]
    assert engine.take_rule_errors() == {}


def test_out_of_range_literals_stay_null_in_a_plain_expression() -> None:
    """Only the loader refuses them; an expression compiled on its own (as the Spark parity
    tests compile one) keeps the language's answer, NULL."""
    assert compile_expr("distance_km(lat, lon, 100, 0)", FIELDS)({"lat": 1.0, "lon": 1.0}) is None


# -- 4. non-finite numbers ----------------------------------------------------------------


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1.5e400"])
def test_a_number_literal_past_a_double_is_refused(tmp_path: Path, number: str) -> None:
    one_problem(
        tmp_path, where(f"temperature > {number}"), 4, "out of a double's range (it would be infinite)"
    )
    with pytest.raises(ExpressionError, match="out of a double's range"):
        compile_expr(f"temperature > {number}", FIELDS)


def test_large_and_tiny_finite_numbers_still_load() -> None:
    assert compile_expr("temperature > 1e308 or temperature > 1e-999", FIELDS)({"temperature": 1.0}) is True


@pytest.mark.parametrize(
    ("condition", "comment"),
    [
        ("battery < 20--5", "'5'"),  # read as battery < 20: quiet at 22, where 20 - -5 fires
        ("temperature > 100 -- AND humidity > 90", "'AND humidity > 90'"),
        ("temperature > 100 /* AND humidity > 90 */", "'AND humidity > 90'"),
    ],
)
def test_an_sql_comment_that_would_cut_the_expression_is_refused(
    tmp_path: Path, condition: str, comment: str
) -> None:
    one_problem(tmp_path, where(condition), 4, f"holds an SQL comment ({comment}")
    with pytest.raises(ExpressionError, match="YAML's '#'"):
        compile_expr(condition, FIELDS)


@pytest.mark.parametrize(
    "condition", ["CASE WHEN temperature > 30 THEN 1 ELSE 0 END > 0", "IF(temperature > 30, 1, 0) > 0"]
)
def test_case_and_if_are_named_as_not_in_the_rule_language(tmp_path: Path, condition: str) -> None:
    """They read as "function case() is not allowed", as if a function had been misspelt."""
    one_problem(tmp_path, where(condition), 4, "CASE and IF are not in the rule language")


def test_dashes_in_strings_and_a_spaced_double_minus_still_load() -> None:
    check = compile_expr("battery < 20 - -5 and device_id != '--x'", FIELDS)
    assert check({"battery": 22.0, "device_id": "a"})


# -- 5. a file that is not UTF-8 ----------------------------------------------------------


def test_a_non_utf8_byte_is_reported_at_its_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    raw = "rules:\n  - id: a\n    source: sensors\n    where: temperature > 5 # café\n".encode().replace(
        b"\xc3\xa9", b"\xe9"
    )
    f.write_bytes(raw)
    with pytest.raises(RuleConfigError) as info:
        load_rules([f])
    (problem,) = [str(p) for p in info.value.problems]
    at = raw.index(b"\xe9")
    assert problem.startswith(f"{f}:4:{len('    where: temperature > 5 # caf') + 1}: -: file is not UTF-8"), (
        problem
    )
    assert f"byte 0xe9 at offset {at}" in problem, problem


# -- 6. YAML scalars that are not strings -------------------------------------------------


@pytest.mark.parametrize(
    ("head", "line", "message"),
    [
        ("  - id: yes\n", 2, """'id': read as the boolean true, not a string; quote it: id: "yes\""""),
        ("  - id: 123\n", 2, """'id': read as the number 123, not a string; quote it: id: "123\""""),
        (
            "  - id: p\n    description: 2024-01-01\n",
            3,
            "'description': read as the date 2024-01-01, not a string; quote it: description: \"2024-01-01\"",
        ),
        (
            "  - id: p\n    labels: {team: 5}\n",
            3,
            """'team': read as the number 5, not a string; quote it: team: "5\"""",
        ),
        ("  - id: p\n    description:\n", 3, "'description': no value given (YAML reads that as null)"),
    ],
    ids=["boolean", "number", "date", "label", "null"],
)
def test_a_scalar_yaml_did_not_read_as_a_string_says_how_to_quote_it(
    tmp_path: Path, head: str, line: int, message: str
) -> None:
    one_problem(tmp_path, head + "    source: sensors\n    where: temperature > 5\n", line, message)


def test_an_inline_mapping_split_at_a_comma_is_named(tmp_path: Path) -> None:
    body = window("{type: tumbling, size: 1h}").replace("{n: count(*)}", "{n: percentile(temperature, 0.5)}")
    one_problem(
        tmp_path,
        body,
        5,
        "'0.5)': an inline {...} mapping splits at commas, so the value of 'n' was cut there; "
        'quote the expression: n: "percentile(temperature, 0.5)"',
    )


# -- 7. templates -------------------------------------------------------------------------


def annotated(key: str, mapping: str) -> str:
    return f"  - id: t\n    source: sensors\n    where: temperature > 5\n    {key}:\n{mapping}"


def test_a_template_in_a_label_is_refused(tmp_path: Path) -> None:
    """Labels identify the alert (its fingerprint and id): filling them per event would give
    one rule's alert another id at each value, so they are static, and a ``{{`` is refused."""
    body = annotated("labels", '      team: plant\n      dev: "{{ device_id }}"\n')
    problem = one_problem(tmp_path, body, 7, "labels are static")
    assert "annotations" in problem and "group_by" in problem


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ('"{{ temperature "', "'{{' (character 1) is not closed by '}}' on its line"),
        ('"{% import os %}{{ device_id }}"', "'{% ... %}' blocks are not supported"),
        ('"at {{ temperature }} }}"', "'}}' (character 22) closes no '{{'"),
    ],
    ids=["unclosed", "block", "stray-close"],
)
def test_an_annotation_that_would_print_itself_is_refused(
    tmp_path: Path, template: str, message: str
) -> None:
    one_problem(tmp_path, annotated("annotations", f"      summary: {template}\n"), 6, message)


def test_templates_that_fill_every_placeholder_still_load(tmp_path: Path) -> None:
    body = annotated(
        "annotations", '      summary: "{{ device_id }} at {{ temperature | round(1) }} {braces}"\n'
    )
    body += "    labels: {team: plant-ops}\n"
    assert [r.id for r in rules(tmp_path, body).rules] == ["t"]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "{{ kind | round(2) }}",
            "'{{ kind | round(2) }}': the filter round(2) needs a number, but 'kind' is text",
        ),
        ("{{ device_id | round(0) }}", "the filter round(0) needs a number, but 'device_id' is text"),
        ("{{ ts | round(1) }}", "the filter round(1) needs a number, but 'ts' is a timestamp"),
        (
            "{{ temperature | upper }}",
            "the filter upper needs text (a string), but 'temperature' is a number",
        ),
    ],
    ids=["string-field", "key", "timestamp", "upper-on-a-number"],
)
def test_a_filter_on_a_value_of_the_wrong_type_is_refused(
    tmp_path: Path, template: str, message: str
) -> None:
    """``round`` on text rendered it unrounded at every alert, ``upper`` on a number did nothing."""
    problem = one_problem(tmp_path, annotated("annotations", f'      summary: "{template}"\n'), 6, message)
    assert problem.startswith(f"{tmp_path / 'r.yaml'}:6:16: t: "), problem


def test_a_filter_on_an_aggregate_or_a_previous_value_follows_its_type(tmp_path: Path) -> None:
    """An aggregate has its function's type (``min`` of text is text); ``previous`` the
    changed field's."""
    body = window("{type: tumbling, size: 1h}").replace("{n: count(*)}", "{n: count(*), k: min(kind)}")
    body += '    annotations: {s: "{{ n | round(0) }} {{ k | round(1) }}"}\n'
    body += "  - id: c\n    source: sensors\n    change: status\n"
    body += '    annotations: {s: "{{ previous | round(1) }}"}\n'
    got = problems(tmp_path, body)
    assert [p.split(": ", 2)[1:] for p in got] == [
        ["w", "'{{ k | round(1) }}': the filter round(1) needs a number, but 'k' is text (a string)"],
        [
            "c",
            "'{{ previous | round(1) }}': the filter round(1) needs a number, but 'previous' is text "
            "(a string)",
        ],
    ]


def test_filters_on_values_of_their_type_still_load(tmp_path: Path) -> None:
    body = window("{type: tumbling, size: 1h}").replace("{n: count(*)}", "{n: count(*), a: avg(temperature)}")
    body += (
        '    annotations: {s: "{{ n | round(0) }} {{ a | round(2) }} {{ window_start | round(0) }} '
        '{{ kind | upper }} {{ device_id | lower }} {{ temperature | round(1) }}"}\n'
    )
    assert [r.id for r in rules(tmp_path, body).rules] == ["w"]


# -- 8. integers outside 64 bits ----------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "written", "character"),
    [
        ("temperature > 12345678901234567890123", "12345678901234567890123", 15),
        ("temperature > -12345678901234567890123", "-12345678901234567890123", 15),
        ("temperature in (1.5, - 9223372036854775809)", "-9223372036854775809", 22),
        ("pct_change(temperature, 1d) > 9223372036854775808", "9223372036854775808", 31),
    ],
)
def test_an_integer_outside_64_bits_is_named_as_one_at_its_character(
    tmp_path: Path, condition: str, written: str, character: int
) -> None:
    one_problem(
        tmp_path,
        where(condition),
        4,
        f"the integer {written} (character {character}) is outside the 64-bit range, "
        f"-9223372036854775808 to 9223372036854775807; write {written}.0 for a double",
    )


def test_the_least_64_bit_integer_is_a_long_on_both_engines(tmp_path: Path) -> None:
    body = '  - id: m\n    source: logs\n    where: "bytes = -9223372036854775808"\n'
    engine = Engine(rules(tmp_path, body))
    event = LOGS.validate({"host": "h", "ts": T0.isoformat(), "bytes": -(2**63)})
    assert [a.status for a in engine.process("logs", event).alerts] == ["firing"]
    assert (
        "(-9223372036854775807L - 1L)" in to_spark_sql("bytes = -9223372036854775808", LOGS.all_fields()).sql
    )


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        ("holt_residual(temperature, 12345678901234567890123, 0.5) > 1", "got 12345678901234567890123"),
        (
            "ewma(temperature, 12345678901234567890123m) > 1",
            "at most 1w (7 days); got 12345678901234567890123m",
        ),
        ("predict_linear(temperature, 1h, 9999999999999999999999h) > 1", "got 9999999999999999999999h"),
    ],
    ids=["fraction", "half-life", "horizon"],
)
def test_a_big_integer_argument_is_named_as_written(tmp_path: Path, condition: str, message: str) -> None:
    """Not as the float it was turned into (``1.2345678901234568e+22``, ``8.57339e+18d``)."""
    assert one_problem(tmp_path, where(condition), 4, message).endswith(message)


# -- 9. literals in every expression of a rule ---------------------------------------------


@pytest.mark.parametrize(
    ("aggregate", "message"),
    [
        (
            "max(distance_km(lat, lon, 95, 0))",
            "distance_km(): argument 3 is a latitude, from -90 to 90; got 95",
        ),
        ("min(distance_km(lat, lon, 45, -181))", "distance_km(): argument 4 is a longitude"),
        ("sum(temperature * 12345678901234567890123)", "the integer 12345678901234567890123 (character 19)"),
        (
            "percentile(temperature, 12345678901234567890123)",
            "with 0 <= p <= 1; got p = 12345678901234567890123",
        ),
    ],
    ids=["latitude", "longitude", "integer", "percentile"],
)
def test_literals_in_an_aggregate_are_checked_as_in_a_condition(
    tmp_path: Path, aggregate: str, message: str
) -> None:
    body = window("{type: tumbling, size: 1h}").replace("{n: count(*)}", f'{{n: "{aggregate}"}}')
    problem = one_problem(tmp_path, body, 5, message)
    assert f"w: in {aggregate!r}: " in problem, problem


def test_every_expression_slot_checks_its_literals(tmp_path: Path) -> None:
    geo = "distance_km(lat, lon, 91, 0)"
    body = window("{type: tumbling, size: 1h}").replace("{n: count(*)}", f'{{n: "max({geo})"}}')
    having = "having: n > distance_km(0, 0, 91, 0)"
    body += window("{type: tumbling, size: 1h}").replace("id: w", "id: h").replace("having: n > 3", having)
    steps = f'[{{name: a, where: "{geo} > 1"}}, {{name: b, where: temperature > 1}}]'
    body += f"  - id: s\n    source: sensors\n    sequence: {steps}\n    within: 1h\n"
    body += f'  - id: b\n    source: sensors\n    branch: [{{when: "{geo} > 1", to: far}}]\n'
    got = problems(tmp_path, body)
    assert [(p.split(": ")[1], "argument 3 is a latitude" in p) for p in got] == [
        ("w", True),
        ("h", True),
        ("s", True),
        ("b", True),
    ], got
