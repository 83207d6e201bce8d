"""A stream partition split in parts (``APP_SPARK_STREAM_SPLIT``, docs/spark.md): each part's
evaluator takes its own groups' events and every other event of the partition as a tick (its
time only). Without Spark: the stream runner's parts, over the conformance suite's input in
micro-batches with their state carried, give the output of the partition's one evaluator, line
for line per fingerprint: windows, lateness, absences (of registry keys too), changes, sequences,
the time bound's held and refused events, late copies and branches; and across rule edits, the
alerts the restore's sweep ends."""

from __future__ import annotations

import dataclasses
import io
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.backtest import BacktestReport, backtest, read_events
from app.placement import partition_for
from app.rules.loader import load_rules
from app.rules.retire import RulesRan
from app.runtime.settings import Settings
from jobs.compile import SparkPlan, plan_rules
from jobs.streams import (
    StreamRunner,
    parse_stream_key,
    place,
    router,
    split_keys,
    stream_key,
    stream_keys,
    sub_of,
)
from tests.conformance.kind_cases import RULES, lines_for_test, tables
from tests.conformance.threshold_cases import at
from tests.regrouped import REGROUPED, regrouped_logs

PARTITIONS = 2
SKEW_MS = Settings.from_env({}).max_event_skew_ms


def _plan(paths: list[Path]) -> SparkPlan:
    plan = plan_rules(load_rules(paths), every_rule=True)
    # no native conditions here (they come from Spark SQL): each rule's where runs as its closure
    return dataclasses.replace(plan, streams=tuple(dataclasses.replace(s, native=()) for s in plan.streams))


def _rows(lines: list[bytes], plan: SparkPlan, split: int) -> list[tuple[str, tuple[Any, ...]]]:
    """(stream key, runner row) of every event, in input order, as the query's tasks give them:
    with a split, one row per part of the event's partition, the others' ticks (``holds``
    False, the event's key for its fields)."""
    routes = router(plan.streams, PARTITIONS, record_partitions=False, split=split)
    assert routes is not None
    out = []
    for offset, (source, ev) in enumerate(read_events(lines, "input", BacktestReport())):
        part = partition_for(ev.key.encode(), PARTITIONS)
        for key in routes.keys(source, part, ev):
            row = (orjson.dumps(ev.fields), None, ev.ts_ms, part, offset, source, None, None)
            if split == 1:
                out.append((key, row))
                continue
            for sibling in split_keys(*parse_stream_key(key), split):
                out.append((sibling, row if sibling == key else (ev.key, False, *row[2:])))
    return out


def _runner(plan: SparkPlan, split: int, ran: RulesRan | None = None) -> StreamRunner:
    specs, rules = plan.streams, plan.stream_rules
    return StreamRunner(rules, specs, PARTITIONS, tables=tables(), max_skew_ms=SKEW_MS, split=split, ran=ran)


def _run(
    plan: SparkPlan, rows: list[tuple[str, tuple[Any, ...]]], split: int, batch: int,
    runner_of: Callable[[int], StreamRunner] | None = None,
) -> list[Any]:  # fmt: skip
    """The runner's output rows over ``rows`` in micro-batches of ``batch`` events, each key's
    state carried from one to the next (a key with no row in a batch is not called, as in Spark).
    ``runner_of``: the runner of the n-th batch; by default one runner of ``plan`` takes them all."""
    if runner_of is None:
        one = _runner(plan, split)
        runner_of = lambda _n: one  # noqa: E731
    states: dict[str, Any] = {}
    out: list[Any] = []
    offsets = sorted({r[4] for _, r in rows})
    for n, start in enumerate(range(0, len(offsets), batch)):
        runner = runner_of(n)
        lo, hi = offsets[start], offsets[min(start + batch, len(offsets)) - 1]
        by_key: dict[str, list[tuple[Any, ...]]] = {}
        for key, row in rows:
            if lo <= row[4] <= hi:
                by_key.setdefault(key, []).append(row)
        for key, mine in by_key.items():
            produced, states[key] = runner.run_key(key, mine, states.get(key))
            out += produced
    return out


Summary = tuple[dict[str, list[tuple[str, str]]], Counter[Any], int]


def _summary(rows: Iterable[Any]) -> Summary:
    """Per fingerprint its transitions in order (id, status); every other row but the late
    count as a multiset; the late count."""
    alerts: dict[str, list[tuple[str, str]]] = {}
    others: Counter[Any] = Counter()
    late = 0
    for kind, topic, key, value, part, offset, _seq, rule, status, alert_id in rows:
        if kind == "alert":
            alerts.setdefault(key, []).append((alert_id, status))
        elif kind == "late":
            late += int(value)
        elif kind == "refused":  # the record, less the wall clock of its making
            record = {k: v for k, v in orjson.loads(value).items() if k != "received_at"}
            others[(kind, topic, key, orjson.dumps(record), part, offset, rule)] += 1
        else:
            others[(kind, topic, key, value, part, offset, rule)] += 1
    return alerts, others, late


def _differences(got: Summary, want: Summary) -> list[Any]:
    """What differs, small enough to read (a whole summary is thousands of rows)."""
    fingerprints = sorted(f for f in set(got[0]) | set(want[0]) if got[0].get(f) != want[0].get(f))
    out: list[Any] = [(f, got[0].get(f), want[0].get(f)) for f in fingerprints[:5]]
    out += [("extra", k) for k in list(got[1] - want[1])[:5]]
    out += [("missing", k) for k in list(want[1] - got[1])[:5]]
    return out + ([("late", got[2], want[2])] if got[2] != want[2] else [])


def _with_future_dated(lines: list[bytes]) -> list[bytes]:
    """``lines`` with events from clocks decades or weeks ahead among them, early enough for the
    clock to move on a day past them: each part holds them, and refuses its own."""
    far = [
        {"device_id": "w-2", "ts": "2099-12-31T00:00:00Z", "temperature": 20.0},
        {"device_id": "machine-temp-1", "ts": "2099-12-31T00:00:00Z", "temperature": 120.0},
        {"host": "www-9", "ts": "2099-12-31T00:00:00Z", "client_ip": "10.0.0.9", "path": "/x", "status": 404},
        {"device_id": "w-1", "ts": at(600 + 30 * 24 * 60), "temperature": 20.0},
    ]
    out = list(lines)
    for i, event in zip((500, 1500, 2500, 3500), far, strict=True):
        out.insert(i, orjson.dumps(event))
    return out


@pytest.mark.parametrize(("split", "batch"), [(2, 97), (3, 100_000)])
def test_the_parts_of_a_partition_give_its_one_evaluators_output(split: int, batch: int) -> None:
    plan = _plan([RULES])
    lines = _with_future_dated(lines_for_test())
    whole = _summary(_run(plan, _rows(lines, plan, 1), 1, batch))
    parts = _summary(_run(plan, _rows(lines, plan, split), split, batch))
    assert not _differences(parts, whole)
    alerts, others, late = whole
    kinds = {k[0] for k in others}
    assert len(alerts) > 20 and late > 0, (len(alerts), late)
    assert {"refused", "routed", "side"} <= kinds, kinds


def test_the_parts_of_regrouped_streams_give_their_one_evaluators_output(tmp_path: Path) -> None:
    rules = tmp_path / "regrouped.yaml"
    rules.write_text(REGROUPED)
    plan = _plan([rules])
    lines = [v for _, v in regrouped_logs(1200)]
    whole = _summary(_run(plan, _rows(lines, plan, 1), 1, 150))
    assert not _differences(_summary(_run(plan, _rows(lines, plan, 2), 2, 150)), whole)
    report = BacktestReport()
    want = backtest(
        load_rules([rules]), read_events(lines, "logs", report), io.StringIO(), report,
        partitions=PARTITIONS, max_skew_ms=SKEW_MS,
    )  # fmt: skip
    on_streams = {r.id for r in plan.stream_rules}  # the windows; the streak takes the keyed path
    assert on_streams == {"burst-403", "per-ip-minute"}
    assert sum(len(v) for v in whole[0].values()) == len([a for a in want if a.rule_id in on_streams]) == 53


def test_a_part_is_one_hash_of_the_group_apart_from_its_partition() -> None:
    texts = [f"device-{i}" for i in range(2000)]
    placed = [place(t, 4, 3) for t in texts]
    assert [p for p, _ in placed] == [partition_for(t.encode(), 4) for t in texts]
    # every part of every partition is used, about evenly
    counts = Counter(placed)
    assert len(counts) == 12 and min(counts.values()) > 2000 / 12 / 2, counts
    assert place("device-1", 4, 1) == (partition_for(b"device-1", 4), 0)


def test_split_keys_name_their_partition_and_part_and_unsplit_ones_stay_as_they_were() -> None:
    assert stream_keys("sensors", 2) == [stream_key("sensors", 0), stream_key("sensors", 1)]
    keys = stream_keys("sensors", 2, 3)
    assert len(set(keys)) == 6 and not set(keys) & set(stream_keys("sensors", 2))
    assert [sub_of(k) for k in keys] == [0, 1, 2, 0, 1, 2]
    assert keys[3:] == split_keys("sensors", 1, 3)


def test_a_runner_of_whole_partitions_takes_no_row_for_a_tick() -> None:
    """Only a split partition's parts have ticks: unsplit, a row's ``holds`` (the keyed path's
    column, NULL in every stream row the query makes) changes nothing."""
    plan = _plan([RULES])
    rows = _rows(lines_for_test()[:3000], plan, 1)
    falsy = [(key, (row[0], False, *row[2:])) for key, row in rows]
    assert not _differences(_summary(_run(plan, falsy, 1, 500)), _summary(_run(plan, rows, 1, 500)))


#: rules an edit removes mid-stream: windows, an absence, a threshold and a change of their
#: streams (each stream keeps other rules, so its keys go on being read)
REMOVED = {"hourly-heat", "device-silent", "plain-hot", "not-found-burst", "long-visit", "day-jump"}


def _without(text: str, ids: set[str]) -> str:
    """A rule file's text less the rules of ``ids`` (a rule: the lines from its ``  - ``)."""
    blocks: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if line.startswith("  - "):
            blocks.append([])
        blocks[-1].append(line)
    named = {b[0].split("id:")[1].split(",")[0].strip(): b for b in blocks[1:]}
    assert ids <= set(named), ids - set(named)
    return "".join("".join(b) for b in [blocks[0], *(b for i, b in named.items() if i not in ids)])


def _reloaded(
    before: SparkPlan, after: SparkPlan, rows: list[tuple[str, tuple[Any, ...]]], split: int, every: int
) -> list[Any]:
    """:func:`_run`'s output over ``rows`` in micro-batches of ``every`` events, each run by a
    new runner of ``after``'s rules and ``before``'s in turn, which restores each key from the
    state carried: as the query restarts on edited files (``jobs.engine.RuleFollower``), with
    the record of the rules it ran."""
    ran = RulesRan.of(r.facts for r in [x.rule for x in before.rules] + list(before.stream_rules))
    return _run(before, rows, split, every, lambda n: _runner(after if n % 2 else before, split, ran))


@pytest.mark.parametrize("split", [2, 3])
def test_a_rule_edit_ends_the_removed_rules_alerts_in_every_part_as_in_the_partition(
    tmp_path: Path, split: int
) -> None:
    """A restarted query on edited files restores each part from its own group's state and
    sweeps the states of rules no longer running: each part ends the open alerts of its own
    groups, at the partition's clock, so the parts end what the partition's one evaluator ends,
    with the same ids, and the rules left go on as they would. Here the rules are removed and
    put back in turn, every 300 events (a window, a threshold and a change end open alerts)."""
    path = tmp_path / "edited.yaml"
    path.write_text(_without(RULES.read_text(), REMOVED))
    before, after = _plan([RULES]), _plan([path])
    assert {s.name for s in before.streams} == {s.name for s in after.streams}
    lines = lines_for_test()
    whole = _reloaded(before, after, _rows(lines, before, 1), 1, 300)
    parts = _reloaded(before, after, _rows(lines, before, split), split, 300)
    assert not _differences(_summary(parts), _summary(whole))
    ended = [orjson.loads(r[3]) for r in whole if r[0] == "alert"]
    retired = Counter(a["rule_id"] for a in ended if "retired" in a["annotations"])
    assert len(retired) >= 3 and set(retired) <= REMOVED, retired
