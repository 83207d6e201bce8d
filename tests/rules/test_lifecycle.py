"""The shared pending → firing → resolved state machine, one transition at a time."""

from __future__ import annotations

from typing import Any

from app.rules.lifecycle import FIRES, NOTHING, PENDS, ending, in_episode, match, reset, started


def quiet() -> dict[str, Any]:
    return {"streak": 0, "streak_since": None, "firing_since": None}


def test_a_streak_pends_then_fires_once_consecutive_and_for_are_met() -> None:
    st = quiet()
    assert match(st, 0, 0, consecutive=3, for_ms=0) == PENDS
    assert match(st, 10, 10, consecutive=3, for_ms=0) == NOTHING
    assert match(st, 20, 20, consecutive=3, for_ms=0) == FIRES
    assert st["firing_since"] == st["streak_since"] == 0
    assert match(st, 30, 30, consecutive=3, for_ms=0) == NOTHING  # firing: it only counts
    assert st["streak"] == 4 and ending(st) == "resolved" and started(st) == 0


def test_for_is_measured_to_ready_at_and_force_fires_at_once() -> None:
    st = quiet()
    assert match(st, 0, 59, consecutive=1, for_ms=60) == PENDS
    assert match(st, 60, 60, consecutive=1, for_ms=60) == FIRES
    forced = quiet()
    assert match(forced, 5, 5, consecutive=9, for_ms=1_000, force=True) == FIRES


def test_a_match_without_for_or_consecutive_fires_without_pending() -> None:
    assert match(quiet(), 7, 7, consecutive=1, for_ms=0) == FIRES


def test_a_broken_streak_ends_pending_as_inactive_and_reset_is_quiet() -> None:
    st = quiet()
    match(st, 3, 3, consecutive=2, for_ms=0)
    assert in_episode(st) and ending(st) == "inactive" and started(st) == 3
    reset(st)
    assert st == quiet() and not in_episode(st) and ending(st) is None
