"""Rule expressions on Spark give exactly what the Python evaluator gives: a table of
expressions x rows (NULLs, zeros, overflow, strings, LIKE escapes, rounding, geo)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from app.errors import ExpressionError
from app.rules.expr import compile_expr
from app.rules.spark_sql import SparkUnsupportedError, like_pattern, quote, to_spark_sql

SCHEMA = {
    "device_id": "string",
    "ts": "timestamp",
    "temperature": "double",
    "battery": "double",
    "lat": "double",
    "lon": "double",
    "status": "string",
    "kind": "string",
    "bytes": "long",
    "line": "long",
}
_SPARK_TYPES = {"string": StringType(), "timestamp": StringType(), "double": DoubleType(), "long": LongType()}
LONG_MAX = 2**63 - 1

ROWS: list[dict[str, Any]] = [
    {"temperature": 100.5, "battery": 50.0, "lat": 52.0, "lon": 13.0, "status": "error", "kind": "éx",
     "bytes": 10, "line": 3},
    {"temperature": 0.0, "battery": -0.0, "lat": 0.0, "lon": 0.0, "status": "", "kind": "a%",
     "bytes": 0, "line": 0},
    {},
    {"temperature": 1e308, "battery": -1e308, "lat": -90.0, "lon": 180.0, "status": "a%", "kind": "a\\b",
     "bytes": LONG_MAX, "line": -LONG_MAX},
    {"temperature": -2.5, "battery": 0.125, "lat": 52.52, "lon": 13.405, "status": "  ERROR  ",
     "kind": "x\ny", "bytes": -7, "line": 3},
    {"temperature": 2.675, "battery": 1.005, "lat": 91.0, "lon": 0.5, "status": "a'b", "kind": "_é",
     "bytes": 2**53 + 1, "line": -1},
]  # fmt: skip
for i, r in enumerate(ROWS):
    r.update(device_id=f"d{i}", ts=f"2024-01-0{i + 1}T00:00:00.000Z")

EXPRESSIONS = [
    # arithmetic: NULL for /0, %0 and long overflow; doubles overflow to inf
    "bytes + line", "bytes - line", "bytes * line", "bytes / line", "bytes % line", "bytes / 3",
    "temperature / 0", "temperature % 0", "bytes / 0", "bytes % 0", "bytes % 0.0",
    "bytes * 9223372036854775807", "bytes + 9223372036854775807", "bytes - 9223372036854775807 - 2",
    "2147483647 + 1", "temperature * 10", "temperature * 1e308 - temperature * 1e308",
    "-temperature", "-line", "temperature + bytes", "7 % -3", "-7 % 3", "-7.5 % 2", "bytes % -3",
    "temperature % 0.7", "1.5 * 2", "1e20 + 1",
    # comparison and three-valued logic
    "temperature > 100", "temperature = bytes", "status = 'error'", "status <> 'error'", "status < 'b'",
    "ts = ts", "temperature >= null", "temperature > 1 and status = 'x'", "temperature > 1 or status = 'x'",
    "not (temperature > 1)", "null and false", "null or true", "not null", "battery = 0",
    # IN and BETWEEN
    "status in ('error', 'b')", "status in ('a', null)", "status not in ('a')", "bytes in (10, 2.0)",
    "temperature in (1, bytes)", "temperature between 1 and 200", "temperature between null and 200",
    "temperature not between 1 and bytes",
    # LIKE with the rule language's escapes
    "status like 'er_o%'", r"status like 'a\%'", r"kind like '%\\%'", r"kind like 'a\\b'", r"kind like 'x\\'",
    r"kind like 'a\\\\b'", r"status = 'it\'s'", r"kind = 'x\ny'",
    "status ilike '%error%'", "kind like '%'", "kind like '_é'", "kind like 'x_y'",
    "kind ilike 'ÉX'", "status like '%r%o%'", "status like 'e%r_r%'", "status ilike '%R_O%R'",
    # NULL tests
    "temperature is null", "status is not null",
    # functions
    "abs(temperature)", "abs(bytes)", "abs(line)", "round(temperature)", "round(temperature, 1)",
    "round(battery, 2)", "round(temperature, -1)", "round(bytes, 1)", "round(temperature, 2.7)",
    "round(temperature, null)", "round(null)", "floor(battery)", "ceil(battery)", "floor(bytes)",
    "ceil(-2.5)",
    "lower(status)", "upper(kind)", "length(kind)", "trim(status)", "coalesce(temperature, battery, 0)",
    "coalesce(status, 'none')", "greatest(temperature, battery, null)", "least(bytes, line)",
    "greatest(bytes, temperature)", "least(null, null)", "length(status) + 2147483647", "upper(null)",
    # geo: the same geopy code through a UDF
    "distance_km(lat, lon, 52.52, 13.405)", "inside_radius(lat, lon, 52.52, 13.405, 300)",
    "inside_polygon(lat, lon, '50 10, 50 15, 55 15, 55 10')", "distance_km(lat, lon, 100, 0)",
    "distance_km(null, lon, 1, 2)", "distance_km(bytes, line, 0, 0)",
]  # fmt: skip


def python_value(text: str, row: dict[str, Any]) -> Any:
    return compile_expr(text, SCHEMA)(row)


def same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b) and (isinstance(a, str) == isinstance(b, str))


# Edge cases where the Python evaluator once departed from Spark SQL (and from its
# own documented "64-bit overflow gives NULL"). They are fixed; each keeps its own
# test below so a regression names the case.
EDGE_CASES: dict[tuple[str, str], str] = {
    ("round(temperature)", "d3"): "round_half_up raises decimal.InvalidOperation past 28 digits",
    ("round(temperature, 1)", "d3"): "round_half_up raises decimal.InvalidOperation past 28 digits",
    ("round(battery, 2)", "d3"): "round_half_up raises decimal.InvalidOperation past 28 digits",
    ("round(temperature, -1)", "d3"): "round_half_up raises decimal.InvalidOperation past 28 digits",
    ("round(temperature, 2.7)", "d3"): "round_half_up raises decimal.InvalidOperation past 28 digits",
    ("floor(battery)", "d3"): "math.floor gives an int outside 64 bits instead of NULL",
    ("ceil(battery)", "d3"): "math.ceil gives an int outside 64 bits instead of NULL",
    ("bytes / 3", "d5"): "long / long divides exact ints; Spark divides the doubles",
    ("greatest(bytes, temperature)", "d5"): "greatest of long and double returns the long unconverted",
}


def spark_values(spark: SparkSession, texts: list[str], rows: list[dict[str, Any]]) -> list[Any]:
    schema = StructType([StructField(n, _SPARK_TYPES[t]) for n, t in SCHEMA.items()])
    df = spark.createDataFrame([tuple(r.get(n) for n in SCHEMA) for r in rows], schema).coalesce(1)
    cols = [F.expr(to_spark_sql(text, SCHEMA).sql).alias(f"e{i}") for i, text in enumerate(texts)]
    got = df.select("device_id", *cols).orderBy("device_id").collect()
    assert len(got) == len(rows)
    return got


def mismatch(text: str, row: dict[str, Any], have: Any) -> str | None:
    try:
        want = python_value(text, row)
    except Exception as exc:
        want = f"raised {exc!r}"
    return None if same(want, have) else f"{text!r} on {row['device_id']}: python {want!r}, spark {have!r}"


@pytest.mark.slow
@pytest.mark.integration
def test_every_expression_gives_the_python_evaluators_result_on_spark(spark: SparkSession) -> None:
    got = spark_values(spark, EXPRESSIONS, ROWS)
    mismatches = [
        m
        for row, out in zip(ROWS, got, strict=True)
        for i, text in enumerate(EXPRESSIONS)
        if (m := mismatch(text, row, out[f"e{i}"]))
    ]
    assert mismatches == [], "\n".join(mismatches)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize(
    ("text", "device"),
    [pytest.param(t, d, id=f"{t} on {d}: {why}") for (t, d), why in EDGE_CASES.items()]
    + [pytest.param(t, "min", id=f"{t} of LONG_MIN is NULL") for t in ("-bytes", "abs(bytes)")],
)
def test_former_divergences_match_spark(spark: SparkSession, text: str, device: str) -> None:
    row = next((r for r in ROWS if r["device_id"] == device), {"device_id": "min", "bytes": -(2**63)})
    have = spark_values(spark, [text], [row])[0]["e0"]
    assert mismatch(text, row, have) is None


def test_literals_get_spark_types_that_match_the_rule_language() -> None:
    sql = to_spark_sql("bytes + 5 > 1.5 and temperature < 1e300", SCHEMA).sql
    assert "5L" in sql and "1.5D" in sql and "1E+300D" in sql and "try_add" in sql


def test_like_patterns_and_strings_are_reescaped_for_spark() -> None:
    assert like_pattern("a\\%b") == "a\\%b"
    assert like_pattern("a\\bc") == "abc"  # an escaped ordinary character is that character
    assert like_pattern("x\\") == "x\\\\"  # a trailing backslash is a literal backslash
    assert quote("it's a \\ test") == "'it\\'s a \\\\ test'"


@pytest.mark.parametrize(
    ("text", "feature"),
    [
        ("round(temperature, bytes) > 1", "round() with digits that are not a number literal"),
        ("inside_polygon(lat, lon, status)", "inside_polygon() with a polygon that is not a string literal"),
    ],
)
def test_what_spark_cannot_run_is_named(text: str, feature: str) -> None:
    compile_expr(text, SCHEMA, boolean=True)  # valid in the rule language
    with pytest.raises(
        SparkUnsupportedError, match=re.escape(feature) + ".* is not supported on the spark engine"
    ):
        to_spark_sql(text, SCHEMA)


def test_a_broken_polygon_literal_is_refused_when_the_rule_loads() -> None:
    with pytest.raises(ExpressionError, match="at least three"):
        to_spark_sql("inside_polygon(lat, lon, '1 2, 3 4')", SCHEMA)
