"""The order in which a state key's rows run (``jobs.state.arrival_order``): each Kafka
partition's rows in offset order, and a key fed by several partitions (a regrouped stream,
a threshold grouped by another field than the topic key, the dead letters) merged by
arrival, then event time, then partition and offset."""

from __future__ import annotations

import numpy as np
import pandas as pd

from jobs.state import arrival_order


def _order(
    codes: list[int],
    part: list[int],
    offset: list[int],
    arrival: list[float | None] | None,
    ts: list[float | None] | None = None,
) -> list[int]:
    return arrival_order(
        np.array(codes, dtype=np.int64),
        np.array(part, dtype=np.int64),
        np.array(offset, dtype=np.int64),
        None if arrival is None else pd.Series(arrival, dtype="float64"),
        np.zeros(len(codes)) if ts is None else np.array(ts, dtype="float64"),
    )


def test_one_partitions_rows_keep_their_offset_order_whatever_their_times() -> None:
    # arrival and event time go back at offset 2: still offsets 1, 2, 3 (rows 2, 0, 1)
    assert _order([0, 0, 0], [1, 1, 1], [2, 3, 1], [50.0, 10.0, 40.0], [5.0, 1.0, 9.0]) == [2, 0, 1]


def test_two_partitions_are_merged_by_arrival_each_in_its_offset_order() -> None:
    # partition 0: offsets 0, 1 arrived at 10, 30; partition 1: offsets 0, 1 at 20, 40
    rows = _order([0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1], [10.0, 30.0, 20.0, 40.0])
    assert rows == [0, 2, 1, 3]
    # before: partition 0's rows, then partition 1's ([0, 1, 2, 3]), whatever their times
    # a partition whose arrival goes back (a producer's clock) keeps its order: its running
    # maximum (30, 30) places its second row with the first
    assert _order([0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1], [30.0, 5.0, 20.0, 40.0]) == [2, 0, 1, 3]


def test_rows_that_arrived_in_the_same_millisecond_go_by_event_time() -> None:
    # a replay: all four in one millisecond, event times 1, 3 (partition 0) and 2, 4 (partition 1)
    assert _order([0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1], [7.0] * 4, [1.0, 3.0, 2.0, 4.0]) == [0, 2, 1, 3]
    # ties of both: partition, then offset
    assert _order([0, 0, 0, 0], [1, 1, 0, 0], [0, 1, 0, 1], [7.0] * 4, [1.0] * 4) == [2, 3, 0, 1]


def test_keys_stay_apart_and_rows_without_arrival_keep_partition_and_offset_order() -> None:
    # two keys: each merged on its own, key 0's rows first
    assert _order([1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0], [5.0, 2.0, 1.0, 3.0]) == [1, 3, 2, 0]
    # a file's lines (no arrival, one partition), or NULL arrivals: (partition, offset)
    assert _order([0, 0, 0], [0, 0, 0], [2, 0, 1], None) == [1, 2, 0]
    assert _order([0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 1, 1], [None] * 4) == [1, 3, 0, 2]
