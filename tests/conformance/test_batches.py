"""The live worker evaluates each fetched batch rule by rule (``process_batch``), with the
kinds' one-call paths for runs of one group's events (``fold_many``); backtests and the
Spark engine go event by event. Both must give the same transitions.

Input: the conformance suites' real and crafted events (NAB, Apache, OHLC, late,
out-of-order, duplicated and silent cases) on two emulated partitions, cut into batches
of several sizes. Compared per fingerprint: every transition's full JSON, in order; and
the late count, branch copies and late copies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backtest import BacktestReport, read_events
from app.events import Event
from app.rules.evaluator import Engine, Output
from app.rules.loader import load_rules
from app.rules.logic.events import AbsenceLogic
from app.rules.logic.threshold import ThresholdLogic
from app.rules.logic.windows import SlidingLogic, TumblingLogic
from tests.conformance.test_kinds import RULES as KINDS
from tests.conformance.test_kinds import lines_for_test, tables
from tests.conformance.test_threshold import RULES as THRESHOLDS

ROOT = Path(__file__).resolve().parents[2]
PACKS = [KINDS, THRESHOLDS, ROOT / "rules"]


def events() -> list[tuple[str, Event]]:
    return list(read_events(lines_for_test(), "input", BacktestReport()))


def outcome(
    eng: Engine, outs: list[Output]
) -> tuple[dict[str, list[bytes]], tuple[int, int], Counter, Counter]:
    seqs: dict[str, list[bytes]] = {}
    routed: Counter = Counter()
    late: Counter = Counter()
    for out in outs:
        for a in out.alerts:
            seqs.setdefault(a.fingerprint, []).append(a.to_json())
        routed.update(out.routed)
        late.update(out.late)
    return seqs, (eng.stats.late, eng.stats.skipped_no_table_row), routed, late


def batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@pytest.fixture(scope="module")
def recorded() -> list[tuple[str, Event]]:
    return events()


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """How many events each kind's fold_many took (so the one-call paths are known to run)."""
    counts: Counter = Counter()

    def counting(cls: type, original: Callable[..., int]) -> Callable[..., int]:
        def fold_many(self: Any, *args: Any) -> int:
            n = original(self, *args)
            counts[cls.__name__] += n
            return n

        return fold_many

    for cls in (AbsenceLogic, SlidingLogic, ThresholdLogic, TumblingLogic):
        monkeypatch.setattr(cls, "fold_many", counting(cls, cls.fold_many))
    return counts


@pytest.mark.parametrize("pack", PACKS, ids=lambda p: p.name)
def test_batches_give_the_transitions_of_one_event_at_a_time(
    pack: Path, recorded: list[tuple[str, Event]], taken: Counter
) -> None:
    ruleset = load_rules([pack])
    one = Engine(ruleset, partitions=2, tables=tables())
    expected = outcome(one, [one.process(s, e) for s, e in recorded])
    assert expected[0], "the pack raised nothing: the comparison would prove nothing"
    if pack == KINDS:
        assert expected[1][1] > 0  # events skipped for want of a registry row (missing: skip)
    for size in (2, 7, 64, 5000):
        eng = Engine(ruleset, partitions=2, tables=tables())
        got = outcome(eng, [eng.process_batch(b) for b in batches(recorded, size)])
        assert got[0] == expected[0], f"batches of {size}: transitions differ"
        assert got[1:] == expected[1:], (
            f"batches of {size}: late or skipped counts, branch or late copies differ"
        )
    assert taken["ThresholdLogic"] > 1000
    if pack != THRESHOLDS:
        assert taken["TumblingLogic"] > 1000
        assert taken["AbsenceLogic"] > 1000
        assert taken["SlidingLogic"] > 100
