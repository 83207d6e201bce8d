"""The geo functions as Spark SQL functions: Python UDFs over the very same code as the Faust engine.

:mod:`app.rules.spark_sql` translates ``distance_km(...)``, ``inside_radius(...)``
and ``inside_polygon(...)`` into calls of the names in
:data:`app.rules.spark_sql.UDF_NAMES`; :func:`register` binds those names to
the function specs of :mod:`app.rules.functions` (same NULL-in/NULL-out
contract, same geopy geodesic), so both engines give bit-identical results.
Everything else in a rule condition is native Spark SQL.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DataType, DoubleType

from app.rules import functions as fn
from app.rules.spark_sql import UDF_NAMES, UdfCall

logger = logging.getLogger(__name__)

_SIGNATURES: dict[str, tuple[list[str], DataType]] = {
    "distance_km": (["double"] * 4, DoubleType()),
    "inside_radius": (["double"] * 5, BooleanType()),
    "inside_polygon": (["double", "double", "string"], BooleanType()),
}


@functools.cache
def _built(name: str) -> Callable[[tuple[Any, ...]], Any]:
    """The function spec built over a tuple of arguments, once per process."""
    types, _ = _SIGNATURES[name]
    return fn.FUNCTIONS[name].build([itemgetter(i) for i in range(len(types))], types)


def python_function(name: str) -> Callable[..., Any]:
    """The whitelisted function ``name`` as a plain positional Python function.

    It captures only ``name`` and builds the function in the process that calls it: Spark
    pickles the UDF to its Python workers, and the built function may be compiled code
    (:mod:`app.runtime.native`), which pickle cannot carry.
    """

    def udf(*args: Any) -> Any:
        return _built(name)(args)

    udf.__name__ = UDF_NAMES[name]
    return udf


def register(spark: SparkSession) -> None:
    """Register every geo UDF on ``spark`` (idempotent)."""
    for name, (_, return_type) in _SIGNATURES.items():
        spark.udf.register(UDF_NAMES[name], python_function(name), return_type)


def guarded(df: DataFrame, sqls: Sequence[str], calls: Sequence[UdfCall]) -> tuple[DataFrame, list[str]]:
    """``df`` with a column per distinct geo UDF call of ``sqls``, and ``sqls`` reading those
    columns instead of calling: the calls run only on the rows that can give a value.

    Spark evaluates a Python UDF on every row of its input, also where a ``CASE`` or a NULL
    argument makes the result NULL: a fleet's geofence rule called geopy, through the
    Python worker, on every machine's event without coordinates. The geo functions are NULL
    in, NULL out, so a row on which every call has a NULL argument (an argument that holds no
    call; the others are not tested) takes NULL for all of them without a call; the other
    rows call them all. Two filtered branches of ``df``, so ``df`` is read twice: use this on
    a cached input, not on a stream."""
    out = list(sqls)
    distinct = {c.sql: c for c in calls if any(c.sql in s for s in out)}
    used = sorted(distinct.values(), key=lambda c: -len(c.sql))
    if not used:
        return df, out
    udf_names = tuple(f"{n}(" for n in UDF_NAMES.values())
    givens = []
    for c in used:
        plain = [a for a in c.args if not any(n in a for n in udf_names)]
        givens.append(" AND ".join(f"({a}) IS NOT NULL" for a in plain) if plain else "TRUE")
    given = " OR ".join(f"({g})" for g in givens)
    names = [f"__udf{i}" for i in range(len(used))]
    called = df.where(given).select("*", *(F.expr(c.sql).alias(n) for c, n in zip(used, names, strict=True)))
    nulls = df.where(f"NOT ({given})").select(
        "*", *(F.lit(None).cast(c.type).alias(n) for c, n in zip(used, names, strict=True))
    )
    for c, n in zip(used, names, strict=True):  # the longest first: an outer call holds its inner ones
        out = [s.replace(c.sql, f"`{n}`") for s in out]
    return called.unionByName(nulls), out
