"""``jobs.thresholds`` without a JVM: which threshold rules run natively, and the state the
evaluator's ``ThresholdLogic`` reaches on the kept rows only (the dropped rows' count and
newest time added) against the evaluator's on every row. The two-engine comparison is
``tests/conformance/test_native_thresholds.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from app.events import Event
from app.rules.evaluator import ThresholdLogic, group_values, state_key
from app.rules.loader import load_rules
from app.rules.logic.base import DictStore
from app.tables import Tables
from jobs.thresholds import ThresholdStep, native_problem, with_native_clear

CONFORMANCE = Path(__file__).parent.parent / "conformance"
MINUTE = 60_000


def test_only_threshold_rules_whose_every_feature_is_reproduced_run_natively() -> None:
    rules = {r.id: r for r in load_rules([CONFORMANCE / "kinds.yaml"]).rules}
    assert native_problem(rules["plain-hot"]) is None
    assert native_problem(rules["too-hot-for-its-site"]) is None  # enrich, missing: skip
    assert native_problem(rules["unknown-device-hot"]) is None  # enrich, missing: null
    assert "keep_firing_for" in (native_problem(rules["overheat-held"]) or "")
    assert "no_data" in (native_problem(rules["hot-then-silent"]) or "")
    assert "pct_change" in (native_problem(rules["day-jump"]) or "")
    assert "allowed_lateness" in (native_problem(rules["errors-in-time-order"]) or "")  # order: event_time
    assert "only threshold" in (native_problem(rules["hourly-heat"]) or "")


def test_the_state_on_the_kept_rows_is_the_evaluators_on_every_row() -> None:
    rule = next(r for r in load_rules([CONFORMANCE / "thresholds.yaml"]).rules if r.id == "thr-overheat")
    temps = [101.0] * 21 + [98.0]  # fires at minute 10, then only counts; 98 keeps it firing
    events = [{"device_id": "d-1", "ts_ms": m * MINUTE, "temperature": t} for m, t in enumerate(temps)]
    evaluator, store = ThresholdLogic(rule), DictStore()
    key = state_key(rule, group_values(rule, events[0]))
    for e in events:
        evaluator.on_event(store, key, ("d-1",), Event("d-1", e["ts_ms"], e), e)

    def kept(m: int, skipped: int, newest: int | None) -> dict[str, Any]:
        t = temps[m]
        fields = orjson.dumps(events[m]).decode()
        return {"__fields": fields, "__ts_ms": m * MINUTE, "__h": t > 100, "__c": t < 97,
                "__skipped": skipped, "__newest": newest, "__part": 0, "__offset": m}  # fmt: skip

    rows = [kept(m, 0, None if m == 0 else (m - 1) * MINUTE) for m in range(11)] + [kept(21, 10, 20 * MINUTE)]
    native = with_native_clear(rule)
    mine = DictStore()
    out = ThresholdStep([rule], {rule.id: 0}, Tables()).run_group(native, ThresholdLogic(native), rows, mine)
    assert [o[8] for o in out] == ["pending", "firing"]
    assert mine.data[key] == store.data[key]
    assert mine.data[key]["streak"] == 21 and mine.data[key]["last_event"] == 21 * MINUTE
