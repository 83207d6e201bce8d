"""DataFrames a Spark backtest computes once and reads more than once, persisted for the run.

A backtest's native plans (``jobs.backtest.run_backtest``) ask for some of the same results
more than once: each stream's clocks (``jobs.windows.clocked``) for the partition check, then
for the native windows, absence and event alerts. Each is a shuffle, a sort and a running
``max`` over all of the stream's events. Inside :func:`holding`, :func:`hold` persists such
a result; Spark's cache then serves every later plan equal to it, so the callers need not
share the DataFrame itself. Everything persisted is released when :func:`holding` exits.
Outside it, :func:`hold` returns the DataFrame as it is (the streaming query, whose plans
run once per micro-batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from pyspark import StorageLevel
from pyspark.sql import DataFrame

#: what was persisted inside :func:`holding` (None outside it)
_HELD: ContextVar[list[DataFrame] | None] = ContextVar("held", default=None)


@contextmanager
def holding(*persisted: DataFrame) -> Iterator[None]:
    """Within it :func:`hold` persists; at the exit all of it is released,
    and so are ``persisted`` (the caller's own, e.g. a backtest's cached decode)."""
    held_here: list[DataFrame] = list(persisted)
    token = _HELD.set(held_here)
    try:
        yield
    finally:
        _HELD.reset(token)
        for df in held_here:
            df.unpersist()


def hold(df: DataFrame) -> DataFrame:
    """``df`` persisted until :func:`holding` exits (as it is outside it). A plan equal to one
    already persisted is left as it is: Spark's cache serves it, asking again would only log
    a warning, and one persisted by someone else is not this context's to release."""
    held_here = _HELD.get()
    if held_here is None or df.storageLevel != StorageLevel.NONE:
        return df
    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    held_here.append(df)
    return df
