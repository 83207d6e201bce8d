"""Translate a rule expression into Spark SQL text with exactly the semantics of :mod:`app.rules.expr`.

Pure: no pyspark import. The Spark engine hands the text to ``F.expr``.

How each piece keeps the Python evaluator's meaning (the session runs with
ANSI mode on; see ``jobs/session.py``):

- NULL and three-valued logic are native in Spark SQL.
- Numbers: whole literals become ``BIGINT`` (``5L``), others ``DOUBLE``
  (``1.5D``), never Spark's default INT/DECIMAL literals. ``+ - * / %`` become
  ``try_add``/``try_subtract``/``try_multiply``/``try_divide``/``try_mod``:
  NULL on division or modulo by zero and on 64-bit overflow, ANSI errors never.
  Unary minus and ``abs`` of a BIGINT are NULL on overflow too.
- ``floor``/``ceil`` of a DOUBLE are NULL when the result does not fit in a
  BIGINT (ANSI mode would fail the query).
- ``round`` is Spark's ROUND (half up on the decimal value as written), on a
  DOUBLE; its digits must be a literal. ``length`` is cast to BIGINT.
- ``LIKE``/``ILIKE`` patterns are re-escaped from the rule language's form
  (``\\`` escapes any character) to Spark's (only ``\\%``, ``\\_``, ``\\\\``).
- ``distance_km``, ``inside_radius``, ``inside_polygon`` call the Python UDFs
  named in :data:`UDF_NAMES` (registered by ``jobs.udfs``), which wrap the very
  same functions; a polygon must be a valid string literal.

Anything the Spark engine cannot express raises :class:`SparkUnsupportedError`
naming the construct; callers prefix the rule id.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from app.errors import ExpressionError
from app.rules import functions as fn
from app.rules.expr import is_integer, parse
from app.rules.model import Rule

logger = logging.getLogger(__name__)

#: Rule-model fields the Spark engine implements (threshold rules).
SPARK_RULE_FIELDS = frozenset(
    {"id", "description", "source", "severity", "labels", "annotations", "group_by", "where", "for_ms"}
    | {"consecutive", "engine"}
)
UDF_NAMES: dict[str, str] = {
    "distance_km": "sa_distance_km",
    "inside_radius": "sa_inside_radius",
    "inside_polygon": "sa_inside_polygon",
}
_TRY: dict[type[exp.Expression], str] = {
    exp.Add: "try_add",
    exp.Sub: "try_subtract",
    exp.Mul: "try_multiply",
    exp.Div: "try_divide",
    exp.Mod: "try_mod",
}
_CMP: dict[type[exp.Expression], str] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
}
_NULL_ARG = {n: "CAST(NULL AS STRING)" for n in ("lower", "upper", "trim", "length")}
_UNIT_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}
_UNIT_MS["WEEK"] = 7 * _UNIT_MS["DAY"]
_LONG_LO, _LONG_HI = "-9.223372036854775808E18D", "9.223372036854775808E18D"
_NATIVE = {"lower", "upper", "trim", "coalesce", "greatest", "least", "floor", "ceil"}


class SparkUnsupportedError(ExpressionError):
    """The expression is valid but the Spark engine cannot run it."""


@dataclass(frozen=True)
class UdfCall:
    """One geo UDF call in a :class:`SparkExpr`: its SQL text (which occurs in the
    expression's), its arguments' SQL and its Spark result type. The geo functions are NULL
    in, NULL out, so a row with a NULL argument needs no call (``jobs.udfs.guarded``)."""

    sql: str
    args: tuple[str, ...]
    type: str


@dataclass(frozen=True)
class SparkExpr:
    """Spark SQL text, its rule-language type, the fields it reads, and its geo UDF calls
    (innermost first)."""

    sql: str
    type: str
    columns: frozenset[str]
    calls: tuple[UdfCall, ...] = ()


def quote(text: str) -> str:
    """A Spark SQL string literal whose value is exactly ``text`` (backslash escapes are on)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def like_pattern(pattern: str) -> str:
    """The rule language's LIKE pattern (``\\`` escapes the next character, a trailing
    ``\\`` is literal) rewritten for Spark's LIKE with its default escape ``\\``."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            literal = pattern[i + 1] if i + 1 < len(pattern) else "\\"
            out.append("\\" + literal if literal in "%_\\" else literal)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _double_literal(value: float) -> str:
    if math.isinf(value):
        return f"CAST('{'-' if value < 0 else ''}Infinity' AS DOUBLE)"
    return repr(value).upper().replace("INF", "Infinity") + "D"


class _Translator:
    def __init__(self, text: str, schema: Mapping[str, str], qualifier: str | None) -> None:
        self.text = text
        self.schema = schema
        self.prefix = f"`{qualifier}`." if qualifier else ""
        self.columns: set[str] = set()
        self.calls: list[UdfCall] = []

    def unsupported(self, what: str) -> SparkUnsupportedError:
        return SparkUnsupportedError(f"in {self.text!r}: {what} is not supported on the spark engine")

    def numeric(self, node: exp.Expression) -> tuple[str, str]:
        sql, t = self.sql(node)
        return ("CAST(NULL AS DOUBLE)", "double") if t == "null" else (sql, t)

    def boolean(self, node: exp.Expression) -> str:
        sql, t = self.sql(node)
        return "CAST(NULL AS BOOLEAN)" if t == "null" else sql

    def sql(self, node: exp.Expression) -> tuple[str, str]:
        if isinstance(node, exp.Paren):
            return self.sql(node.this)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return quote(str(node.this)), "string"
            text = str(node.this)
            if re.fullmatch(r"\d+", text):
                return f"{int(text)}L", "long"
            return _double_literal(float(text)), "double"
        if isinstance(node, exp.Boolean):
            return ("TRUE" if node.this else "FALSE"), "boolean"
        if isinstance(node, exp.Null):
            return "NULL", "null"
        if isinstance(node, exp.Column):
            name = ".".join(p.name for p in node.parts)
            if name not in self.schema:
                msg = f"in {self.text!r}: unknown field '{name}'"
                raise ExpressionError(msg)
            self.columns.add(name)
            return self.prefix + ".".join(f"`{p.name}`" for p in node.parts), self.schema[name]
        if isinstance(node, exp.Neg) and is_integer(node.this) and int(str(node.this.this)) == 2**63:
            return "(-9223372036854775807L - 1L)", "long"  # the least long: its magnitude is no long
        if isinstance(node, exp.Neg):
            x, t = self.numeric(node.this)
            return (f"try_subtract(0L, {x})" if t == "long" else f"(- {x})"), t
        if isinstance(node, exp.Not):
            return f"(NOT {self.boolean(node.this)})", "boolean"
        if isinstance(node, exp.And | exp.Or):
            op = "AND" if isinstance(node, exp.And) else "OR"
            return f"({self.boolean(node.this)} {op} {self.boolean(node.expression)})", "boolean"
        if type(node) in _CMP:
            (a, _), (b, _) = self.sql(node.this), self.sql(node.expression)
            return f"({a} {_CMP[type(node)]} {b})", "boolean"
        if type(node) in _TRY:
            (a, ta), (b, tb) = self.numeric(node.this), self.numeric(node.expression)
            t = "double" if isinstance(node, exp.Div) or "double" in (ta, tb) else "long"
            return f"{_TRY[type(node)]}({a}, {b})", t
        if isinstance(node, exp.In):
            x, _ = self.sql(node.this)
            items = ", ".join(self.sql(i)[0] for i in node.expressions)
            return f"({x} IN ({items}))", "boolean"
        if isinstance(node, exp.Between):
            x, lo, hi = (self.sql(node.args[k])[0] for k in ("this", "low", "high"))
            return f"({x} BETWEEN {lo} AND {hi})", "boolean"
        if isinstance(node, exp.Like | exp.ILike):
            x, _ = self.sql(node.this)
            pattern = node.expression
            if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                msg = f"in {self.text!r}: LIKE needs a string literal pattern"
                raise ExpressionError(msg)
            op = "ILIKE" if isinstance(node, exp.ILike) else "LIKE"
            return f"({x} {op} {quote(like_pattern(str(pattern.this)))})", "boolean"
        if isinstance(node, exp.Is):
            return f"({self.sql(node.this)[0]} IS NULL)", "boolean"
        if isinstance(node, exp.Interval):
            unit = node.args["unit"].name.upper()
            return f"{int(str(node.this.this)) * _UNIT_MS[unit]}L", "interval"
        if isinstance(node, exp.Func):
            return self.function(node)
        msg = f"the SQL construct {node.key.upper()}"
        raise self.unsupported(msg)

    def function(self, node: exp.Func) -> tuple[str, str]:
        name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
        spec = fn.FUNCTIONS.get(name)
        if spec is None:
            msg = f"function {name}()"
            raise self.unsupported(msg)
        args = fn.call_args(node)
        if name == "round":
            return self.round(args)
        if name == "inside_polygon":
            self.polygon(args[2])
        parts = [self.sql(a) for a in args]
        types = [t for _, t in parts]
        try:
            result = spec.check(types)
        except TypeError as exc:
            msg = f"in {self.text!r}: {name}(): {exc}"
            raise ExpressionError(msg) from None
        null = "NULL" if name == "coalesce" else _NULL_ARG.get(name, "CAST(NULL AS DOUBLE)")
        sqls = [null if t == "null" else s for s, t in parts]
        if name in UDF_NAMES:
            call = f"{UDF_NAMES[name]}({', '.join(sqls)})"
            self.calls.append(UdfCall(call, tuple(sqls), "boolean" if result == "boolean" else "double"))
            return call, result
        if name == "abs":
            x = sqls[0]
            sql = (
                f"(CASE WHEN {x} < 0L THEN try_subtract(0L, {x}) ELSE {x} END)"
                if types[0] == "long"
                else f"abs({x})"
            )
            return sql, result
        if name == "length":
            return f"CAST(length({sqls[0]}) AS BIGINT)", result
        if name in ("floor", "ceil") and types[0] != "long":
            x = sqls[0]  # NULL, not an ANSI overflow error, when the result does not fit in a BIGINT
            return f"(CASE WHEN {x} >= {_LONG_LO} AND {x} < {_LONG_HI} THEN {name}({x}) END)", result
        if name in _NATIVE:
            return f"{name}({', '.join(sqls)})", result
        msg = f"function {name}()"
        raise self.unsupported(msg)

    def round(self, args: list[exp.Expression]) -> tuple[str, str]:
        x, t = self.numeric(args[0])
        digits = 0
        if len(args) > 1:
            d = args[1]
            negative = isinstance(d, exp.Neg)
            lit = d.this if negative else d
            if isinstance(lit, exp.Null):
                return "CAST(NULL AS DOUBLE)", "double"
            if not (isinstance(lit, exp.Literal) and not lit.is_string):
                msg = "round() with digits that are not a number literal"
                raise self.unsupported(msg)
            digits = int(float(str(lit.this))) * (-1 if negative else 1)
        value = f"CAST({x} AS DOUBLE)" if t == "long" else x
        return f"round({value}, {digits})", "double"

    def polygon(self, arg: exp.Expression) -> None:
        if not (isinstance(arg, exp.Literal) and arg.is_string):
            msg = "inside_polygon() with a polygon that is not a string literal"
            raise self.unsupported(msg)
        try:
            fn.parse_polygon(str(arg.this))
        except ValueError as exc:
            msg = f"in {self.text!r}: inside_polygon(): {exc}"
            raise SparkUnsupportedError(msg) from None


def to_spark_sql(text: str, schema: Mapping[str, str], qualifier: str | None = None) -> SparkExpr:
    """Translate ``text`` (already accepted by :func:`app.rules.expr.compile_expr`
    against ``schema``) to Spark SQL; field ``f`` becomes `` `f` ``, or
    `` `qualifier`.`f` `` to read it from a struct column. Raises
    :class:`SparkUnsupportedError` for what Spark cannot run."""
    tr = _Translator(text, schema, qualifier)
    sql, t = tr.sql(parse(text))
    return SparkExpr(sql=sql, type=t, columns=frozenset(tr.columns), calls=tuple(tr.calls))


def keyed_problems(rule: Rule, schema: Mapping[str, str]) -> list[str]:
    """Why ``rule`` cannot take the Spark engine's *keyed* path (empty: it can).

    The keyed path runs threshold rules per (rule, group) with the condition
    as native Spark SQL and no event-time clock. Any rule-model field outside
    :data:`SPARK_RULE_FIELDS` set to a non-default value sends the rule to the
    *stream* path instead (the evaluator's own per-partition stream), so a
    feature added to the model is never silently ignored.
    """
    kind = getattr(rule, "kind", "threshold")
    if kind != "threshold":
        return [f"{kind} rules need the event-time clock"]
    problems = []
    for name, info in type(rule).model_fields.items():
        if name in SPARK_RULE_FIELDS:
            continue
        if getattr(rule, name) != info.get_default(call_default_factory=True):
            problems.append(f"'{info.alias or name}' needs the stream path")
    if rule.where is not None:
        try:
            to_spark_sql(rule.where, schema)
        except ExpressionError as exc:
            problems.append(str(exc))
    return problems


def spark_problems(rule: Rule) -> list[str]:
    """Why ``rule`` cannot run on the Spark engine at all (empty: it can).

    Every kind and feature runs today (see ``jobs.compile``): ``expect_from`` too, on the
    stream path, whose evaluator reads the registry. This is the one place where a feature
    the Spark engine cannot run would be named, so that it is refused at load, never ignored.
    """
    del rule
    return []
