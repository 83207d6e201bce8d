"""The whitelist of functions a rule expression may call, with Spark SQL semantics.

Each function declares how to type-check its arguments and how to build a
NULL-propagating closure. Geo functions use geopy's geodesic distance on the
WGS-84 ellipsoid; the Spark engine wraps these same Python functions, so both
engines give identical results.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from geopy.distance import geodesic
from sqlglot import exp

Eval = Callable[[Any], Any]
NUMERIC = frozenset({"long", "double"})


def sql_mod(a: int | float, b: int | float) -> int | float:
    """Remainder whose sign follows the dividend (Spark/Java), not Python's floor mod."""
    if isinstance(a, int) and isinstance(b, int):
        r = abs(a) % abs(b)
        return r if a >= 0 else -r
    return math.fmod(a, b)


_WIDE = Context(prec=400)  # enough digits for any double at any scale
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


def long_or_none(v: int) -> int | None:
    """A 64-bit result, or NULL when it does not fit (Spark's try_* semantics)."""
    return v if _LONG_MIN <= v <= _LONG_MAX else None


def round_half_up(x: float, digits: int = 0) -> float:
    """Spark's ROUND: half away from zero, on the decimal value as written.
    Infinity and NaN come back unchanged."""
    x = float(x)
    if not math.isfinite(x):
        return x
    try:
        q = Decimal(1).scaleb(-digits)
        return float(Decimal(repr(x)).quantize(q, rounding=ROUND_HALF_UP, context=_WIDE))
    except InvalidOperation:  # beyond any double's digits: round(1e10, 398) is 1e10, round(x, -2e6) 0
        return x if digits > 0 else math.copysign(0.0, x)


def floor_long(x: int | float) -> int | None:
    """FLOOR to a 64-bit integer; NULL when infinite, NaN or out of range."""
    return long_or_none(math.floor(x)) if math.isfinite(x) else None


def ceil_long(x: int | float) -> int | None:
    return long_or_none(math.ceil(x)) if math.isfinite(x) else None


#: the longest run of a LIKE pattern between two ``%`` that is matched by a regex (one with
#: ``_``, or any run of an ILIKE): such a run costs up to its length at each character of the
#: value (a 64 KiB value against 128 characters: some 8 million steps), where a case-sensitive run without
#: ``_`` is a string search, linear in the value whatever its length
MAX_LIKE_RUN = 128


class LikeRun:
    """A LIKE pattern's run between two ``%``: ``size`` characters, each one given or any
    (``_``). Without ``_`` and keeping case, it is compared as the string ``text`` and
    ``rx`` is None; otherwise ``rx`` matches it, a regex without a quantifier."""

    __slots__ = ("rx", "size", "text")

    def __init__(self, chars: list[str | None], ignore_case: bool) -> None:
        self.size = len(chars)
        self.text = ""
        self.rx: re.Pattern[str] | None = None
        if not chars or (None not in chars and not ignore_case):
            self.text = "".join(c for c in chars if c is not None)
        else:
            body = "".join("." if c is None else re.escape(c) for c in chars)
            self.rx = re.compile(body, re.DOTALL | (re.IGNORECASE if ignore_case else 0))

    def at(self, s: str, i: int) -> bool:
        """Whether the run matches ``s`` from ``i`` (the caller checks ``i + size <= len(s)``)."""
        rx = self.rx
        if rx is None:
            return s.startswith(self.text, i)
        return rx.match(s, i) is not None

    def find(self, s: str, start: int, end: int) -> int:
        """The first position in ``s[start:end]`` the whole run matches from, or -1."""
        rx = self.rx
        if rx is None:
            return s.find(self.text, start, end)
        m = rx.search(s, start, end)
        return -1 if m is None else m.start()


def like_runs(pattern: str, ignore_case: bool = False) -> list[LikeRun]:
    """``pattern`` split at each ``%`` (so there is one run more than there are ``%``):
    ``_`` is any character, ``\\`` takes the next character as itself, and a trailing
    ``\\`` is a backslash."""
    runs: list[list[str | None]] = [[]]
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            runs[-1].append(pattern[i + 1])
            i += 2
            continue
        if c == "%":
            runs.append([])
        else:
            runs[-1].append(None if c == "_" else c)
        i += 1
    return [LikeRun(r, ignore_case) for r in runs]


@lru_cache(maxsize=512)
def like_matcher(pattern: str, ignore_case: bool = False) -> Callable[[str], bool]:
    """``value LIKE pattern`` (``ILIKE`` with ``ignore_case``) as a function of ``value``.

    ``%`` is any run of characters, ``_`` one character, ``\\`` makes the next
    character itself (a trailing one is a backslash); ``ignore_case`` compares as
    ``re.IGNORECASE`` does, character by character.

    No backtracking: the runs between ``%`` have fixed lengths, so the first must
    match at the start, the last at the end, and each other one is matched at its
    leftmost place after the one before (a later place never leaves more room). The
    searches cover disjoint stretches of the value but the last, so the cost is at most
    ``2 * len(value) * MAX_LIKE_RUN`` steps, and linear for runs without ``_`` that keep
    case (string searches). A regex of ``.*`` between the runs would backtrack in
    time exponential in the number of ``%`` on a value that almost matches.

    Raises ValueError naming the run when one matched by a regex is longer than
    :data:`MAX_LIKE_RUN`.
    """
    runs = like_runs(pattern, ignore_case)
    for run in runs:
        if run.rx is not None and run.size > MAX_LIKE_RUN:
            msg = (
                f"a run between % signs may be at most {MAX_LIKE_RUN} characters when it has _ "
                f"in it or case is ignored (ILIKE); this one has {run.size}"
            )
            raise ValueError(msg)
    first, last = runs[0], runs[-1]
    if len(runs) == 1:  # no %: the whole value
        if first.rx is None:
            text = first.text
            return lambda s: s == text
        whole = first.rx
        return lambda s: whole.fullmatch(s) is not None
    middle = [r for r in runs[1:-1] if r.size]
    least = first.size + last.size + sum(r.size for r in middle)
    # the usual shapes, each as one call: x%, %x, x%y, %x%
    if not middle and first.rx is None and last.rx is None:
        head, tail = first.text, last.text
        if not tail:
            return (lambda s: s.startswith(head)) if head else (lambda s: True)
        if not head:
            return lambda s: s.endswith(tail)
        return lambda s: len(s) >= least and s.startswith(head) and s.endswith(tail)
    if not middle and not last.size and first.rx is not None:
        prefix = first.rx
        return lambda s: prefix.match(s) is not None
    if not middle and not first.size and last.rx is not None:
        suffix, size = last.rx, last.size
        return lambda s: len(s) >= size and suffix.match(s, len(s) - size) is not None
    if len(middle) == 1 and not first.size and not last.size:
        inner = middle[0]
        if inner.rx is None:
            needle = inner.text
            return lambda s: needle in s
        anywhere = inner.rx
        return lambda s: anywhere.search(s) is not None

    def like(s: str) -> bool:
        n = len(s)
        if n < least or not first.at(s, 0) or not last.at(s, n - last.size):
            return False
        pos, end = first.size, n - last.size
        for run in middle:
            i = run.find(s, pos, end)
            if i < 0:
                return False
            pos = i + run.size
        return True

    return like


def distance_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float | None:
    """Geodesic distance in km (geopy, WGS-84). NULL for out-of-range coordinates."""
    if not (-90 <= lat1 <= 90 and -90 <= lat2 <= 90 and -180 <= lon1 <= 180 and -180 <= lon2 <= 180):
        return None
    return float(_GEODESIC.measure((lat1, lon1), (lat2, lon2)))


#: one geopy geodesic (WGS-84, in km) for every distance: ``geodesic(a, b).km`` is the same
#: ``measure(a, b)``, after building a new geographiclib ``Geodesic`` each call
_GEODESIC = geodesic()


#: Bounds of the WGS-84 geodesic distance ``s`` against the great-circle distance ``d``
#: between the same latitudes and longitudes on a sphere of radius :data:`SPHERE_KM`:
#: ``GEODESIC_LOW * d <= s <= GEODESIC_HIGH * d`` for every pair of points.
#:
#: Why: along any path, the ellipsoid's length element over the sphere's lies between
#: min(M, N) / R and max(M, N) / R, where M (meridional) and N (prime vertical) are the
#: ellipsoid's radii of curvature: 6,335.439 km (M at the equator) to 6,399.594 km (both at
#: the poles). So the geodesic, the ellipsoid's shortest path, is at most the great circle's
#: path measured on the ellipsoid (<= 1.004487 d), and at least its own path measured on the
#: sphere (>= 0.994417 d). The constants widen that by about half a percent each way, far
#: beyond the floating-point error of either distance. ``tests/rules/test_expr.py`` checks the
#: bounds on random pairs across the globe.
SPHERE_KM = 6371.0088
GEODESIC_LOW = 0.99
GEODESIC_HIGH = 1.01


def great_circle_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Haversine distance on the sphere of radius :data:`SPHERE_KM` (coordinates in range)."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dlon = math.radians(lon2 - lon1)
    h = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dlon / 2) ** 2
    return 2 * SPHERE_KM * math.asin(min(1.0, math.sqrt(h)))


#: the comparisons :func:`distance_compare` takes (``distance <op> k``), each as it is made
#: once the geodesic is measured
_EXACT: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
}  # fmt: skip
DISTANCE_OPS = tuple(_EXACT)


def bounded_compare(op: str, d: float, k: float) -> bool | None:
    """``s <op> k`` for the geodesic ``s`` between two points whose great-circle distance is
    ``d``, when the bounds (:data:`GEODESIC_LOW`, :data:`GEODESIC_HIGH`) decide it; None
    when ``k`` is too close to call (or NaN). ``op`` is one of :data:`DISTANCE_OPS`."""
    lo, hi = d * GEODESIC_LOW, d * GEODESIC_HIGH
    if op == ">":
        return True if lo > k else False if hi <= k else None
    if op == ">=":
        return True if lo >= k else False if hi < k else None
    if op == "<":
        return True if hi < k else False if lo >= k else None
    if op == "<=":
        return True if hi <= k else False if lo > k else None
    msg = f"unsupported distance comparison {op!r}"
    raise ValueError(msg)


def distance_compare(op: str, lat1: float, lon1: float, lat2: float, lon2: float, k: float) -> bool | None:
    """``distance_km(lat1, lon1, lat2, lon2) <op> k``, exactly, for ``op`` in :data:`DISTANCE_OPS`.

    The geodesic costs ~130 us (geographiclib in Python), the great circle ~1 us. The
    bounds decide the comparison from the great circle unless ``k`` lies within about
    1 % of the distance (:func:`bounded_compare`); only then is the geodesic measured. The
    answer is always the one the geodesic gives, so a rule's alerts do not depend on which
    was computed, and the Spark engine, which calls the same function, agrees."""
    if not (-90 <= lat1 <= 90 and -90 <= lat2 <= 90 and -180 <= lon1 <= 180 and -180 <= lon2 <= 180):
        return None
    decided = bounded_compare(op, great_circle_km(lat1, lon1, lat2, lon2), k)
    if decided is not None:
        return decided
    return _EXACT[op](float(_GEODESIC.measure((lat1, lon1), (lat2, lon2))), k)


def inside_radius(lat: float, lon: float, clat: float, clon: float, radius_km: float) -> bool | None:
    """``distance_km(lat, lon, clat, clon) <= radius_km`` (the geodesic only near the edge)."""
    return distance_compare("<=", lat, lon, clat, clon, radius_km)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_polygon(text: str) -> tuple[tuple[float, float], ...]:
    """``'lat lon, lat lon, ...'`` (at least three vertices) -> vertex tuple.

    Raises ValueError naming the first vertex that is not two numbers, or not a latitude in
    [-90, 90] and a longitude in [-180, 180] (so never NaN or infinite), or when there are
    fewer than three vertices."""
    points = []
    for pair in text.split(","):
        numbers = pair.split()
        lat, lon = (_number(numbers[0]), _number(numbers[1])) if len(numbers) == 2 else (None, None)
        vertex = pair.strip()[:40]
        if lat is None or lon is None:
            msg = f"polygon vertex {vertex!r} is not 'lat lon' (two numbers)"
            raise ValueError(msg)
        if not (-90 <= lat <= 90 and -180 <= lon <= 180):
            msg = f"polygon vertex {vertex!r} is out of range: latitude -90 to 90, longitude -180 to 180"
            raise ValueError(msg)
        points.append((lat, lon))
    if len(points) < 3:
        msg = "a polygon needs at least three 'lat lon' vertices"
        raise ValueError(msg)
    return tuple(points)


@lru_cache(maxsize=256)
def polygon_or_none(text: str) -> tuple[tuple[float, float], ...] | None:
    """:func:`parse_polygon`, None for a malformed polygon (cached either way)."""
    try:
        return parse_polygon(text)
    except ValueError:
        return None


def inside_polygon(lat: float, lon: float, polygon: str) -> bool | None:
    """Even-odd ray casting on (lat, lon) treated as planar; fine for geofences
    far from the poles and the antimeridian. NULL when ``polygon`` is malformed (see
    :func:`parse_polygon`): a polygon read from an event or a table at run time."""
    pts = polygon_or_none(polygon)
    if pts is None:
        return None
    inside = False
    j = len(pts) - 1
    for i, (yi, xi) in enumerate(pts):
        yj, xj = pts[j]
        if (yi > lat) != (yj > lat):
            x_cross = (xj - xi) * (lat - yi) / (yj - yi) + xi
            if lon < x_cross:
                inside = not inside
        j = i
    return inside


def _constant(node: exp.Expression) -> float | None:
    """The value of a number literal (``5``, ``-5``, ``(2.5)``), None for anything else."""
    sign = 1.0
    while isinstance(node, exp.Paren | exp.Neg):
        if isinstance(node, exp.Neg):
            sign = -sign
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return sign * float(str(node.this))
        except ValueError:
            return None
    return None


#: the arguments of each geo function that are latitudes, longitudes and a radius
_GEO_ARGS: dict[str, tuple[tuple[int, ...], tuple[int, ...], int | None]] = {
    "distance_km": ((0, 2), (1, 3), None),
    "inside_radius": ((0, 2), (1, 3), 4),
    "inside_polygon": ((0,), (1,), None),
}


def literal_problem(name: str, args: Sequence[exp.Expression]) -> str | None:
    """Why a call of the function ``name`` cannot mean what it says, from its literal
    arguments alone (the loader refuses it), None when nothing is wrong with them: a
    latitude outside [-90, 90] or a longitude outside [-180, 180] (the call is always NULL),
    a negative radius (never inside), a polygon that :func:`parse_polygon` refuses.
    Arguments read from fields are checked per event instead: bad ones give NULL."""
    spec = _GEO_ARGS.get(name)
    if spec is None:
        return None
    lats, lons, radius = spec
    ranges = [(i, -90.0, 90.0, "latitude") for i in lats] + [(i, -180.0, 180.0, "longitude") for i in lons]
    for i, low, high, what in ranges:
        value = _constant(args[i]) if i < len(args) else None
        if value is not None and not low <= value <= high:
            return f"argument {i + 1} is a {what}, from {low:g} to {high:g}; got {value:g}"
    if radius is not None and radius < len(args):
        value = _constant(args[radius])
        if value is not None and value < 0:
            return f"argument {radius + 1} is a radius in km, 0 or more; got {value:g}"
    if name == "inside_polygon" and len(args) == 3:
        polygon = args[2]
        if isinstance(polygon, exp.Literal) and polygon.is_string:
            try:
                parse_polygon(str(polygon.this))
            except ValueError as exc:
                return str(exc)
    return None


Checker = Callable[[list[str]], str]
Builder = Callable[[list[Eval], list[str]], Eval]


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    check: Checker
    build: Builder
    doc: str


def _arity(types: list[str], lo: int, hi: int | None = None) -> None:
    hi = lo if hi is None else hi
    if not lo <= len(types) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        msg = f"takes {want} arguments, got {len(types)}"
        raise TypeError(msg)


def _all(types: list[str], allowed: frozenset[str], what: str) -> None:
    for i, t in enumerate(types, 1):
        if t != "null" and t not in allowed:
            msg = f"argument {i} must be {what}, got {t}"
            raise TypeError(msg)


def _strict(py: Callable[..., Any]) -> Builder:
    """NULL in, NULL out: the usual SQL function contract."""

    def build(args: list[Eval], _types: list[str]) -> Eval:
        def call(r: Any) -> Any:
            vals = [a(r) for a in args]
            if any(v is None for v in vals):
                return None
            return py(*vals)

        return call

    return build


def _numeric_fn(
    name: str, py: Callable[..., Any], result: str | None, lo: int, hi: int | None, doc: str
) -> FunctionSpec:
    def check(types: list[str]) -> str:
        _arity(types, lo, hi)
        _all(types, NUMERIC, "a number")
        if result is not None:
            return result
        return "long" if types and types[0] == "long" else "double"

    return FunctionSpec(name, check, _strict(py), doc)


def _string_fn(name: str, py: Callable[..., Any], result: str, doc: str) -> FunctionSpec:
    def check(types: list[str]) -> str:
        _arity(types, 1)
        _all(types, frozenset({"string"}), "a string")
        return result

    return FunctionSpec(name, check, _strict(py), doc)


def _coalesce() -> FunctionSpec:
    def check(types: list[str]) -> str:
        _arity(types, 1, 64)
        real = {t for t in types if t != "null"}
        if len(real - NUMERIC) > 1 or (real & NUMERIC and real - NUMERIC):
            msg = f"arguments must share one type, got {', '.join(types)}"
            raise TypeError(msg)
        if real <= NUMERIC and real:
            return "long" if real == {"long"} else "double"
        return next(iter(real), "null")

    def build(args: list[Eval], _t: list[str]) -> Eval:
        def call(r: Any) -> Any:
            for a in args:
                v = a(r)
                if v is not None:
                    return v
            return None

        return call

    return FunctionSpec("coalesce", check, build, "first non-NULL argument")


def _extreme(name: str, pick: Callable[[Sequence[Any]], Any]) -> FunctionSpec:
    def check(types: list[str]) -> str:
        _arity(types, 2, 64)
        _all(types, NUMERIC, "a number")
        return "long" if all(t == "long" for t in types if t != "null") else "double"

    def build(args: list[Eval], types: list[str]) -> Eval:
        as_double = check(types) == "double"  # Spark widens every argument to double

        def call(r: Any) -> Any:
            vals = [v for a in args if (v := a(r)) is not None]
            if not vals:
                return None
            best = pick(vals)
            return float(best) if as_double else best

        return call

    return FunctionSpec(name, check, build, f"{name} of the non-NULL arguments (Spark skips NULLs)")


def _geo(name: str, py: Callable[..., Any], n: int, result: str, doc: str) -> FunctionSpec:
    def check(types: list[str]) -> str:
        _arity(types, n)
        _all(types, NUMERIC, "a number")
        return result

    return FunctionSpec(name, check, _strict(py), doc)


def _polygon() -> FunctionSpec:
    def check(types: list[str]) -> str:
        _arity(types, 3)
        _all(types[:2], NUMERIC, "a number")
        if types[2] != "string":
            msg = "argument 3 must be a polygon string 'lat lon, lat lon, ...'"
            raise TypeError(msg)
        return "boolean"

    return FunctionSpec("inside_polygon", check, _strict(inside_polygon), "point inside a lat/lon polygon")


FUNCTIONS: dict[str, FunctionSpec] = {
    s.name: s
    for s in (
        _numeric_fn(
            "abs",
            lambda x: long_or_none(abs(x)) if isinstance(x, int) else abs(x),
            None,
            1,
            1,
            "absolute value (NULL for the one long without one)",
        ),
        _numeric_fn("round", lambda x, d=0: round_half_up(x, int(d)), "double", 1, 2, "round half up"),
        _numeric_fn("floor", floor_long, "long", 1, 1, "largest integer <= x (NULL outside 64 bits)"),
        _numeric_fn("ceil", ceil_long, "long", 1, 1, "smallest integer >= x (NULL outside 64 bits)"),
        _string_fn("lower", str.lower, "string", "lower case"),
        _string_fn("upper", str.upper, "string", "upper case"),
        _string_fn("length", len, "long", "number of characters"),
        _string_fn("trim", lambda s: s.strip(" "), "string", "strip spaces"),
        _coalesce(),
        _extreme("greatest", max),
        _extreme("least", min),
        _geo("distance_km", distance_km, 4, "double", "geodesic km between (lat1, lon1) and (lat2, lon2)"),
        _geo("inside_radius", inside_radius, 5, "boolean", "(lat, lon) within radius_km of (clat, clon)"),
        _polygon(),
    )
}


def call_args(node: exp.Func) -> list[exp.Expression]:
    """A function call's arguments in positional order, for any sqlglot Func class."""
    if isinstance(node, exp.Anonymous):
        return list(node.expressions)
    out: list[exp.Expression] = []
    for key in node.arg_types:
        value = node.args.get(key)
        if isinstance(value, list):
            out.extend(v for v in value if isinstance(v, exp.Expression))
        elif isinstance(value, exp.Expression):
            out.append(value)
    return out
