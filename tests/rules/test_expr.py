"""The SQL-subset compiler: Spark NULL semantics, type checks, and refusal of anything else."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from geopy.distance import geodesic

from app.errors import ExpressionError
from app.events import SENSORS
from app.rules.expr import compile_expr
from app.rules.functions import distance_km

SCHEMA = {
    **SENSORS.all_fields(),
    "device.max_temp": "double",
    "device.depot_lat": "double",
    "device.depot_lon": "double",
}


def ev(text: str, **row: Any) -> Any:
    return compile_expr(text, SCHEMA, boolean=True)(row)


@pytest.mark.parametrize(
    ("text", "row", "want"),
    [
        ("temperature > 100", {"temperature": 100.5}, True),
        ("temperature > 100", {"temperature": None}, None),
        ("temperature > 1 and status = 'x'", {"temperature": 2.0}, None),
        ("temperature > 1 and status = 'x'", {"temperature": 0.0}, False),
        ("temperature > 1 or status = 'x'", {"temperature": 2.0}, True),
        ("not (temperature > 1)", {}, None),
        ("status in ('a', 'b')", {"status": "b"}, True),
        ("status in ('a', null)", {"status": "b"}, None),
        ("status not in ('a')", {"status": "b"}, True),
        ("temperature between 1 and 2", {"temperature": 2.0}, True),
        ("status like 'er_o%'", {"status": "error"}, True),
        ("status like 'a\\%'", {"status": "a%"}, True),
        ("status is null", {}, True),
        ("temperature / 0 > 1", {"temperature": 1.0}, None),
        ("-7 % 3 = -1", {}, True),
        ("round(temperature, 1) = 2.5", {"temperature": 2.45}, True),
        ("coalesce(battery, 100) >= 100", {}, True),
        ("least(temperature, humidity) = 3", {"temperature": None, "humidity": 3.0}, True),
        ("inside_polygon(lat, lon, '0 0, 0 10, 10 10, 10 0')", {"lat": 5.0, "lon": 5.0}, True),
        ("inside_polygon(lat, lon, '0 0, 0 10, 10 10, 10 0')", {"lat": 15.0, "lon": 5.0}, False),
    ],
)
def test_semantics(text: str, row: dict[str, Any], want: Any) -> None:
    assert ev(text, **row) is want


def test_long_overflow_gives_null() -> None:
    assert ev("9223372036854775807 + 1 > 0") is None


def test_distance_uses_geodesic_km() -> None:
    # Berlin -> Potsdam is about 26-27 km
    d = distance_km(52.52, 13.405, 52.39, 13.065)
    assert 25 < d < 28
    assert (
        ev(
            "distance_km(lat, lon, device.depot_lat, device.depot_lon) > 5",
            lat=52.52,
            lon=13.405,
            **{"device.depot_lat": 52.39, "device.depot_lon": 13.065},
        )
        is True
    )


def test_distance_is_geopys_geodesic_to_the_bit() -> None:
    """distance_km reuses one geodesic; the Spark UDFs and the backtests must agree with a
    fresh ``geodesic(a, b).km`` exactly, across the globe (antipodes, poles, the date line)."""
    rng = random.Random(7)  # noqa: S311 (a reproducible test input)
    pairs = [((rng.uniform(-90, 90), rng.uniform(-180, 180)), (rng.uniform(-90, 90), rng.uniform(-180, 180)))
             for _ in range(300)]  # fmt: skip
    pairs += [((0.0, 0.0), (0.0, 180.0)), ((90.0, 0.0), (-90.0, 0.0)), ((10.0, 179.9), (10.0, -179.9))]
    pairs += [((52.52, 13.405), (52.52, 13.405))]
    for (lat1, lon1), (lat2, lon2) in pairs:
        assert distance_km(lat1, lon1, lat2, lon2) == geodesic((lat1, lon1), (lat2, lon2)).km
    assert distance_km(91.0, 0.0, 0.0, 0.0) is None


def test_columns_are_reported() -> None:
    c = compile_expr("temperature > device.max_temp and status = 'ok'", SCHEMA, boolean=True)
    assert c.columns == {"temperature", "device.max_temp", "status"}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("temprature > 1", "did you mean 'temperature'"),
        ("status > 1", "cannot compare string with long"),
        ("temperature", "expected a condition"),
        ("count(*) > 1", "belongs in 'aggregate:'"),
        ("eval('1')", "not allowed"),
        ("__import__('os') = 1", "not allowed"),
        ("1; drop table t", "not a single expression"),
        ("(select 1) > 0", "unsupported SQL construct"),
        ("temperature > 1d", "only allowed as a function argument"),
        ("status like lower(status)", "string literal pattern"),
        ("abs('x') > 1", "must be a number"),
        (" or ".join(["temperature > 1"] * 100), "nodes; the limit is"),
    ],
)
def test_rejections(text: str, fragment: str) -> None:
    with pytest.raises(ExpressionError, match=None) as info:
        compile_expr(text, SCHEMA, boolean=True)
    assert fragment in str(info.value)


COLUMN_WISE = [
    "temperature > 100",
    "temperature > 1 and status = 'x'",
    "temperature > 1 or status = 'x'",
    "not (temperature > 1) or temperature is null",
    "temperature >= 2 and temperature <= 2.0 and temperature != 3 and temperature < 9 and temperature = 2",
    "status is not null and (status in ('a', 'b') or status like 'er%')",
    "temperature between 1 and 2 and not (battery < 5)",
    "temperature > device.max_temp",
    "coalesce(battery, 100) >= 100 or humidity > 50",
]
ROWS: list[dict[str, Any]] = [
    {"temperature": t, "status": s, "battery": b, "humidity": h, "device.max_temp": m}
    for t in (None, 0.0, 1.5, 2, 2.0, 100.5)
    for s in (None, "x", "b", "error")
    for b, h, m in ((None, None, None), (3, 60.0, 1.0), (50, 10.0, 99.0))
]


@pytest.mark.parametrize("text", COLUMN_WISE)
def test_column_wise_gives_the_row_wise_values(text: str) -> None:
    c = compile_expr(text, SCHEMA, boolean=True)
    assert c.many is not None
    columns: dict[str, list[Any]] = {}
    got = c.over(ROWS, columns)
    want = [c.fn(r) for r in ROWS]
    assert [(type(v), v) for v in got] == [(type(v), v) for v in want]
    assert {True, False} <= set(want)  # both outcomes are exercised


def test_column_wise_reads_each_field_once_per_batch() -> None:
    columns: dict[str, list[Any]] = {}
    first = compile_expr("temperature > 1 and status is null", SCHEMA).over(ROWS, columns)
    assert set(columns) == {"temperature", "status"}
    columns["temperature"] = [5.0] * len(ROWS)  # the cache is what the next condition reads
    assert compile_expr("temperature > 1", SCHEMA).over(ROWS, columns) == [True] * len(ROWS)
    assert first.count(True) == sum(1 for r in ROWS if r["status"] is None and (r["temperature"] or 0) > 1)


def test_column_wise_that_raises_is_redone_row_by_row() -> None:
    c = compile_expr("temperature > 1", SCHEMA, boolean=True)

    def broken(rows: Any, cols: Any) -> list[Any]:
        raise TypeError("a row the row-wise form never reaches")

    assert replace(c, many=broken).over([{"temperature": 2.0}, {}], {}) == [True, None]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("temperature", "temperature"),
        ("(temperature)", "temperature"),
        ("device.max_temp", "device.max_temp"),
        ("temperature + 1", None),
        ("abs(temperature)", None),
        ("coalesce(temperature, 0)", None),
    ],
)
def test_a_bare_field_names_its_column(text: str, field: str | None) -> None:
    """What a window's fold may read from the batch's shared columns (_Aggregating.fold_range)."""
    assert compile_expr(text, SCHEMA).field == field
