"""Spark's Python worker daemon for this project (``spark.python.daemon.module``).

It activates the compiled hot path (:func:`app.runtime.native.activate`) and then runs
pyspark's own daemon, whose forked workers inherit it: the rules that run inside
Spark's Python workers use the same compiled evaluator as the Faust worker.

It also sets the garbage collector's thresholds of the processes that hold the evaluator's
state (:func:`app.runtime.heap.tune_collector`), inherited by the forked workers: a stream
partition's state is restored from JSON at every micro-batch, tens of thousands of objects,
and with Python's defaults the collector walked them again and again (a full collection
every other micro-batch, 100 ms and more each). In one process, each setting three times in
turn, the windowed bench pack went from 38,081 / 43,103 / 41,636 to 43,131 / 45,295 /
46,822 events/s at 200,000-event batches (docs/spark.md).

And a reused worker collects only the young generations between tasks
(:class:`YoungCollections`): pyspark's daemon runs a full ``gc.collect()`` after every task,
which walks every live object of the worker, and a worker keeps the live state of the stream
partitions it ran (``jobs.state.LIVE_STATES``, ``jobs.streams.LIVE_EVALUATORS``): a cost per
task that grew with the fleet, not with the micro-batch. The collector's own full
collections still run, when the long-lived objects grew by a quarter (docs/spark.md).
"""

from __future__ import annotations

import gc

from pyspark import daemon

from app.runtime import heap, native


class YoungCollections:
    """Stands in for the ``gc`` module in pyspark's daemon, which calls ``gc.collect()``
    after every task of a reused worker: a collection of the two young generations, which
    frees the cycles the task left unless they outlived its own collections."""

    @staticmethod
    def collect() -> int:
        return gc.collect(1)


def main() -> None:
    heap.tune_collector()
    native.activate()
    daemon.gc = YoungCollections()  # type: ignore[assignment]  # read by the forked workers' loop
    daemon.manager()


if __name__ == "__main__":
    main()
