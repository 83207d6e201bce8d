"""Baseline functions: a group's own normal, learnt in event time, as expression columns.

Six functions may be called in a threshold rule's ``where`` (and ``clear``) over an event
field, and in a tumbling or hopping window rule's ``having`` over an aggregate name:

================================== ==========================================================
``zscore(x, lookback)``            ``(x - mean) / stddev`` of the group's values in the
                                   trailing ``lookback`` (the current one excluded)
``robust_zscore(x, lookback)``     ``(x - median) / (1.4826 * MAD)`` over the same values
                                   (MAD 0: ``1.2533 *`` the mean absolute deviation)
``ewma(x, half_life)``             the exponentially weighted mean of the earlier values, each
                                   weighing half as much ``half_life`` (event time) later
``holt_residual(x, sf, tf)``       ``x`` less Holt's (double exponential smoothing) forecast
                                   from the earlier values; ``0 < sf, tf < 1`` as in
                                   Prometheus' ``holt_winters``
``seasonal(x, period)``            the newest value at or before ``ts - period`` (``1d``: the
                                   same time yesterday; ``1w``: last week), when it is no older
                                   than ``ts - period - period / 24``
``predict_linear(x, lookback, h)`` the least-squares line through the values in the trailing
                                   ``lookback`` (the current one included), at ``ts + h``
================================== ==========================================================

Contracts, the same for every function:

* **Per group, in event time.** Each call keeps its own state per rule and group, updated
  with every event the rule's logic sees for that group (or every window it evaluates), in
  the order it sees them: a threshold rule skips events older than the group's newest, so
  the baseline does too. ``where`` is not a filter for the baseline: an event on which the
  rest of the condition is FALSE still teaches it.
* **NULL.** A NULL (or non-finite) ``x`` gives NULL and teaches nothing. A baseline that
  cannot answer gives NULL: during warm-up, a standard deviation or MAD of 0 (as ``x / 0``
  is NULL), no value a period ago. A condition on NULL is not TRUE, so nothing fires.
* **Warm-up.** NULL until the group's first value seen by the call is at least one
  ``lookback`` (``half_life``, ``period``) older than the current one and the baseline
  holds at least :data:`MIN_POINTS` values (``holt_residual``: :data:`MIN_POINTS` values).
* **Bounded.** A call keeps the values of its trailing ``lookback`` (``seasonal``: its
  ``period`` and tolerance), at most :data:`MAX_POINTS` of them (the oldest go first);
  ``ewma`` and ``holt_residual`` keep three numbers. A ``lookback``, ``half_life`` or
  ``period`` may be at most :data:`MAX_LOOKBACK_MS` (one week), a horizon at most
  :data:`MAX_HORIZON_MS`; anything else is refused when the rule loads, with its
  ``file:line:col``.
* **Deterministic.** The state is JSON-able numbers, updated by the same float operations
  in the same order: the same input gives the same values, alerts and ids on every replay
  and on both engines (the Spark engine runs these rules through the same evaluator).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

logger = logging.getLogger(__name__)

#: a windowed baseline answers once it holds at least this many values
MIN_POINTS = 5
#: the most values one call keeps per group (one week of one value a minute)
MAX_POINTS = 10_080
#: the longest lookback, half-life or period
MAX_LOOKBACK_MS = 7 * 86_400_000
#: the furthest ``predict_linear`` looks ahead
MAX_HORIZON_MS = 366 * 86_400_000
#: the MAD of a normal distribution is its standard deviation over this
MAD_SCALE = 1.4826
#: when over half the values equal the median (MAD 0), the mean absolute deviation from it
#: times this stands in (the usual modified z-score's fallback)
MEAN_AD_SCALE = 1.253314

FUNCTIONS = ("zscore", "robust_zscore", "ewma", "holt_residual", "seasonal", "predict_linear")
_FORMS = {
    "zscore": "zscore(field, lookback), e.g. zscore(value, 1d)",
    "robust_zscore": "robust_zscore(field, lookback), e.g. robust_zscore(value, 1d)",
    "ewma": "ewma(field, half_life), e.g. ewma(value, 1h)",
    "holt_residual": "holt_residual(field, sf, tf) with 0 < sf, tf < 1, e.g. holt_residual(value, 0.3, 0.1)",
    "seasonal": "seasonal(field, period), e.g. seasonal(value, 1d)",
    "predict_linear": "predict_linear(field, lookback, horizon), e.g. predict_linear(value, 1h, 4h)",
}
_UNIT_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}
_UNIT_MS["WEEK"] = 7 * _UNIT_MS["DAY"]
_UNIT_LETTERS = {"MILLISECOND": "ms", "SECOND": "s", "MINUTE": "m", "HOUR": "h", "DAY": "d", "WEEK": "w"}

State = list[Any]


@dataclass(frozen=True)
class BaselineSpec:
    """One baseline call of a rule: ``func`` over ``field`` (an event field, or an aggregate
    name in ``having``), computed into the synthetic column ``column``."""

    column: str
    func: str
    field: str
    lookback_ms: int = 0  # lookback, half-life or period
    horizon_ms: int = 0  # predict_linear
    sf: float = 0.0  # holt_residual
    tf: float = 0.0

    def step(self, state: State | None, ts: int, value: Any) -> tuple[State | None, float | None]:
        """The baseline's value for ``value`` at ``ts`` and the state after it learnt the value.

        ``state`` is None for a group's first call; it is updated in place and returned.
        Calls come in non-decreasing ``ts`` per group. NULL or non-finite: (state, None)."""
        if value is None or isinstance(value, bool):
            return state, None
        v = float(value)
        if not math.isfinite(v):
            return state, None
        return _STEPS[self.func](self, state, ts, v)


def _duration(node: exp.Expression, what: str) -> int:
    unit = node.args.get("unit")
    if not isinstance(node, exp.Interval) or unit is None or not isinstance(node.this, exp.Literal):
        msg = f"the {what} must be a duration such as 15m, 1h or 1d"
        raise ValueError(msg)
    name = unit.name.upper()
    if name not in _UNIT_MS:
        msg = f"unsupported duration unit {name} for the {what}"
        raise ValueError(msg)
    ms = int(str(node.this.this)) * _UNIT_MS[name]
    if ms <= 0:
        msg = f"the {what} must be longer than 0"
        raise ValueError(msg)
    return ms


def _written(node: exp.Expression) -> str:
    """A duration :func:`_duration` took, as the rule wrote it (``36h``)."""
    unit = node.args["unit"].name.upper()
    return f"{node.this.this}{_UNIT_LETTERS.get(unit, ' ' + unit)}"


def _fraction(node: exp.Expression, what: str) -> float:
    if not isinstance(node, exp.Literal) or node.is_string:
        msg = f"{what} must be a number between 0 and 1 (exclusive)"
        raise ValueError(msg)
    x = float(str(node.this))
    if not 0.0 < x < 1.0:
        msg = f"{what} must be between 0 and 1 (exclusive), got {node.this}"  # as written, not as a float
        raise ValueError(msg)
    return x


@dataclass
class Collector:
    """Resolves baseline calls of one expression context to synthetic columns (an
    :data:`app.rules.expr.Synthetic` resolver) and collects their specs.

    ``fields`` maps the names a first argument may be to their types; ``what`` names them
    in errors (``the sensors schema``, ``the aggregates``); ``refuse`` is the reason every
    call is refused in this context, if any."""

    fields: Mapping[str, str]
    what: str
    refuse: str | None = None
    specs: dict[str, BaselineSpec] = field(default_factory=dict)

    def resolve(self, name: str, args: list[exp.Expression]) -> tuple[str, str] | None:
        """``(column, "double")`` for a baseline call, None for any other function;
        ValueError with the expected form for a malformed call."""
        if name not in _FORMS:
            return None
        if self.refuse is not None:
            raise ValueError(self.refuse)
        form = _FORMS[name]
        want = 3 if name in ("predict_linear", "holt_residual") else 2
        if len(args) != want or not isinstance(args[0], exp.Column):
            msg = f"expected {form}"
            raise ValueError(msg)
        fname = ".".join(p.name for p in args[0].parts)
        if self.fields.get(fname) not in ("long", "double"):
            msg = f"'{fname}' is not a numeric field of {self.what}; expected {form}"
            raise ValueError(msg)
        if name == "holt_residual":
            sf, tf = _fraction(args[1], "sf"), _fraction(args[2], "tf")
            spec = BaselineSpec(f"holt_residual({fname}, {sf!r}, {tf!r})", name, fname, sf=sf, tf=tf)
        else:
            what = {"ewma": "half-life", "seasonal": "period"}.get(name, "lookback")
            lookback = _duration(args[1], what)
            if lookback > MAX_LOOKBACK_MS:
                msg = f"the {what} may be at most 1w (7 days); got {_written(args[1])}"
                raise ValueError(msg)
            horizon = 0
            if name == "predict_linear":
                horizon = _duration(args[2], "horizon")
                if horizon > MAX_HORIZON_MS:
                    msg = f"the horizon may be at most 366d; got {_written(args[2])}"
                    raise ValueError(msg)
            tail = f", {horizon}ms" if name == "predict_linear" else ""
            column = f"{name}({fname}, {lookback}ms{tail})"
            spec = BaselineSpec(column, name, fname, lookback, horizon)
        self.specs[spec.column] = spec
        return spec.column, "double"


def advance(
    specs: tuple[BaselineSpec, ...], states: dict[str, Any], ts: int, row: Mapping[str, Any]
) -> dict[str, float | None]:
    """Each spec's value for ``row`` at ``ts`` (by column), its state in ``states`` (by
    column, updated in place) having learnt the row's value."""
    out: dict[str, float | None] = {}
    for spec in specs:
        state, value = spec.step(states.get(spec.column), ts, row.get(spec.field))
        if state is not None:
            states[spec.column] = state
        out[spec.column] = value
    return out


# --- the trailing values of a lookback ---------------------------------------------------------
#
# A windowed state is ``[first_ts, start, points, k, s1, s2, ...]``: ``points`` the values in
# time order as ``[ts, v]``, of which ``points[start:]`` are live (inside the lookback);
# ``s1``/``s2`` the live values' sum and sum of squares, shifted by ``k`` (the first live value
# when last summed) against cancellation. Dead points go in bulk, once they are half the list,
# and the sums are then taken again from the live values: the float error cannot build up.

_FIRST, _START, _POINTS, _K, _S1, _S2 = range(6)


def _new_window(ts: int, v: float) -> State:
    return [ts, 0, [], v, 0.0, 0.0]


def _resum(st: State) -> None:
    live = st[_POINTS][st[_START] :]
    k = live[0][1] if live else 0.0
    st[_K] = k
    st[_S1] = math.fsum(p[1] - k for p in live)
    st[_S2] = math.fsum((p[1] - k) ** 2 for p in live)


def _expire(st: State, cutoff: int, on_drop: Callable[[list[Any]], None] | None = None) -> None:
    """Drop from the live values those at or before ``cutoff`` (and beyond :data:`MAX_POINTS`)."""
    pts, start = st[_POINTS], st[_START]
    k = st[_K]
    while start < len(pts) and (pts[start][0] <= cutoff or len(pts) - start >= MAX_POINTS):
        d = pts[start][1] - k
        st[_S1] -= d
        st[_S2] -= d * d
        if on_drop is not None:
            on_drop(pts[start])
        start += 1
    st[_START] = start
    if start and start * 2 >= len(pts):
        del pts[:start]
        st[_START] = 0
        _resum(st)


def _add(st: State, ts: int, v: float) -> None:
    d = v - st[_K]
    st[_POINTS].append([ts, v])
    st[_S1] += d
    st[_S2] += d * d


def _live(st: State) -> int:
    return len(st[_POINTS]) - st[_START]


def _warm(spec: BaselineSpec, st: State, ts: int) -> bool:
    return ts - st[_FIRST] >= spec.lookback_ms and _live(st) >= MIN_POINTS


def _zscore(spec: BaselineSpec, st: State | None, ts: int, v: float) -> tuple[State, float | None]:
    if st is None:
        st = _new_window(ts, v)
    _expire(st, ts - spec.lookback_ms)
    score = None
    if _warm(spec, st, ts):
        n = _live(st)
        mean = st[_S1] / n
        var = max(st[_S2] / n - mean * mean, 0.0) * n / (n - 1)
        sd = math.sqrt(var)
        if sd > 1e-12 * max(1.0, abs(mean + st[_K])):
            score = (v - st[_K] - mean) / sd
    _add(st, ts, v)
    return st, score


# robust: ``[..., sorted live values]`` at index 6
_SORTED = 6


def _robust(spec: BaselineSpec, st: State | None, ts: int, v: float) -> tuple[State, float | None]:
    if st is None:
        st = [*_new_window(ts, v), []]
    srt: list[float] = st[_SORTED]

    def drop(p: list[Any]) -> None:
        del srt[bisect.bisect_left(srt, p[1])]

    _expire(st, ts - spec.lookback_ms, drop)
    score = None
    if _warm(spec, st, ts):
        med = _median(srt)
        spread = MAD_SCALE * _mad(srt, med)
        if spread <= 1e-12 * max(1.0, abs(med)):  # over half the values equal: the mean deviation
            spread = MEAN_AD_SCALE * math.fsum(abs(x - med) for x in srt) / len(srt)
        if spread > 1e-12 * max(1.0, abs(med)):
            score = (v - med) / spread
    _add(st, ts, v)
    bisect.insort(srt, v)
    return st, score


def _median(srt: list[float]) -> float:
    n = len(srt)
    mid = n // 2
    return srt[mid] if n % 2 else (srt[mid - 1] + srt[mid]) / 2.0


def _mad(srt: list[float], med: float) -> float:
    """The median of ``|x - med|`` over the sorted ``srt``: the distances on either side of
    ``med`` are two sorted runs, merged up to the middle (no sort, no copy)."""
    n = len(srt)
    right = bisect.bisect_left(srt, med)
    left = right - 1
    wanted = [n // 2] if n % 2 else [n // 2 - 1, n // 2]
    found: list[float] = []
    for i in range(wanted[-1] + 1):
        dl = med - srt[left] if left >= 0 else math.inf
        dr = srt[right] - med if right < n else math.inf
        if dl <= dr:
            d, left = dl, left - 1
        else:
            d, right = dr, right + 1
        if i in wanted:
            found.append(d)
    return sum(found) / len(found)


def _predict(spec: BaselineSpec, st: State | None, ts: int, v: float) -> tuple[State, float | None]:
    # ``[..., t0, st1, stt, stv]`` at 6..9: sums of t (seconds after t0) and of the products
    if st is None:
        st = [*_new_window(ts, v), ts, 0.0, 0.0, 0.0]

    def drop(p: list[Any]) -> None:
        t = (p[0] - st[6]) / 1000.0
        st[7] -= t
        st[8] -= t * t
        st[9] -= t * (p[1] - st[_K])

    _expire_predict(st, ts - spec.lookback_ms, drop)
    t = (ts - st[6]) / 1000.0
    _add(st, ts, v)
    st[7] += t
    st[8] += t * t
    st[9] += t * (v - st[_K])
    if not _warm(spec, st, ts):
        return st, None
    n = _live(st)
    mt, mv = st[7] / n, st[_S1] / n
    stt = st[8] - n * mt * mt
    if stt <= 0.0:
        return st, None
    slope = (st[9] - n * mt * mv) / stt
    at = (ts + spec.horizon_ms - st[6]) / 1000.0
    return st, st[_K] + mv + slope * (at - mt)


def _expire_predict(st: State, cutoff: int, drop: Callable[[list[Any]], None]) -> None:
    """:func:`_expire` for ``predict_linear``: the time sums are taken again with the others."""
    before = len(st[_POINTS])
    _expire(st, cutoff, drop)
    if len(st[_POINTS]) != before:  # compacted: sums again, from the new first time
        live = st[_POINTS]
        st[6] = t0 = live[0][0] if live else st[6]
        k = st[_K]
        st[7] = math.fsum((p[0] - t0) / 1000.0 for p in live)
        st[8] = math.fsum(((p[0] - t0) / 1000.0) ** 2 for p in live)
        st[9] = math.fsum((p[0] - t0) / 1000.0 * (p[1] - k) for p in live)


def _ewma(spec: BaselineSpec, st: State | None, ts: int, v: float) -> tuple[State, float | None]:
    # ``[first_ts, last_ts, mean, n]``
    if st is None:
        return [ts, ts, v, 1], None
    score = st[2] if ts - st[0] >= spec.lookback_ms and st[3] >= MIN_POINTS else None
    keep = 0.5 ** ((ts - st[1]) / spec.lookback_ms)
    st[2] = keep * st[2] + (1.0 - keep) * v
    st[1] = ts
    st[3] = min(st[3] + 1, MIN_POINTS)
    return st, score


def _holt(spec: BaselineSpec, st: State | None, ts: int, v: float) -> tuple[State, float | None]:
    # ``[n, level, trend]``; the trend starts as the first difference, as in Prometheus
    if st is None:
        return [1, v, 0.0], None
    n, level, trend = st
    if n == 1:
        st[:] = [2, v, v - level]
        return st, None
    residual = v - (level + trend) if n >= MIN_POINTS else None
    new_level = spec.sf * v + (1.0 - spec.sf) * (level + trend)
    st[:] = [min(n + 1, MIN_POINTS), new_level, spec.tf * (new_level - level) + (1.0 - spec.tf) * trend]
    return st, residual


def _seasonal(spec: BaselineSpec, st: State | None, ts: int, v: float) -> tuple[State, float | None]:
    # ``[first_ts, start, points]``: points in time order, the live ones from start
    if st is None:
        st = [ts, 0, []]
    pts, target = st[2], ts - spec.lookback_ms
    oldest = target - spec.lookback_ms // 24
    start = st[1]
    # keep the newest point at or before the oldest useful time (it may still be the answer)
    while start + 1 < len(pts) and (pts[start + 1][0] <= oldest or len(pts) - start > MAX_POINTS):
        start += 1
    st[1] = start
    if start and start * 2 >= len(pts):
        del pts[:start]
        st[1] = start = 0
    i = bisect.bisect_right(pts, target, lo=start, key=lambda p: p[0]) - 1
    score = pts[i][1] if i >= start and pts[i][0] >= oldest else None
    pts.append([ts, v])
    return st, score


_STEPS: dict[str, Callable[[BaselineSpec, State | None, int, float], tuple[State, float | None]]] = {
    "zscore": _zscore,
    "robust_zscore": _robust,
    "ewma": _ewma,
    "holt_residual": _holt,
    "seasonal": _seasonal,
    "predict_linear": _predict,
}
