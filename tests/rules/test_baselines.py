"""Baseline functions (app/rules/baselines.py): each against an independent computation, their
warm-up, NULL and bound contracts, load-time errors, and both places a rule may call them."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from app.errors import RuleConfigError
from app.events import SCHEMAS, Event
from app.rules import baselines
from app.rules.baselines import BaselineSpec
from app.rules.evaluator import run_backtest
from app.rules.loader import load_rules

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR


def run(spec: BaselineSpec, points: list[tuple[int, float | None]]) -> list[float | None]:
    state, out = None, []
    for ts, v in points:
        state, x = spec.step(state, ts, v)
        out.append(x)
    return out


def series(n: int, step: int = 5 * MIN, seed: int = 7) -> list[tuple[int, float | None]]:
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    return [(i * step, 50.0 + 10 * rng.random() + (i % 7)) for i in range(n)]


def trailing(points: list[tuple[int, float | None]], i: int, lookback: int) -> list[float]:
    ts = points[i][0]
    return [v for t, v in points[:i] if ts - lookback < t and v is not None]


def test_zscore_is_the_trailing_lookbacks_mean_and_stddev_once_warm() -> None:
    pts = series(2000)
    got = run(BaselineSpec("z", "zscore", "value", HOUR * 6), pts)
    for i, (ts, v) in enumerate(pts):
        if ts < 6 * HOUR:
            assert got[i] is None  # warm-up: the lookback has not passed
            continue
        past = trailing(pts, i, 6 * HOUR)
        assert v is not None
        want = (v - statistics.fmean(past)) / statistics.stdev(past)
        assert got[i] == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_robust_zscore_is_the_median_and_mad_of_the_lookback() -> None:
    pts = series(1500, seed=3)
    got = run(BaselineSpec("r", "robust_zscore", "value", HOUR * 4), pts)
    for i, (ts, v) in enumerate(pts):
        if ts < 4 * HOUR:
            assert got[i] is None
            continue
        past = trailing(pts, i, 4 * HOUR)
        med = statistics.median(past)
        mad = statistics.median(abs(x - med) for x in past)
        assert v is not None
        assert got[i] == pytest.approx((v - med) / (1.4826 * mad), rel=1e-9)


def test_robust_zscore_falls_back_to_the_mean_deviation_when_most_values_are_equal() -> None:
    pts: list[tuple[int, float | None]] = [(i * HOUR, 10.0 if i % 3 else 12.0) for i in range(30)]
    pts.append((30 * HOUR, 20.0))
    got = run(BaselineSpec("r", "robust_zscore", "value", DAY), pts)
    past = trailing(pts, 30, DAY)
    spread = 1.253314 * statistics.fmean(abs(x - 10.0) for x in past)
    assert got[-1] == pytest.approx(10.0 / spread)


def test_ewma_halves_an_old_values_weight_every_half_life() -> None:
    spec = BaselineSpec("e", "ewma", "value", HOUR)
    pts: list[tuple[int, float | None]] = [(i * 30 * MIN, 10.0) for i in range(6)]
    pts += [(int(3.5 * HOUR), 20.0), (int(4.5 * HOUR), 0.0), (int(5.5 * HOUR), 0.0)]
    got = run(spec, pts)
    assert got[:2] == [None, None]  # warm-up: one half-life and 5 values
    assert got[6] == pytest.approx(10.0)
    assert got[7] == pytest.approx(15.0)  # 20 came one half-life after the mean of 10
    assert got[8] == pytest.approx(7.5)


def test_holt_residual_is_the_value_less_holts_forecast() -> None:
    spec = BaselineSpec("h", "holt_residual", "value", sf=0.5, tf=0.5)
    values = [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 30.0]
    got = run(spec, [(i, v) for i, v in enumerate(values)])
    level, trend, want = 3.0, 2.0, []  # the trend starts as the first difference
    for v in values[2:]:
        want.append(v - (level + trend))
        new = 0.5 * v + 0.5 * (level + trend)
        level, trend = new, 0.5 * (new - level) + 0.5 * trend
    assert got[:5] == [None] * 5  # warm-up: 5 values
    assert got[5:] == pytest.approx(want[3:])
    assert got[-1] == pytest.approx(15.0)  # a straight line is forecast exactly: 15 next; 30 is 15 above


def test_seasonal_is_the_value_one_period_earlier_within_a_tolerance() -> None:
    spec = BaselineSpec("s", "seasonal", "value", DAY)
    pts: list[tuple[int, float | None]] = [(h * HOUR, float(h)) for h in range(30)]
    got = run(spec, pts)
    assert got[:24] == [None] * 24
    assert got[24:] == [float(h - 24) for h in range(24, 30)]
    gap = run(spec, [(0, 1.0), (DAY + 2 * HOUR, 5.0)])  # nothing within an hour of a day ago
    assert gap == [None, None]


def test_predict_linear_extrapolates_the_least_squares_line() -> None:
    spec = BaselineSpec("p", "predict_linear", "value", HOUR, horizon_ms=2 * HOUR)
    pts: list[tuple[int, float | None]] = [(i * 10 * MIN, 100.0 + 3.0 * i) for i in range(20)]
    got = run(spec, pts)
    assert got[:6] == [None] * 6
    for i in range(6, 20):  # 3 per 10 minutes: 36 more two hours on
        assert got[i] == pytest.approx(100.0 + 3.0 * i + 36.0)


def test_null_teaches_nothing_and_gives_null() -> None:
    spec = BaselineSpec("z", "zscore", "value", HOUR)
    pts = series(40)
    with_nulls = [p if i % 5 else (p[0], None) for i, p in enumerate(pts)]
    got = run(spec, with_nulls)
    assert all(got[i] is None for i in range(0, 40, 5))
    clean = [p for i, p in enumerate(pts) if i % 5]
    assert [x for i, x in enumerate(got) if i % 5] == run(spec, clean)


def test_a_lookback_bounds_the_values_kept() -> None:
    spec = BaselineSpec("r", "robust_zscore", "value", HOUR)
    state = None
    for ts, v in series(5000, step=MIN):
        state, _ = spec.step(state, ts, v)
    assert state is not None and len(state[2]) <= 2 * 61 and len(state[6]) == 60
    dense = BaselineSpec("z", "zscore", "value", baselines.MAX_LOOKBACK_MS)
    state = None
    for i in range(baselines.MAX_POINTS + 500):
        state, _ = dense.step(state, i * 1000, float(i % 10))
    assert state is not None and len(state[2]) - state[1] == baselines.MAX_POINTS


def rules_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("zscore(status, 1d) > 3", "'status' is not a numeric field"),
        ("zscore(value, 8d) > 3", "at most 1w"),
        ("zscore(value) > 3", "expected zscore(field, lookback)"),
        ("zscore(2, 1d) > 3", "expected zscore(field, lookback)"),
        ("predict_linear(value, 1h, 400d) > 3", "horizon may be at most 366d"),
        ("ewma(value, 'x') > 3", "half-life must be a duration"),
        ("holt_residual(value, 0.3, 1) > 3", "tf must be between 0 and 1"),
    ],
)
def test_bad_arguments_are_refused_where_they_are_written(tmp_path: Path, where: str, message: str) -> None:
    path = rules_file(
        tmp_path, f"rules:\n  - id: r\n    source: sensors\n    group_by: [device_id]\n    where: {where}\n"
    )
    with pytest.raises(RuleConfigError) as err:
        load_rules([path])
    text = str(err.value.problems[0])
    assert text.startswith(f"{path}:5:12: r:") and message in text


def test_baselines_in_having_need_a_tumbling_or_hopping_window(tmp_path: Path) -> None:
    path = rules_file(
        tmp_path,
        "rules:\n  - id: r\n    source: sensors\n    window: {type: sliding, size: 1h}\n"
        "    aggregate: {n: count(*)}\n    having: zscore(n, 1d) > 3\n",
    )
    with pytest.raises(RuleConfigError, match="tumbling or hopping"):
        load_rules([path])


def sensor(device: str, ts_ms: int, value: float | None, **extra: object) -> tuple[str, Event]:
    from app.events import format_ts

    row = {"device_id": device, "ts": format_ts(ts_ms), "value": value, **extra}
    return "sensors", SCHEMAS["sensors"].validate(row)


def test_a_where_baseline_learns_per_group_and_every_replay_gives_the_same_ids(tmp_path: Path) -> None:
    path = rules_file(
        tmp_path,
        "rules:\n  - id: r\n    source: sensors\n    group_by: [device_id]\n"
        "    where: kind = 'cpu' and zscore(value, 2h) > 4\n",
    )
    evs = []
    for i in range(60):
        for dev, level in (("a", 10.0), ("b", 1000.0)):
            v = level + (i % 3) + (500.0 if dev == "a" and i == 50 else 0.0)
            evs.append(sensor(dev, i * 5 * MIN, v, kind="cpu" if i % 2 == 0 or i == 50 else "other"))
    first = run_backtest(load_rules([path]), evs)
    again = run_backtest(load_rules([path]), evs, partitions=3)
    fired = [a for a in first if a.status == "firing"]
    assert [(a.labels["device_id"], a.starts_at) for a in fired] == [("a", "1970-01-01T04:10:00.000Z")]
    assert [a.alert_id for a in first] == [a.alert_id for a in again]


def test_a_having_baseline_learns_one_point_per_window(tmp_path: Path) -> None:
    path = rules_file(
        tmp_path,
        "rules:\n  - id: r\n    source: sensors\n    group_by: [device_id]\n"
        "    window: {type: tumbling, size: 1h}\n    aggregate: {n: count(*)}\n"
        "    having: n > 2 * ewma(n, 3h)\n",
    )
    evs = []
    for h in range(12):
        per_hour = 30 if h == 10 else 6
        evs += [sensor("a", h * HOUR + k * (HOUR // per_hour), 1.0) for k in range(per_hour)]
    evs.append(sensor("a", 13 * HOUR, 1.0))
    fired = [a for a in run_backtest(load_rules([path]), evs) if a.status == "firing"]
    assert [(a.starts_at, a.values["n"]) for a in fired] == [("1970-01-01T10:00:00.000Z", 30)]
