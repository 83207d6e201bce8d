"""A stream partition's state as the Spark engine stores it after each micro-batch: encoded by
pieces (only the states the batch read, wrote or deleted, ``jobs.streams.StreamRunner.json_of``)
against encoded whole (``orjson`` of every state, as before 2026-11-28), without Spark.

Usage: ``python bench/bench_spark_state.py [--devices 100000] [--events 400000] [--batch 5000]``

One stream partition of ``bench/bench_spark.py``'s windowed pack is fed its events in
micro-batches through the stateful function the workers run (``jobs.state.streaming_fn``),
kept live between batches as a worker keeps it, with the workers' collector thresholds. After
each batch the same states are also encoded whole, in the same process. Prints the medians of
the last half of the batches (the state has grown by then) and their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from app.runtime import native  # noqa: E402

native.activate()  # as the Spark workers do (jobs.pydaemon)

import orjson  # noqa: E402
import pandas as pd  # noqa: E402
from bench_spark import WINDOWED, events  # noqa: E402

from app.events import SCHEMAS  # noqa: E402
from app.rules.loader import load_rules  # noqa: E402
from app.runtime.heap import tune_collector  # noqa: E402
from jobs import state as state_module  # noqa: E402
from jobs.compile import plan_rules  # noqa: E402
from jobs.state import LIVE_STATES, GroupRunner, streaming_fn  # noqa: E402
from jobs.streams import StreamRunner, stream_key  # noqa: E402

COLUMNS = ("__fields", "__holds", "__ts_ms", "__part", "__offset", "__source", "__dlq", "__conds")


class StoredState:
    """What the stateful function reads and writes of Spark's ``GroupState``."""

    def __init__(self) -> None:
        self.value: Any = None

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[Any]:
        return (self.value,)

    def update(self, value: tuple[Any]) -> None:
        self.value = value[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=100_000)
    ap.add_argument("--events", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=5_000, help="events per micro-batch of the partition")
    args = ap.parse_args(argv)
    tune_collector()
    with tempfile.TemporaryDirectory(prefix="bench-spark-state-") as tmp:
        (Path(tmp) / "rules.yaml").write_text(WINDOWED)
        plan = plan_rules(load_rules([Path(tmp) / "rules.yaml"]))
    specs = [dataclasses.replace(s, native=()) for s in plan.streams]  # conditions in Python here
    key = stream_key(next(s for s in specs if s.source == "sensors").name, 0)
    streams = StreamRunner(plan.stream_rules, specs, 1, max_skew_ms=-1)
    runner = GroupRunner(plan, streams)
    made: list[float] = []  # each micro-batch's JSON: by pieces, or whole where json_of gave None
    pieces_of, encode, spent = runner.json_of, state_module.encode_states, [0.0]

    def timed_pieces(states: dict[str, Any]) -> bytes | None:
        t0 = time.perf_counter()
        text = pieces_of(states)
        spent[0] = time.perf_counter() - t0
        return text

    def timed_encode(states: dict[str, Any], codec: str, text: bytes | None = None) -> str | bytes:
        t0 = time.perf_counter()
        if text is None:  # as encode_states: most states touched, or a new evaluator
            text = orjson.dumps(states, option=orjson.OPT_SORT_KEYS)
        made.append(spent[0] + time.perf_counter() - t0)
        return encode(states, codec, text)

    runner.json_of = timed_pieces  # type: ignore[method-assign]
    state_module.encode_states = timed_encode  # type: ignore[assignment]  # streaming_fn reads it at each call
    fn, state = streaming_fn(runner), StoredState()
    rows = []
    for offset, (_k, v) in enumerate(events(args.events, args.devices)):
        ev = SCHEMAS["sensors"].decode(v)
        rows.append((orjson.dumps(ev.fields).decode(), None, ev.ts_ms, 0, offset, "sensors", None, None))
    whole: list[float] = []
    for start in range(0, len(rows), args.batch):
        chunk = rows[start : start + args.batch]
        frame = pd.DataFrame(
            {"__key": [key] * len(chunk), **{c: [r[i] for r in chunk] for i, c in enumerate(COLUMNS)}}
        )
        list(fn(key, iter([frame]), state))
        states = LIVE_STATES[runner.token, key][1]
        t0 = time.perf_counter()
        text = orjson.dumps(states, option=orjson.OPT_SORT_KEYS)
        whole.append(time.perf_counter() - t0)
    half = len(whole) // 2
    by_pieces, at_once = statistics.median(made[half:]) * 1000, statistics.median(whole[half:]) * 1000
    print(
        f"{args.devices:,} devices, {args.batch:,}-event micro-batches, a state of {len(text) / 1e6:.1f} MB: "
        f"the JSON stored {by_pieces:.0f} ms (by pieces where few states were touched), "
        f"all at once {at_once:.0f} ms per micro-batch ({at_once / by_pieces:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
