"""Helpers of the live-state tests (``tests/spark/test_live_state.py``, ``test_peers.py``): the
kinds suite's events as the stream path's task rows, what the stateful function reads and
writes of Spark's ``GroupState``, and output rows with their alert's JSON parsed."""

from __future__ import annotations

from typing import Any

import orjson

from app.backtest import BacktestReport, read_events
from tests.conformance.kind_cases import lines_for_test

Row = tuple[Any, ...]


def rows_by_source() -> dict[str, list[Row]]:
    """The suite's events as the stream path's task rows, per source, in input order."""
    out: dict[str, list[Row]] = {}
    for offset, (source, ev) in enumerate(read_events(lines_for_test(), "kinds", BacktestReport())):
        row = (orjson.dumps(ev.fields).decode(), None, ev.ts_ms, 0, offset, source, None, None)
        out.setdefault(source, []).append(row)
    return out


def parsed(row: Row) -> Row:
    """An output row with its alert's JSON parsed: a live state's dicts keep the order their
    keys came in, as the Faust worker's do, where a restored one has JSON's sorted order, and
    an alert's ``values`` come from them."""
    return (*row[:3], orjson.loads(row[3]), *row[4:]) if row[0] == "alert" else row


class StoredState:
    """What the pandas function reads and writes of Spark's ``GroupState``."""

    def __init__(self, value: str | bytes | None) -> None:
        self.value = value

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[str | bytes]:
        assert self.value is not None
        return (self.value,)

    def update(self, value: tuple[str | bytes]) -> None:
        self.value = value[0]
