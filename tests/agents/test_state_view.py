"""The interactive queries' JSON form of a group's state, from plain or typed records."""

from __future__ import annotations

from dataclasses import dataclass

from agents.state_view import describe, iso


def test_threshold_states_read_as_status_condition_and_times() -> None:
    st = {"n": 3, "since": 1_704_067_200_000, "fire": None, "last": 1_704_067_500_000, "due": None, "p": 2}
    out = describe("threshold", st)
    assert out == {
        "kind": "threshold", "partition": 2, "status": "pending",
        "condition": {"matches": 3, "since": "2024-01-01T00:00:00.000Z", "firing_since": None},
        "last_event": "2024-01-01T00:05:00.000Z", "keep_firing_until": None, "no_data_since": None,
        "due": None,
    }  # fmt: skip
    assert describe("threshold", {**st, "fire": st["since"]})["status"] == "firing"
    assert describe("threshold", {"n": 0, "fire": None, "nd": 5})["status"] == "no_data"


@dataclass
class TypedThreshold:  # a typed record, as the evaluator's state may become
    n: int
    since: int | None
    fire: int | None
    last: int
    p: int = 0


def test_a_typed_record_reads_the_same_as_its_dict() -> None:
    typed = TypedThreshold(2, 1000, None, 2000, 1)
    assert describe("threshold", typed) == describe(
        "threshold", {"n": 2, "since": 1000, "fire": None, "last": 2000, "p": 1}
    )


def test_windows_list_their_open_windows_with_aggregates_oldest_first() -> None:
    st = {"w": {"3600000": {"a": [2], "done": False}, "0": {"a": [5], "done": True}}, "fire": 0, "p": 0}
    out = describe("window", st, window_ms=3_600_000, results=lambda accs: {"n": accs[0]})
    assert out["status"] == "firing" and out["firing_since"] == iso(0)
    assert out["open_windows"] == [
        {"start": "1970-01-01T00:00:00.000Z", "end": "1970-01-01T01:00:00.000Z", "aggregates": {"n": 5},
         "closed": True},
        {"start": "1970-01-01T01:00:00.000Z", "end": "1970-01-01T02:00:00.000Z", "aggregates": {"n": 2},
         "closed": False},
    ]  # fmt: skip


def test_absence_and_sequence() -> None:
    assert describe("absence", {"last": 0, "due": 60_000, "fire": None}) == {
        "kind": "absence", "partition": None, "status": "ok", "last_seen": iso(0), "due": iso(60_000),
        "firing_since": None,
    }  # fmt: skip
    seq = describe("sequence", {"step": 1, "n": 2, "first": 0, "last": 10}, step_names=("login", "sudo"))
    assert (seq["status"], seq["step_name"], seq["matches_in_step"]) == ("in_progress", "sudo", 2)
