"""A stream partition's evaluator kept live between micro-batches in a Python worker
(``jobs.streams.LIVE_EVALUATORS``) gives what an evaluator restored from the stored JSON gives,
batch by batch: the alerts, the late counts, the refused events and the state stored.

The kinds suite's rules and input (sequences, changes, new terms, every window kind, absence,
``keep_firing_for``, ``no_data``, event-time order), cut into micro-batches of several sizes;
no Spark: :class:`jobs.streams.StreamRunner` is what the workers run."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import orjson
import pandas as pd
import pytest
from pyspark import cloudpickle

from app.rules.loader import load_rules
from jobs.compile import plan_rules
from jobs.state import LIVE_STATES, STATE_CODEC, GroupRunner, encode_states, streaming_fn, take_live
from jobs.streams import LIVE_EVALUATORS, StreamRunner, make_room, stream_key
from tests.conformance.kind_cases import RULES
from tests.spark.live import Row, StoredState, parsed, rows_by_source


def stored(state: Any) -> Any:
    """The state as the next micro-batch gets it from Spark's state store: through JSON."""
    return None if state is None else orjson.loads(orjson.dumps(state, option=orjson.OPT_SORT_KEYS))


def through_batches(runner: StreamRunner, key: str, rows: list[Row], size: int, live: bool) -> list[Any]:
    """Each micro-batch's output and stored state; ``live``: the next batch gets the very state
    object the last one returned (as a worker that ran it does), else its stored JSON."""
    state, seen = None, []
    for i in range(0, len(rows), size):
        out, after = runner.run_key(key, rows[i : i + size], state)
        if live and after is not None:
            assert LIVE_EVALUATORS[runner.token, key][0] is after  # kept for the next batch
        seen.append(([parsed(r) for r in out], stored(after)))
        state = after if live else stored(after)
    return seen


@pytest.mark.parametrize("size", [9, 250])
def test_a_live_evaluator_gives_what_a_restored_one_gives(size: int) -> None:
    plan = plan_rules(load_rules([RULES]))
    specs = [dataclasses.replace(s, native=()) for s in plan.streams]  # conditions in Python here
    by_source = rows_by_source()
    kept, alerts, late = 0, 0, 0
    for spec in specs:
        if any(r.rule.enrich or r.rule.expect_from for r in plan.stream_rules if r.id in spec.rule_ids):
            continue  # an evaluator with registry tables is never kept live (their follower's)
        rows = by_source.get(spec.source, [])
        key = stream_key(spec.name, 0)
        runner = StreamRunner(plan.stream_rules, specs, 1, max_skew_ms=-1)
        restored = through_batches(runner, key, rows, size, live=False)
        live = through_batches(runner, key, rows, size, live=True)
        assert live == restored, spec.name
        kept += 1
        alerts += sum(r[0] == "alert" for out, _ in live for r in out)
        late += sum(r[0] == "late" for out, _ in live for r in out)
    assert kept >= 3 and alerts >= 20 and late >= 1, (kept, alerts, late)  # something was compared


def found(frames: Iterator[pd.DataFrame]) -> list[str]:
    """The ``state`` rows of a group's output: where its state came from; no other row."""
    rows = [r for f in frames for r in f.itertuples(index=False)]
    assert {r.kind for r in rows} <= {"state"}, rows
    return [r.value for r in rows]


def test_the_live_states_outlive_the_copy_of_the_function_spark_ships() -> None:
    """Spark ships the stateful function to the workers by value, with a copy of the globals
    it reads: the live states must be the module's, seen by every copy (a cache inside the
    closure was empty in each task, and nothing was ever reused)."""
    runner = GroupRunner(plan_rules(load_rules([RULES])))
    first, second = (cloudpickle.loads(cloudpickle.dumps(streaming_fn(runner))) for _ in range(2))
    empty = encode_states({}, STATE_CODEC)
    state = StoredState(None)
    assert found(first(("b",), iter([]), state)) == ["new"]  # no output but where its state came from
    assert LIVE_STATES[runner.token, ("b",)][0] == empty  # kept where the next copy looks
    assert found(second(("b",), iter([]), StoredState(empty))) == ["live"]
    assert take_live((runner.token, ("b",)), empty) == {}
    assert (runner.token, ("b",)) not in LIVE_STATES  # taken


def test_live_states_serve_only_the_json_they_stored() -> None:
    slot = ("some-query", ("bucket",))
    LIVE_STATES[slot] = ('{"k":1}', {"k": 1})
    assert take_live(slot, '{"k":2}') is None  # the store holds another batch's state
    assert slot not in LIVE_STATES  # and the stale one is gone


def test_a_full_worker_drops_the_live_states_of_other_queries_first() -> None:
    """A worker keeps at most so many groups live (``jobs.state.MAX_LIVE_STATES``): when full,
    it drops those of other queries (stopped, or run before in the same worker) and keeps the
    running one's; only when all are the running query's are all dropped."""
    cache = {("old", 1): "a", ("new", 1): "b", ("old", 2): "c", ("new", 2): "d"}
    assert make_room(cache, "new", 5) == [] and len(cache) == 4  # not full
    assert make_room(cache, "new", 4) == [("old", 1), ("old", 2)]
    assert cache == {("new", 1): "b", ("new", 2): "d"}
    assert make_room(cache, "new", 2) == [("new", 1), ("new", 2)] and cache == {}
