"""A safe SQL expression subset, parsed with sqlglot and compiled to Python closures.

Operators write conditions such as ``temperature >= 30 and site = 'lab-2'``.
The text is parsed (never evaluated), every node is checked against a
whitelist, every identifier against the source schema, and the tree is
compiled to nested closures over a row mapping.

NULL semantics follow Spark SQL: comparisons and arithmetic with NULL give
NULL; AND/OR/NOT use three-valued logic; ``x IN (...)`` is NULL when ``x`` is
NULL or when nothing matched and the list holds a NULL; division or modulo by
zero and long overflow give NULL (Spark's ``try_*`` functions, which the Spark
engine uses). A ``where`` clause passes only when the result is TRUE.

Durations such as ``1d`` or ``15m`` are allowed as function arguments and
become ``INTERVAL`` literals (milliseconds in Python).
"""

from __future__ import annotations

import difflib
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from app.errors import ExpressionError
from app.rules import functions as fn

logger = logging.getLogger(__name__)

Row = Mapping[str, Any]
Eval = Callable[[Row], Any]
#: Column-wise evaluation: ``many(rows, columns)`` gives the value for each row, in order;
#: ``columns`` caches each field's values across the expressions of one batch.
Columns = dict[str, list[Any]]
Many = Callable[[Sequence[Row], Columns], list[Any]]

MAX_TEXT = 4096
MAX_NODES = 256
#: how deep parentheses, brackets, function calls, CASE and prefix operators may nest: sqlglot's
#: parser recurses ~20 Python frames a level, and runs out of stack (1,000 frames) at ~45
MAX_DEPTH = 20
MAX_IN_LIST = 1000
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
NUMERIC = frozenset({"long", "double"})

_DURATION_TOKEN = re.compile(r"(?<![\w.'])(\d+)(ms|s|m|h|d|w)(?![\w'])")
_UNIT_WORDS = {"ms": "MILLISECOND", "s": "SECOND", "m": "MINUTE", "h": "HOUR", "d": "DAY", "w": "WEEK"}
_UNIT_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}
_UNIT_MS["WEEK"] = 7 * _UNIT_MS["DAY"]


#: Resolves a stateful function call (``pct_change(x, 1d)``, ``prev(n)``) to the
#: name and type of a synthetic column the evaluator computes and puts in the row.
#: Raises ValueError with the expected form when the call is malformed.
Synthetic = Callable[[str, list[exp.Expression]], "tuple[str, str] | None"]


@dataclass(frozen=True)
class Compiled:
    """A compiled expression: call ``fn(row)``; ``type`` is its SQL type.

    ``columns`` are the fields it reads; ``synthetic`` the computed columns
    (see :data:`Synthetic`) the caller must provide in the row.
    """

    fn: Eval
    type: str
    text: str
    columns: frozenset[str]
    synthetic: frozenset[str] = frozenset()
    #: the same expression column-wise (see :data:`Many`), for a batch of rows at once
    many: Many | None = None
    #: the field it reads when the expression is just that field (its column can be shared)
    field: str | None = None

    def __call__(self, row: Row) -> Any:
        return self.fn(row)

    def over(self, rows: Sequence[Row], columns: Columns) -> list[Any]:
        """The value for each of ``rows``: exactly ``[fn(row) for row in rows]``."""
        if self.many is not None:
            try:
                return self.many(rows, columns)
            except Exception:  # noqa: S110 - a row the row-wise form would never reach; redo row by row
                pass
        fn = self.fn
        return [fn(r) for r in rows]


def _string_end(text: str, start: int) -> tuple[int, int]:
    """Where the string literal opened by the quote at ``start`` ends, as the regex
    ``'(?:[^'\\\\]|\\\\.|'')*'`` matches it: ``(end, resume)``, ``end`` the index of its
    closing quote or -1 when it has none, and ``resume`` where to look for the next quote.

    In linear time: the regex tries again from every quote its scan passed, each time to
    the end of the text (quadratic on ``\\'\\'\\'...``), where this scan knows those
    attempts fail the same way. A ``''`` is an escaped quote, unless the literal has no
    other end: then the regex backtracks to close it at the last ``''``'s first quote.
    """
    n = len(text)
    i, last_pair = start + 1, -1
    while i < n:
        c = text[i]
        if c == "'":
            if i + 1 < n and text[i + 1] == "'":
                last_pair = i
                i += 2
                continue
            return i, i + 1
        if c == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                i += 2
                continue
            break
        i += 1
    if last_pair >= 0:
        return last_pair, last_pair + 1
    return -1, i


def split_strings(text: str) -> list[str]:
    """``re.split(r"('(?:[^'\\\\]|\\\\.|'')*')", text)``: the text outside string literals at
    even indexes, the literals (quotes included) at odd ones; see :func:`_string_end`."""
    parts: list[str] = []
    done = pos = 0
    while (start := text.find("'", pos)) != -1:
        end, pos = _string_end(text, start)
        if end != -1:
            parts += [text[done:start], text[start : end + 1]]
            done = pos
    parts.append(text[done:])
    return parts


#: one duration the rewrite replaced: (start, end) in the rewritten text, then in the original
Span = tuple[int, int, int, int]


def _rewrite(text: str) -> tuple[str, list[Span]]:
    """:func:`rewrite_durations`, and where each ``INTERVAL`` it wrote came from."""
    out: list[str] = []
    spans: list[Span] = []
    at = size = 0  # where the next part starts in ``text``, and in the rewritten text
    for i, part in enumerate(split_strings(text)):
        done = 0
        for m in _DURATION_TOKEN.finditer(part) if i % 2 == 0 else ():
            interval = f"INTERVAL '{m.group(1)}' {_UNIT_WORDS[m.group(2)]}"
            size += m.start() - done
            spans.append((size, size + len(interval), at + m.start(), at + m.end()))
            out += [part[done : m.start()], interval]
            size += len(interval)
            done = m.end()
        out.append(part[done:])
        size += len(part) - done
        at += len(part)
    return "".join(out), spans


def rewrite_durations(text: str) -> str:
    """Turn ``15m`` into ``INTERVAL '15' MINUTE`` outside string literals."""
    return _rewrite(text)[0]


def _original_offset(spans: list[Span], offset: int) -> int:
    """Where ``offset`` of the rewritten text is in the original: inside an ``INTERVAL``, the
    duration it came from."""
    shift = 0
    for start, end, text_start, text_end in spans:
        if offset < start:
            break
        if offset < end:
            return text_start
        shift = end - text_end
    return offset - shift


_OPENS = frozenset({TokenType.L_PAREN, TokenType.L_BRACKET, TokenType.L_BRACE, TokenType.CASE})
_CLOSES = frozenset({TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.R_BRACE, TokenType.END})
_PREFIX = frozenset({TokenType.NOT, TokenType.DASH, TokenType.PLUS, TokenType.TILDE})
#: tokens after which ``-``, ``+`` and ``~`` are binary operators
_OPERANDS = frozenset(
    {TokenType.VAR, TokenType.IDENTIFIER, TokenType.NUMBER, TokenType.STRING, TokenType.NULL}
    | {TokenType.TRUE, TokenType.FALSE} | _CLOSES
)  # fmt: skip


def nesting(tokens: list[Token]) -> int:
    """How deep an expression nests, from its tokens alone (before sqlglot's parser
    recurses into it): each bracket, function call or CASE adds a level, and so does each
    prefix operator (NOT, unary ``-``, ``+``, ``~``) applied to what follows it."""
    outer: list[int] = []
    depth = pending = deepest = 0
    previous: TokenType | None = None
    for token in tokens:
        kind = token.token_type
        if kind in _OPENS:
            outer.append(depth)
            depth += pending + 1
            pending = 0
        elif kind in _CLOSES:
            depth = outer.pop() if outer else depth
            pending = 0
        elif kind in _PREFIX and (kind == TokenType.NOT or previous not in _OPERANDS):
            pending += 1
        else:
            pending = 0
        deepest = max(deepest, depth + pending)
        previous = kind
    return deepest


_SPARK = Dialect.get_or_raise("spark")
_TOO_DEEP = (
    f"expression nests more than {MAX_DEPTH} levels deep, the limit "
    "(each parenthesis, bracket, function call, CASE, NOT and unary minus is a level)"
)


#: the quotes and comments that the tokenizer fails on when one is not closed
_OPENERS = ("'", '"', "`", "/*")


def _syntax_problem(sql: str, spans: list[Span], exc: ParseError | TokenError) -> str:
    """sqlglot's complaint in the rule language's words, with the 1-based character of the
    expression as the operator wrote it where the parser says where it stopped."""
    if isinstance(exc, TokenError):
        if any(opener in sql for opener in _OPENERS):
            return "a quote (', \" or `) or a /* comment is not closed"
        return str(exc).splitlines()[0]
    error = exc.errors[0] if exc.errors else {}
    described = str(error.get("description") or str(exc).splitlines()[0])
    token = str(error.get("highlight") or "")
    line, col = error.get("line"), error.get("col")
    where = ""
    if token and isinstance(line, int) and isinstance(col, int) and line >= 1:
        # the parser gives the highlighted token's last character, as line and column
        offset = sum(len(text) + 1 for text in sql.split("\n")[: line - 1]) + col - len(token)
        where = f" (character {_original_offset(spans, max(offset, 0)) + 1})"
    if described.startswith("Required keyword:"):
        if "Between" in described:
            return f"BETWEEN needs both bounds, as in 'x BETWEEN 1 AND 5'{where}"
        return f"{token!r} needs a value after it{where}"
    if described.startswith("Expecting )"):
        return f"a '(' is not closed: expected ')' after {token!r}{where}"
    if described.startswith("Expected END"):
        return f"CASE needs an END{where}"
    if "Unexpected token" in described:
        return f"unexpected {token!r}{where}"
    return f"{described}{where}"


def _comment_problem(text: str, comment: str) -> str:
    """Why an expression with an SQL comment is refused: ``--`` and ``/* */`` would silently
    cut it (``battery < 20--5`` read as ``battery < 20``, ``t > 100 -- AND h > 90`` as
    ``t > 100``); YAML's ``#`` comments a rule."""
    return (
        f"{text!r} holds an SQL comment ({comment.strip()[:40]!r} after '--' or inside '/* */'), "
        "which would cut the expression: comment with YAML's '#' after the value, and write "
        "a minus before a negative number with a space ('20 - -5')"
    )


def parse(text: str) -> exp.Expression:
    """Parse one expression; raise ExpressionError on anything else."""
    if not isinstance(text, str) or not text.strip():
        msg = "expected a SQL expression, got an empty value"
        raise ExpressionError(msg)
    if len(text) > MAX_TEXT:
        msg = f"expression is longer than {MAX_TEXT} characters"
        raise ExpressionError(msg)
    sql, spans = _rewrite(text)
    try:
        tokens = _SPARK.tokenize(sql)
        if nesting(tokens) > MAX_DEPTH:
            raise ExpressionError(_TOO_DEEP)
        commented = next((t for t in tokens if t.comments), None)
        if commented is not None:
            raise ExpressionError(_comment_problem(text, commented.comments[0]))
        result = _SPARK.parser().parse(tokens, sql)
    except (ParseError, TokenError) as exc:
        raise ExpressionError(f"cannot parse {text!r}: {_syntax_problem(sql, spans, exc)}") from None
    except RecursionError:  # a nesting that nesting() does not count: the same answer
        raise ExpressionError(_TOO_DEEP) from None
    if not result or result[0] is None:
        msg = f"cannot parse {text!r}: no expression"
        raise ExpressionError(msg)
    tree = result[0]
    if (
        len(result) > 1
        or not isinstance(tree, exp.Expression)
        or isinstance(tree, exp.Block | exp.Query | exp.Command)
    ):
        msg = f"{text!r} is not a single expression"
        raise ExpressionError(msg)
    count = sum(1 for _ in tree.walk())
    if count > MAX_NODES:
        msg = f"expression has {count} nodes; the limit is {MAX_NODES}"
        raise ExpressionError(msg)
    return tree


def _column_name(node: exp.Column) -> str:
    parts = [p.name for p in node.parts]
    return ".".join(parts)


def _long_or_none(v: int) -> int | None:
    return v if _LONG_MIN <= v <= _LONG_MAX else None


def _arith(op: str, ta: str, tb: str) -> tuple[Callable[[Any, Any], Any], str]:
    both_long = ta == "long" and tb == "long"
    if op == "add":
        return ((lambda a, b: _long_or_none(a + b)) if both_long else (lambda a, b: a + b)), (
            "long" if both_long else "double"
        )
    if op == "sub":
        return ((lambda a, b: _long_or_none(a - b)) if both_long else (lambda a, b: a - b)), (
            "long" if both_long else "double"
        )
    if op == "mul":
        return ((lambda a, b: _long_or_none(a * b)) if both_long else (lambda a, b: a * b)), (
            "long" if both_long else "double"
        )
    if op == "div":  # Spark divides as doubles, even two longs
        return (lambda a, b: None if b == 0 else float(a) / float(b)), "double"
    # mod: the sign follows the dividend, as in Spark/Java
    return (lambda a, b: None if b == 0 else fn.sql_mod(a, b)), ("long" if both_long else "double")


_ARITH: dict[type[exp.Expression], str] = {
    exp.Add: "add",
    exp.Sub: "sub",
    exp.Mul: "mul",
    exp.Div: "div",
    exp.Mod: "mod",
}
_CMP: dict[type[exp.Expression], Callable[[Any, Any], bool]] = {
    exp.EQ: lambda a, b: a == b,
    exp.NEQ: lambda a, b: a != b,
    exp.GT: lambda a, b: a > b,
    exp.GTE: lambda a, b: a >= b,
    exp.LT: lambda a, b: a < b,
    exp.LTE: lambda a, b: a <= b,
}


#: the comparisons a distance is compared by without always measuring the geodesic
_CMP_SIGN: dict[type[exp.Expression], str] = {exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}
#: ``x <op> y`` is ``y <flipped op> x``
_FLIPPED = {">": "<", ">=": "<=", "<": ">", "<=": ">="}


def _call_of(node: exp.Expression, name: str) -> exp.Func | None:
    """``node``, out of any parentheses, when it is a call of the function ``name``."""
    while isinstance(node, exp.Paren):
        node = node.this
    if (
        isinstance(node, exp.Func)
        and (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower() == name
    ):
        return node
    return None


_BITWISE: dict[type[exp.Expression], str] = {
    exp.BitwiseAnd: "&", exp.BitwiseOr: "|", exp.BitwiseXor: "^", exp.BitwiseNot: "~",
    exp.BitwiseLeftShift: "<<", exp.BitwiseRightShift: ">>",
}  # fmt: skip


def is_integer(node: exp.Expression) -> bool:
    """Whether ``node`` is an integer literal (digits alone: no point, no exponent)."""
    return isinstance(node, exp.Literal) and not node.is_string and str(node.this).isdecimal()


def _unsupported(node: exp.Expression) -> str:
    """Why a parsed construct is not in the rule language, in its words where a usual slip
    gives it: a word after a whole expression parses as an alias, ``> >`` as a shift."""
    if isinstance(node, exp.Alias):
        return (
            f"{node.this.sql(dialect='spark')!r} is followed by {node.alias!r}: "
            "an operator missing, or a misspelt AND, OR or NOT?"
        )
    if type(node) in _BITWISE:
        return f"the bitwise operator {_BITWISE[type(node)]!r} is not supported"
    return f"unsupported SQL construct {node.key.upper()} ({node.sql(dialect='spark')!r})"


class _Compiler:
    def __init__(
        self,
        text: str,
        schema: Mapping[str, str],
        allow_intervals: bool,
        synthetic: Synthetic | None,
        check_literals: bool = False,
    ) -> None:
        self.text = text
        self.schema = schema
        self.columns: set[str] = set()
        self.synthetic_cols: set[str] = set()
        self.allow_intervals = allow_intervals
        self.synthetic = synthetic
        self.check_literals = check_literals

    def fail(self, message: str) -> ExpressionError:
        return ExpressionError(f"in {self.text!r}: {message}")

    def compile(self, node: exp.Expression) -> tuple[Eval, str]:
        if isinstance(node, exp.Paren):
            return self.compile(node.this)
        if isinstance(node, exp.Literal):
            return self._literal(node)
        if isinstance(node, exp.Neg) and is_integer(node.this):  # -9223372036854775808 is a long
            return self._literal(node.this, negative=True)
        if isinstance(node, exp.Boolean):
            value = bool(node.this)
            return (lambda _r: value), "boolean"
        if isinstance(node, exp.Null):
            return (lambda _r: None), "null"
        if isinstance(node, exp.Column):
            return self._column(node)
        if isinstance(node, exp.Neg):
            inner, t = self._numeric(node.this, "unary minus")
            if t == "long":  # -LONG_MIN does not fit: NULL
                return (lambda r: None if (v := inner(r)) is None else _long_or_none(-v)), t
            return (lambda r: None if (v := inner(r)) is None else -v), t
        if isinstance(node, exp.Not):
            inner, _ = self._boolean(node.this, "NOT")
            return (lambda r: None if (v := inner(r)) is None else not v), "boolean"
        if isinstance(node, exp.And | exp.Or):
            return self._logic(node)
        if type(node) in _CMP:
            return self._compare(node)
        if type(node) in _ARITH:
            a, ta = self._numeric(node.this, "arithmetic")
            b, tb = self._numeric(node.expression, "arithmetic")
            op, t = _arith(_ARITH[type(node)], ta, tb)
            return (lambda r: None if (x := a(r)) is None or (y := b(r)) is None else op(x, y)), t
        if isinstance(node, exp.In):
            return self._in(node)
        if isinstance(node, exp.Between):
            return self._between(node)
        if isinstance(node, exp.Like | exp.ILike):
            return self._like(node)
        if isinstance(node, exp.Is):
            if not isinstance(node.expression, exp.Null):
                raise self.fail("IS is only supported as IS NULL / IS NOT NULL")
            inner, _ = self.compile(node.this)
            return (lambda r: inner(r) is None), "boolean"
        if isinstance(node, exp.Interval):
            return self._interval(node)
        if isinstance(node, exp.Cast):  # CAST, TRY_CAST and '::', a function to sqlglot
            raise self.fail(
                "casts are not supported: a field has its schema's type, and long and double "
                "compare and compute together"
            )
        if isinstance(node, exp.Func):
            return self._function(node)
        raise self.fail(_unsupported(node))

    def _literal(self, node: exp.Expression, negative: bool = False) -> tuple[Eval, str]:
        if isinstance(node, exp.Literal) and node.is_string:
            s = str(node.this)
            return (lambda _r: s), "string"
        text = str(node.this)
        if is_integer(node):
            iv = -int(text) if negative else int(text)
            if not _LONG_MIN <= iv <= _LONG_MAX:
                written = ("-" if negative else "") + text
                raise self.fail(
                    f"the integer {written}{self._at(node, negative)} is outside the 64-bit range, "
                    f"{_LONG_MIN} to {_LONG_MAX}; write {written}.0 for a double"
                )
            return (lambda _r: iv), "long"
        try:
            fv = float(text)
        except ValueError:
            raise self.fail(f"bad number {text!r}{self._at(node)}") from None
        if not math.isfinite(fv):
            at = self._at(node)
            raise self.fail(f"number {text}{at} is out of a double's range (it would be infinite)")
        return (lambda _r: fv), "double"

    def _at(self, node: exp.Expression, signed: bool = False) -> str:
        """`` (character N)``: where ``node`` starts in the expression as written, at the minus
        sign before it when ``signed``; empty when the parser does not say."""
        start = node.meta.get("start")
        if not isinstance(start, int):
            return ""
        at = _original_offset(_rewrite(self.text)[1], start)
        if signed:
            before = self.text[:at].rstrip()
            at = len(before) - 1 if before.endswith("-") else at
        return f" (character {at + 1})"

    def _column(self, node: exp.Column) -> tuple[Eval, str]:
        name = _column_name(node)
        ftype = self.schema.get(name)
        if ftype is None:
            close = difflib.get_close_matches(name, list(self.schema), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise self.fail(f"unknown field '{name}'{hint}")
        self.columns.add(name)
        return _getter(name), ftype

    def _numeric(self, node: exp.Expression, what: str) -> tuple[Eval, str]:
        f, t = self.compile(node)
        if t == "null":
            return f, "double"
        if t not in NUMERIC:
            raise self.fail(f"{what} needs numbers, but {node.sql(dialect='spark')!r} is {t}")
        return f, t

    def _boolean(self, node: exp.Expression, what: str) -> tuple[Eval, str]:
        f, t = self.compile(node)
        if t not in ("boolean", "null"):
            raise self.fail(f"{what} needs a condition, but {node.sql(dialect='spark')!r} is {t}")
        return f, "boolean"

    def _logic(self, node: exp.And | exp.Or) -> tuple[Eval, str]:
        a, _ = self._boolean(node.this, node.key.upper())
        b, _ = self._boolean(node.expression, node.key.upper())
        if isinstance(node, exp.And):

            def and_(r: Row) -> bool | None:
                x = a(r)
                if x is False:
                    return False
                y = b(r)
                if y is False:
                    return False
                return None if x is None or y is None else True

            return and_, "boolean"

        def or_(r: Row) -> bool | None:
            x = a(r)
            if x is True:
                return True
            y = b(r)
            if y is True:
                return True
            return None if x is None or y is None else False

        return or_, "boolean"

    def _comparable(self, ta: str, tb: str, node: exp.Expression) -> None:
        if "null" in (ta, tb) or ta == tb or (ta in NUMERIC and tb in NUMERIC):
            return
        raise self.fail(f"cannot compare {ta} with {tb} in {node.sql(dialect='spark')!r}")

    def _compare(self, node: exp.Expression) -> tuple[Eval, str]:
        a, ta = self.compile(node.this)
        b, tb = self.compile(node.expression)
        self._comparable(ta, tb, node)
        op = _CMP[type(node)]
        bounded = self._distance_compare(node)
        if bounded is not None:
            return bounded, "boolean"
        if isinstance(node.this, exp.Column) and isinstance(node.expression, exp.Literal):
            # the common `field <op> constant`: one call per row instead of three
            name, c = _column_name(node.this), b({})
            return (lambda r: None if (x := r.get(name)) is None else op(x, c)), "boolean"
        return (lambda r: None if (x := a(r)) is None or (y := b(r)) is None else op(x, y)), "boolean"

    def _distance_compare(self, node: exp.Expression) -> Eval | None:
        """``distance_km(...) <op> x`` (or ``x <op> distance_km(...)``) for ``<``, ``<=``, ``>``,
        ``>=``, through :func:`~app.rules.functions.distance_compare`: the same value as the
        plain comparison, which measures the geodesic only when the great circle leaves the
        answer open. None for any other comparison. Called once the plain form compiled,
        so the arguments are checked."""
        sign = _CMP_SIGN.get(type(node))
        if sign is None:
            return None
        call, other = _call_of(node.this, "distance_km"), node.expression
        if call is None:
            call, other, sign = _call_of(node.expression, "distance_km"), node.this, _FLIPPED[sign]
        if call is None:
            return None
        args = [self.compile(a)[0] for a in fn.call_args(call)]
        if len(args) != 4:
            return None
        a1, a2, a3, a4 = args
        k_of, _ = self.compile(other)
        compare = fn.distance_compare

        def distance_cmp(r: Row) -> bool | None:
            lat1, lon1, lat2, lon2 = a1(r), a2(r), a3(r), a4(r)
            if lat1 is None or lon1 is None or lat2 is None or lon2 is None:
                return None
            k = k_of(r)
            if k is None:
                return None
            return compare(sign, lat1, lon1, lat2, lon2, k)

        return distance_cmp

    def _in(self, node: exp.In) -> tuple[Eval, str]:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise self.fail("IN takes a list of values, not a subquery")
        items = node.expressions
        if len(items) > MAX_IN_LIST:
            raise self.fail(f"IN list has {len(items)} items; the limit is {MAX_IN_LIST}")
        x, tx = self.compile(node.this)
        compiled = [self.compile(i) for i in items]
        for _, ti in compiled:
            self._comparable(tx, ti, node)
        fns = [f for f, _ in compiled]
        if all(isinstance(i, exp.Literal) for i in items):
            values = frozenset(f({}) for f in fns)
            return (lambda r: None if (v := x(r)) is None else v in values), "boolean"

        def in_(r: Row) -> bool | None:
            v = x(r)
            if v is None:
                return None
            saw_null = False
            for f in fns:
                w = f(r)
                if w is None:
                    saw_null = True
                elif w == v:
                    return True
            return None if saw_null else False

        return in_, "boolean"

    def _between(self, node: exp.Between) -> tuple[Eval, str]:
        x, tx = self.compile(node.this)
        lo, tl = self.compile(node.args["low"])
        hi, th = self.compile(node.args["high"])
        self._comparable(tx, tl, node)
        self._comparable(tx, th, node)

        def between(r: Row) -> bool | None:
            v, a, b = x(r), lo(r), hi(r)
            ge = None if v is None or a is None else v >= a
            le = None if v is None or b is None else v <= b
            if ge is False or le is False:
                return False
            return None if ge is None or le is None else True

        return between, "boolean"

    def _like(self, node: exp.Like | exp.ILike) -> tuple[Eval, str]:
        x, tx = self.compile(node.this)
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise self.fail("LIKE needs a string literal pattern")
        if tx not in ("string", "null"):
            raise self.fail(f"LIKE needs a string, but {node.this.sql(dialect='spark')!r} is {tx}")
        try:
            like = fn.like_matcher(str(pattern.this), ignore_case=isinstance(node, exp.ILike))
        except ValueError as exc:
            raise self.fail(f"{node.key.upper()} pattern: {exc}") from None
        return (lambda r: None if (v := x(r)) is None else like(v)), "boolean"

    def _interval(self, node: exp.Interval) -> tuple[Eval, str]:
        if not self.allow_intervals:
            raise self.fail("a duration is only allowed as a function argument")
        unit = node.args.get("unit")
        unit_name = unit.name.upper() if unit is not None else ""
        amount = node.this
        if unit_name not in _UNIT_MS or not isinstance(amount, exp.Literal):
            raise self.fail(f"bad duration {node.sql(dialect='spark')!r}")
        ms = int(str(amount.this)) * _UNIT_MS[unit_name]
        return (lambda _r: ms), "interval"

    def _function(self, node: exp.Func) -> tuple[Eval, str]:
        name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
        if isinstance(node, exp.AggFunc):
            raise self.fail(f"aggregate function {name}() belongs in 'aggregate:', not in a condition")
        if isinstance(node, exp.Case | exp.If):
            raise self.fail(
                "CASE and IF are not in the rule language: write each case as a rule's 'where' "
                "(or a branch rule's 'when' arms), or use coalesce, greatest or least"
            )
        if self.synthetic is not None:
            try:
                resolved = self.synthetic(name, fn.call_args(node))
            except ValueError as exc:
                raise self.fail(f"{name}(): {exc}") from None
            if resolved is not None:
                col, col_type = resolved
                self.synthetic_cols.add(col)
                return (lambda r: r.get(col)), col_type
        spec = fn.FUNCTIONS.get(name)
        if spec is None:
            allowed = ", ".join(sorted(fn.FUNCTIONS))
            raise self.fail(f"function {name}() is not allowed; allowed functions: {allowed}")
        args = fn.call_args(node)
        compiled = [self.compile(a) for a in args]
        types = [t for _, t in compiled]
        try:
            result_type = spec.check(types)
        except TypeError as exc:
            raise self.fail(f"{name}(): {exc}") from None
        if self.check_literals:
            problem = fn.literal_problem(name, args)
            if problem is not None:
                raise self.fail(f"{name}(): {problem}")
        return spec.build([f for f, _ in compiled], types), result_type


def _get(r: Row, name: str) -> Any:
    """``r.get(name)``. Rows are dicts but for callers' own mappings; on a dict, compiled,
    ``get`` is then a native dict lookup instead of a Python method call."""
    if isinstance(r, dict):  # the same call, typed: compiled, a native dict lookup
        return r.get(name)
    return r.get(name)


def _getter(name: str) -> Eval:
    """A field's value in a row (see :func:`_get`)."""

    def get(r: Row) -> Any:
        return _get(r, name)

    return get


def _field(name: str) -> Many:
    def column(rows: Sequence[Row], cols: Columns) -> list[Any]:
        found = cols.get(name)
        if found is None:
            found = cols[name] = [_get(r, name) for r in rows]
        return found

    return column


#: ``column <op> constant`` column-wise: one comprehension instead of three calls per row
_CMP_CONST: dict[type[exp.Expression], Callable[[list[Any], Any], list[Any]]] = {
    exp.EQ: lambda xs, c: [None if x is None else x == c for x in xs],
    exp.NEQ: lambda xs, c: [None if x is None else x != c for x in xs],
    exp.GT: lambda xs, c: [None if x is None else x > c for x in xs],
    exp.GTE: lambda xs, c: [None if x is None else x >= c for x in xs],
    exp.LT: lambda xs, c: [None if x is None else x < c for x in xs],
    exp.LTE: lambda xs, c: [None if x is None else x <= c for x in xs],
}


def _and(xs: list[Any], ys: list[Any]) -> list[Any]:
    return [
        False if x is False or y is False else None if x is None or y is None else True
        for x, y in zip(xs, ys)
    ]


def _or(xs: list[Any], ys: list[Any]) -> list[Any]:
    return [
        True if x is True or y is True else None if x is None or y is None else False for x, y in zip(xs, ys)
    ]


def _columnar(comp: _Compiler, node: exp.Expression) -> Many:
    """The column-wise form of ``node``, which ``comp`` has compiled (so checked) row-wise.

    Fields, ``field <op> constant``, AND, OR, NOT and IS [NOT] NULL get their own
    comprehensions, with the same three-valued logic; anything else evaluates its
    row-wise form on each row. AND and OR evaluate both sides for every row: a side
    that raises makes :meth:`Compiled.over` redo the batch row by row.
    """
    if isinstance(node, exp.Paren):
        return _columnar(comp, node.this)
    if isinstance(node, exp.Column):
        return _field(_column_name(node))
    if isinstance(node, exp.And | exp.Or):
        a, b, join = _columnar(comp, node.this), _columnar(comp, node.expression), _and
        if isinstance(node, exp.Or):
            join = _or
        return lambda rows, cols: join(a(rows, cols), b(rows, cols))
    if isinstance(node, exp.Not):
        inner = _columnar(comp, node.this)
        return lambda rows, cols: [None if v is None else not v for v in inner(rows, cols)]
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        inner = _columnar(comp, node.this)
        return lambda rows, cols: [v is None for v in inner(rows, cols)]
    if (
        type(node) in _CMP_CONST
        and isinstance(node.this, exp.Column)
        and isinstance(node.expression, exp.Literal)
    ):
        xs, c, cmp = (
            _field(_column_name(node.this)),
            comp.compile(node.expression)[0]({}),
            _CMP_CONST[type(node)],
        )
        return lambda rows, cols: cmp(xs(rows, cols), c)
    f, _ = comp.compile(node)
    return lambda rows, _cols: [f(r) for r in rows]


def compile_expr(
    text: str,
    schema: Mapping[str, str],
    *,
    boolean: bool = False,
    allow_intervals: bool = False,
    synthetic: Synthetic | None = None,
    check_literals: bool = False,
    part: exp.Expression | None = None,
) -> Compiled:
    """Compile ``text`` against ``schema`` (field name -> type); with ``part``, that part of
    ``text``'s parse alone (an aggregate's argument), its problems named by ``text``.

    With ``boolean=True`` the expression must be a condition. With ``check_literals`` (the
    rule loader's), literal arguments a function can only answer NULL or nothing useful for
    are refused too: coordinates out of range, a negative radius, a malformed polygon
    (:func:`app.rules.functions.literal_problem`); without it they evaluate as any value
    would, to NULL. Raises :class:`ExpressionError` naming the problem; never evaluates any
    code.
    """
    tree = parse(text) if part is None else part
    comp = _Compiler(text, schema, allow_intervals, synthetic, check_literals)
    f, t = comp.compile(tree)
    if boolean and t not in ("boolean", "null"):
        msg = f"in {text!r}: expected a condition (true/false), but the expression is {t}"
        raise ExpressionError(msg)
    bare = tree.this if isinstance(tree, exp.Paren) else tree
    field = _column_name(bare) if isinstance(bare, exp.Column) and not comp.synthetic_cols else None
    return Compiled(
        fn=f, type=t, text=text, columns=frozenset(comp.columns), synthetic=frozenset(comp.synthetic_cols),
        many=_columnar(comp, tree), field=field,
    )  # fmt: skip
