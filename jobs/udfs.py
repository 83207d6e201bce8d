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
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import BooleanType, DataType, DoubleType

from app.rules import functions as fn
from app.rules.spark_sql import UDF_NAMES

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
