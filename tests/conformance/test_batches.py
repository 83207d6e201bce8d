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
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.backtest import BacktestReport, read_events
from app.events import Event, format_ts
from app.rules.evaluator import Engine, Output, Rows, group_and_suffix
from app.rules.loader import load_rules
from app.rules.logic.events import AbsenceLogic, ChangeLogic
from app.rules.logic.threshold import ThresholdLogic
from app.rules.logic.windows import SlidingLogic, TumblingLogic
from app.runtime import native
from tests.conformance.kind_cases import RULES as KINDS
from tests.conformance.kind_cases import lines_for_test, tables
from tests.conformance.threshold_cases import RULES as THRESHOLDS

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

    for cls in (AbsenceLogic, ThresholdLogic, TumblingLogic):
        monkeypatch.setattr(cls, "fold_many", counting(cls, cls.fold_many))
    for cls in (AbsenceLogic, TumblingLogic):  # fold_scattered: counted as "scattered <kind>"
        monkeypatch.setattr(
            cls, "fold_scattered", counting(type(f"scattered {cls.__name__}", (), {}), cls.fold_scattered)
        )
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
    if native.active():
        return  # compiled callers do not see the counting patch; make test's plain pass counts
    assert taken["ThresholdLogic"] > 1000
    if pack != THRESHOLDS:
        assert taken["TumblingLogic"] > 1000
        assert taken["AbsenceLogic"] > 1000
        # events of interleaved groups, each its kind's per-event common case
        assert taken["scattered TumblingLogic"] > 1000
        assert taken["scattered AbsenceLogic"] > 100


class ChangelogStore:
    """Writes as the worker's table store does: ``put`` marks a key dirty, and ``flush``
    records the live state of each dirty key (its changelog record). (A state store of its
    own, not a DictStore subclass: the compiled evaluator's classes take no Python subclasses.)"""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, Any]] = {}
        self.dirty: set[str] = set()
        self.log: dict[str, bytes | None] = {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.data.get(key)

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.data[key] = value
        self.dirty.add(key)

    def delete(self, key: str) -> None:
        self.data.pop(key, None)
        self.dirty.add(key)

    def flush(self) -> None:
        for key in self.dirty:
            st = self.data.get(key)
            self.log[key] = None if st is None else orjson.dumps(st, option=orjson.OPT_SORT_KEYS)
        self.dirty.clear()


def new_store(made: list[ChangelogStore], _stream: str) -> ChangelogStore:
    made.append(ChangelogStore())
    return made[-1]


@pytest.mark.parametrize("pack", PACKS, ids=lambda p: p.name)
def test_batches_write_the_changelog_of_one_event_at_a_time(
    pack: Path, recorded: list[tuple[str, Event]]
) -> None:
    """What a restart would resume from: after every batch (a commit), the changelog the
    batch path wrote equals the one the same events wrote one at a time. A one-call path
    that changed a state without writing it (or wrote what on_event does not) fails here."""
    ruleset = load_rules([pack])
    for size in (7, 64):
        ones: list[ChangelogStore] = []
        bats: list[ChangelogStore] = []
        one = Engine(ruleset, partitions=2, tables=tables(), stores=partial(new_store, ones))
        eng = Engine(ruleset, partitions=2, tables=tables(), stores=partial(new_store, bats))
        for n, batch in enumerate(batches(recorded, size)):
            for s, e in batch:
                one.process(s, e)
            eng.process_batch(batch)
            for a, b in zip(ones, bats, strict=True):
                a.flush()
                b.flush()
                assert a.log == b.log, f"batches of {size}: changelogs differ after batch {n}"
        assert any(s.log for s in ones), "nothing was written: the comparison would prove nothing"


def test_a_pending_streak_across_batches_is_written_as_one_event_at_a_time(tmp_path: Path) -> None:
    """A streak that pends over several batches (consecutive and for): each batch that
    counts it up to ``consecutive`` writes it, as on_event does, so a restart resumes it."""
    (tmp_path / "r.yaml").write_text(
        "rules:\n"
        "  - {id: streak, source: sensors, where: temperature > 50, consecutive: 6, for: 9m,\n"
        "     group_by: [device_id], severity: warning}\n"
    )
    ruleset = load_rules([tmp_path])
    temps = [*range(60, 72), 10, *range(60, 68), 10]  # fires at its 10th minute; then breaks at 8
    recorded = [
        ("sensors", Event("d1", t, {"device_id": "d1", "ts": format_ts(t), "temperature": float(v)}))
        for t, v in ((1_700_000_000_000 + i * 60_000, v) for i, v in enumerate(temps))
    ]
    one_store, batch_store = ChangelogStore(), ChangelogStore()
    one = Engine(ruleset, stores=lambda _name: one_store)
    eng = Engine(ruleset, stores=lambda _name: batch_store)
    alerts: dict[str, list[str]] = {"one": [], "batch": []}
    for batch in batches(recorded, 3):
        for s, e in batch:
            alerts["one"] += [a.status for a in one.process(s, e).alerts]
        alerts["batch"] += [a.status for a in eng.process_batch(batch).alerts]
        one_store.flush()
        batch_store.flush()
        assert one_store.log == batch_store.log
    assert alerts["one"] == alerts["batch"] == ["pending", "firing", "resolved", "pending", "inactive"]


@pytest.mark.parametrize("group_by", [("status",), ("host", "status"), ()])
def test_a_batch_groups_its_rows_as_one_event_at_a_time(tmp_path: Path, group_by: tuple[str, ...]) -> None:
    """The batch's group keys (inlined for one field) are group_and_suffix's, for any value type."""
    (tmp_path / "r.yaml").write_text(
        f"rules:\n  - {{id: r, source: logs, where: status > 0, group_by: [{', '.join(group_by)}]}}\n"
    )
    rule = load_rules([tmp_path]).rules[0]
    rows: list[dict[str, Any] | None] = [
        {"host": "a", "status": 200},
        {"host": "a", "status": 200.5},
        {"host": "a", "status": None},
        {"host": "b"},
        None,
        {"host": "b", "status": True},
        {"host": "b", "status": "404"},
        {"host": "b", "status": "404"},
    ]
    keys, ends = Rows(rows).groups(rule, group_by)
    assert keys == [None if r is None else group_and_suffix(rule, r) for r in rows]
    # where each row's run of one group ends; a skipped row (None) ends the run before it
    assert (
        ends
        == {
            ("status",): [1, 2, 4, 4, 5, 6, 8, 8],  # a NULL status and a missing one: one group, ""
            ("host", "status"): [1, 2, 3, 4, 5, 6, 8, 8],
            (): [4, 4, 4, 4, 5, 8, 8, 8],
        }[group_by]
    )


def test_the_condition_gate_skips_only_events_the_logic_would_ignore(
    recorded: list[tuple[str, Event]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch path skips an event whose ``where`` is not TRUE for kinds that ignore it
    (``where_gate``: always, or for a threshold group without state). The transitions
    are held equal above; here, that the skip runs: far fewer ``on_event`` calls in
    batches than one at a time, for each gated kind of the pack."""
    calls: Counter = Counter()

    def counting(cls: type) -> None:
        original = cls.on_event

        def on_event(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls[cls.__name__] += 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "on_event", on_event)

    for cls in (SlidingLogic, ChangeLogic):
        counting(cls)
    ruleset = load_rules([KINDS])
    one = Engine(ruleset, partitions=2, tables=tables())
    expected = outcome(one, [one.process(s, e) for s, e in recorded])
    by_one = Counter(calls)
    calls.clear()
    eng = Engine(ruleset, partitions=2, tables=tables())
    got = outcome(eng, [eng.process_batch(b) for b in batches(recorded, 64)])
    assert got == expected
    if native.active():
        return  # compiled callers do not see the counting patch; make test's plain pass counts
    # neither has a one-call path (fold_many): every call saved is a gated event
    assert calls["SlidingLogic"] * 10 < by_one["SlidingLogic"]  # (~2 % of its 10,004 here)
    assert calls["ChangeLogic"] < by_one["ChangeLogic"] - 5_000  # (~22,000 of ~32,000)
