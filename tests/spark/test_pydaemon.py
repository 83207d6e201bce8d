"""Spark's Python workers run under ``jobs.pydaemon``: the evaluator's collector thresholds, and
only young collections between the tasks of a reused worker."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql import SparkSession

from app.runtime.heap import GC_THRESHOLDS

ATTEMPTS = 6


def _probe(spark: SparkSession) -> tuple[int, int, int, tuple[int, ...]]:
    """One task of a query (as the engine's run): its worker's pid, the collections of the
    middle and the oldest generation so far, and the collector's thresholds."""

    def probe(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import gc
        import os

        for _ in frames:
            stats = gc.get_stats()
            yield pd.DataFrame(
                {"pid": [os.getpid()], "middle": [stats[1]["collections"]], "full": [stats[2]["collections"]],
                 "threshold": [list(gc.get_threshold())]}
            )  # fmt: skip

    (row,) = (
        spark.range(1).mapInPandas(probe, "pid long, middle long, full long, threshold array<long>").collect()
    )
    return row.pid, row.middle, row.full, tuple(row.threshold)


def test_a_reused_worker_runs_no_full_collection_between_tasks(spark: SparkSession) -> None:
    # pyspark's daemon collects after every task; a full collection walked the live state the
    # worker keeps for its stream partitions, at every task. Two tasks one after the other in
    # one worker (Spark hands a task the worker idle the longest, so others ran in between):
    # between them a young collection ran (middle generation +1), a full one did not.
    last: dict[int, tuple[int, int, int, tuple[int, ...]]] = {}
    pairs = []
    for _ in range(ATTEMPTS):
        probe = _probe(spark)
        if probe[0] in last:
            pairs.append((last[probe[0]], probe))
        last[probe[0]] = probe
    assert pairs, f"no worker ran two of {ATTEMPTS} tasks"
    for first, second in pairs:
        assert second[3] == GC_THRESHOLDS
        assert second[1] > first[1], "no young collection between the tasks"
        assert second[2] == first[2], "a full collection ran between the tasks"
