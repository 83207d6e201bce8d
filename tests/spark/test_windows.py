"""``jobs.windows`` without a JVM: which rules run natively, and the closed-window lifecycle
(``ClosedWindows``) against the evaluator where its timers' times matter (the cap on empty
windows per timer run). The two-engine comparison is ``tests/conformance/test_windows.py``."""

from __future__ import annotations

from pathlib import Path

from app.events import Event
from app.rules.evaluator import run_backtest
from app.rules.loader import load_rules
from jobs.windows import ClosedWindows, native_problem

KINDS = Path(__file__).parent.parent / "conformance" / "kinds.yaml"
MINUTE = 60_000


def test_only_rules_whose_every_feature_is_reproduced_run_natively() -> None:
    rules = {r.id: r for r in load_rules([KINDS]).rules}
    assert native_problem(rules["hourly-heat"]) is None
    assert native_problem(rules["hot-quarter"]) is None  # hopping, where, for, side
    assert native_problem(rules["busy-host"]) is None  # count(distinct), sum of a long
    assert "amend" in (native_problem(rules["heat-rising"]) or "")
    assert "tumbling and hopping" in (native_problem(rules["not-found-burst"]) or "")  # sliding
    assert "tumbling and hopping" in (native_problem(rules["overheat-held"]) or "")  # a threshold


def test_prev_keeps_a_rule_on_the_stream_path(tmp_path: Path) -> None:
    path = tmp_path / "prev.yaml"
    path.write_text(
        "rules:\n  - {id: spike, source: sensors, group_by: [device_id],\n"
        "     window: {type: tumbling, size: 1m}, aggregate: {n: count(*)},\n"
        "     having: 'n > 2 * coalesce(prev(n), 0)'}\n"
    )
    assert "prev()" in (native_problem(load_rules([path]).rules[0]) or "")


def test_a_clock_jump_caps_the_empty_windows_before_an_open_one_as_the_evaluator_does(tmp_path: Path) -> None:
    """Device a's windows 0 and 15000 (minutes) stay open (lateness), then one event of b
    moves the clock past both: the evaluator's timer run evaluates window 0, then at most
    MAX_EMPTY_STEPS empty windows before window 15000, so the alert (``for: 12000m``) fires
    at window 15000, not at the empty window 11999 as it would with every one evaluated."""
    path = tmp_path / "cap.yaml"
    path.write_text(
        "rules:\n  - {id: cap, source: sensors, group_by: [device_id], window: {type: tumbling, size: 1m},\n"
        "     allowed_lateness: 20000m, aggregate: {n: count(*)}, having: n < 5, for: 12000m}\n"
    )
    ruleset = load_rules([path])
    events = [("a", 0), ("a", 30_000), ("a", 15_000 * MINUTE), ("b", 40_000 * MINUTE)]
    expected = run_backtest(
        ruleset, [("sensors", Event(k, ts, {"device_id": k, "ts": ""})) for k, ts in events], partitions=1
    )
    assert [a.status for a in expected if a.labels["device_id"] == "a"] == ["pending", "firing"]
    logic = ClosedWindows(ruleset.rules[0])
    windows = [(0, {"n": 2}), (15_000 * MINUTE, {"n": 1})]
    jumps = [(30_000, 15_000 * MINUTE), (15_000 * MINUTE, 40_000 * MINUTE)]
    got = logic.run(("a",), windows, 40_000 * MINUTE, jumps)
    assert [a.to_json() for a in got] == [a.to_json() for a in expected if a.labels["device_id"] == "a"]
    uncapped = logic.run(("a",), windows, 40_000 * MINUTE)  # fires at window 11999, not 15000
    assert [a.event_ts for a in uncapped] != [a.event_ts for a in got]
