"""A state group's live state served by the worker process that holds it (``jobs.peers``):
another process's task for the group gets the output and the stored value that the live state
gives, with no restore; a stale owner, a forged request and an owner gone leave the asker to
restore the state from the stored value, as before.

Two real processes, as two Python workers of one executor: this test's, and an owner started
with a copy of the same pickled function (as Spark ships it), which runs the first micro-batch
and then waits on its stdin, its interpreter free, as an idle worker waits for Spark."""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle

from app.rules.loader import load_rules
from app.runtime.settings import PROJECT_ROOT
from jobs import peers
from jobs.compile import plan_rules
from jobs.state import GroupRunner, streaming_fn
from jobs.streams import StreamRunner, stream_key
from tests.conformance.kind_cases import RULES
from tests.procs import stop
from tests.spark.live import StoredState, parsed, rows_by_source

pytestmark = pytest.mark.skipif(not peers.ENABLED, reason="abstract socket names: Linux only")

#: the owner: runs the first micro-batch with its copy of the function, writes the stored value,
#: says so, then waits (answering on its thread) until its stdin closes
OWNER = """
import sys
from pyspark import cloudpickle
from tests.spark.live import StoredState
fn, bucket, first = cloudpickle.loads(open(sys.argv[1], "rb").read())
state = StoredState(None)
found = [r.value for f in fn(bucket, iter([first]), state) for r in f.itertuples() if r.kind == "state"]
open(sys.argv[2], "wb").write(state.value)
print(*found, flush=True)
sys.stdin.read()
"""


def frame(key: str, rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    """A group's task rows as pyspark hands them to the stateful function."""
    columns = ["__fields", "__holds", "__ts_ms", "__part", "__offset", "__source", "__dlq", "__conds"]
    return pd.DataFrame([(key, *r) for r in rows], columns=["__key", *columns])


def run(fn: Any, bucket: Any, pdf: pd.DataFrame, stored: bytes | None) -> tuple[list[Any], bytes, list[str]]:
    """One micro-batch of a copy of the function: its output rows (alerts parsed), the value it
    stores and where its state came from."""
    state = StoredState(stored)
    rows = [
        tuple(None if v != v else v for v in r)  # NaN: pandas' empty number
        for f in fn(bucket, iter([pdf]), state)
        for r in f.itertuples(index=False)
    ]
    out = [parsed(r) for r in rows if r[0] != "state"]
    assert isinstance(state.value, bytes)
    return out, state.value, [r[3] for r in rows if r[0] == "state"]


def copy(fn: Any) -> Any:
    """The function as another task gets it: unpickled from what Spark ships."""
    return cloudpickle.loads(cloudpickle.dumps(fn))


@pytest.fixture
def batches() -> tuple[Any, str, list[pd.DataFrame]]:
    """A maker of runners (each a query of its own) for one stream of the kinds suite, its
    stream key and its events in three micro-batches."""
    plan = plan_rules(load_rules([RULES]))
    specs = [dataclasses.replace(s, native=()) for s in plan.streams]  # conditions in Python here
    by_source = rows_by_source()
    spec = next(
        s for s in specs if not any(
            r.rule.enrich or r.rule.expect_from for r in plan.stream_rules if r.id in s.rule_ids
        ) and len(by_source.get(s.source, [])) >= 30
    )  # fmt: skip
    key = stream_key(spec.name, 0)
    rows = by_source[spec.source]
    third = len(rows) // 3
    parts = [rows[:third], rows[third : 2 * third], rows[2 * third :]]

    def runner() -> GroupRunner:
        return GroupRunner(plan, StreamRunner(plan.stream_rules, specs, 1, max_skew_ms=-1))

    return runner, key, [frame(key, p) for p in parts]


@pytest.fixture
def owner_process(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(fn: Any, bucket: Any, first: pd.DataFrame) -> tuple[subprocess.Popen[bytes], bytes, str]:
        shipped, stored = tmp_path / "fn.pickle", tmp_path / "stored"
        shipped.write_bytes(cloudpickle.dumps((fn, bucket, first)))
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        proc = subprocess.Popen(
            [sys.executable, "-c", OWNER, str(shipped), str(stored)], cwd=PROJECT_ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the owner did not run its micro-batch within 60 s"
        return proc, stored.read_bytes(), proc.stdout.readline().decode().strip()

    yield start
    for proc in procs:
        stop(proc, grace_s=5)


def test_a_task_in_another_worker_is_run_by_the_live_state_where_it_is_held(
    batches: tuple[Any, str, list[pd.DataFrame]], owner_process: Any
) -> None:
    new_runner, key, (b1, b2, b3) = batches
    bucket = (key,)

    # what one worker that ran every batch gives (its live state, batch after batch)
    alone = streaming_fn(new_runner())
    want1, stored1, _ = run(alone, bucket, b1, None)
    want2, stored2, found2 = run(alone, bucket, b2, stored1)
    want3, stored3, _ = run(alone, bucket, b3, stored2)
    assert found2 == ["live"]
    assert sum(r[0] == "alert" for r in want1 + want2 + want3) >= 3, "something to compare"

    runner = new_runner()
    fn = streaming_fn(runner)
    _, got1, found1 = owner_process(copy(fn), bucket, b1)
    assert (got1, found1) == (stored1, "new")

    # this process's tasks: the owner's live state runs them, with no restore here
    assert run(copy(fn), bucket, b2, got1) == (want2, stored2, ["peer"])
    slot = (runner.token, bucket)
    assert not peers.owner().owns(slot)
    # a request not signed with the query's secret is dropped unread; the owner goes on
    assert peers.ask(slot, b"\0" * 32, peers.digest(stored2), b3) is None
    assert run(copy(fn), bucket, b3, stored2) == (want3, stored3, ["peer"])

    # batch 3 run again from what batch 2 stored (its first run failed after the owner ran
    # it): the owner's live state is past that value, so it lets go and this worker restores
    assert run(copy(fn), bucket, b3, stored2) == (want3, stored3, ["stored"])
    assert peers.owner().owns(slot)  # and answers for it from now on
    assert run(copy(fn), bucket, b3, stored2)[2] == ["stored"]  # its live state is at stored3

    # an owner gone: no one at the name, so the state is restored
    fn = streaming_fn(new_runner())
    owner, got1, _ = owner_process(copy(fn), bucket, b1)
    stop(owner, grace_s=5)
    assert run(copy(fn), bucket, b2, got1) == (want2, stored2, ["stored"])
