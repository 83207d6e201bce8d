"""A Quix Streams peer of the rule worker: three rules of the bench pack, written by hand.

Runs in its own environment (``.cache/bench-quix``, pinned by ``bench/requirements-quix.txt``;
``peer_runs.py`` creates it and starts this script), never in the project's: quixstreams pins
its own confluent-kafka, pydantic and orjson. It imports nothing from the project.

It reads the JSON events of ``events.sensors`` and ``events.logs`` from their start, takes
event time from each event's ``ts`` (Quix's ``timestamp_extractor``), and writes one record
per firing transition to ``--out`` (JSON ``{"rule", "key", "at", "status"}``, ``at`` in epoch
ms). The rules, as the pack states them (``rules/iot.yaml``, ``rules/logs.yaml`` and the
bench's variants), and how each is done here:

* ``t-0`` (threshold): ``temperature > 80 and temperature is not null`` by ``device_id``. A
  stateful ``apply`` per key: fires at the event where the condition becomes true (``at`` =
  its time), resolves where it stops being true. As the worker does, an event older than the
  newest one of its key (once the key has matched) is late and skipped.
* ``machine-hourly-heat`` (tumbling): ``avg(temperature) > 90 and count(temperature) >= 3``
  per ``device_id`` per hour, ``allowed_lateness: 10m``. Quix's ``tumbling_window`` of 1 h
  with a grace of 10 min and ``Mean``/``Count`` (both skip nulls, as SQL does), emitted with
  ``final(closing_strategy="partition")``: a window closes when the partition's newest event
  time passes its end + grace, as the worker's per-partition watermark does. Then a stateful
  ``apply`` gives the rule's lifecycle: fires at the first window whose ``having`` holds
  (``at`` = its start), resolves at the first window where it does not; a gap (an hour with
  no event) resolves, as the worker's evaluation of an empty window does.
* ``not-found-scan`` (sliding): ``status = 404`` by ``client_ip``, ``count(*) >= 10`` over a
  sliding minute, ``allowed_lateness: 1m``. Filtered, re-keyed by ``client_ip`` (``group_by``:
  a repartition topic), then Quix's ``sliding_window`` of 1 min with a grace of 1 min,
  ``final()``. Quix emits the window ``[t - 1 min, t]`` (inclusive both ends) for each event
  time ``t``; a custom aggregator keeps the window's event times, so the count over the
  worker's ``(t - 1 min, t]`` and the count just before ``t`` are both exact. Fires at ``t``
  where the count reaches 10 from below.

Exits after ``--idle`` seconds without a message (Quix's ``run(timeout=...)``), and writes
``--result`` (JSON): the source events it handled and the wall-clock times of the first and
last message it handled, of any topic, the repartition topic included.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timedelta
from typing import Any

from quixstreams import Application, State
from quixstreams.dataframe.windows.aggregations import Aggregator, Count, Mean

THRESHOLD, HOURLY, SCAN = "t-0", "machine-hourly-heat", "not-found-scan"
HOUR_MS, MINUTE_MS = 3_600_000, 60_000
SCAN_AT_LEAST = 10

progress = {"events": 0, "first": 0.0, "last": 0.0}


def event_ms(value: Any, _headers: Any, timestamp: int, _kind: Any) -> int:
    """The event's ``ts`` (RFC 3339, as the project's events carry it) in epoch ms; the
    record's timestamp when it has none."""
    ts = value.get("ts") if isinstance(value, dict) else None
    if not isinstance(ts, str):
        return timestamp
    return round(datetime.fromisoformat(ts).timestamp() * 1000)


def handled(value: Any, source: bool = True) -> None:
    now = time.perf_counter()
    if not progress["first"]:
        progress["first"] = now
    progress["last"] = now
    if source:
        progress["events"] += 1


def firing(rule: str, key: Any, at: int) -> dict[str, Any]:
    return {"rule": rule, "key": key, "at": at, "status": "firing"}


# Both stateful functions read the sensors topic's one state store, per key: their names
# are prefixed so they do not meet.


def threshold(value: dict[str, Any], key: Any, ts: int, _headers: Any, state: State) -> dict | None:
    last = state.get("t.last")
    if last is not None and ts < last:
        return None  # late
    t = value.get("temperature")
    holds = t is not None and t > 80
    if last is None and not holds:
        return None  # a key that never matched keeps no state
    state.set("t.last", ts)
    if holds != state.get("t.fire", False):
        state.set("t.fire", holds)
        return firing(THRESHOLD, key, ts) if holds else None
    return None


def hourly(window: dict[str, Any], key: Any, _ts: int, _headers: Any, state: State) -> dict | None:
    start = window["start"]
    last = state.get("h.last")
    fire = state.get("h.fire", False)
    if last is not None and start > last + HOUR_MS:
        fire = False  # an hour without events came between: its empty window resolved the alert
    avg, n = window["avg_t"], window["readings"]
    active = avg is not None and avg > 90 and n >= 3
    state.set("h.last", start)
    state.set("h.fire", active)
    return firing(HOURLY, key, start) if active and not fire else None


class Times(Aggregator):
    """The event times of a window, in order (the counts below need them at the window's edges)."""

    def initialize(self) -> list[int]:
        return []

    def agg(self, old: list[int], new: Any, timestamp: int) -> list[int]:
        return [*old, timestamp]

    def result(self, value: list[int]) -> list[int]:
        return value


def scan(window: dict[str, Any], key: Any) -> dict | None:
    t = window["end"]
    times = window["times"]
    now = sum(1 for x in times if x > t - MINUTE_MS)  # the worker's window: (t - 1 min, t]
    before = sum(1 for x in times if x < t)  # (t - 1 ms - 1 min, t - 1 ms]: just before t
    return firing(SCAN, key, t) if now >= SCAN_AT_LEAST > before else None


def build(app: Application, out_name: str) -> None:
    out = app.topic(out_name, key_serializer="str", value_serializer="json")
    sensors = app.topic(
        "events.sensors", key_deserializer="str", value_deserializer="json", timestamp_extractor=event_ms
    )
    logs = app.topic(
        "events.logs", key_deserializer="str", value_deserializer="json", timestamp_extractor=event_ms
    )

    s = app.dataframe(sensors).update(handled)
    s.apply(threshold, stateful=True, metadata=True).filter(lambda a: a is not None).to_topic(out)
    (
        s.tumbling_window(duration_ms=timedelta(hours=1), grace_ms=timedelta(minutes=10))
        .agg(avg_t=Mean("temperature"), readings=Count("temperature"))
        .final(closing_strategy="partition")
        .apply(hourly, stateful=True, metadata=True)
        .filter(lambda a: a is not None)
        .to_topic(out)
    )

    lg = app.dataframe(logs).update(handled)
    lg = lg.filter(lambda e: e.get("status") == 404 and e.get("client_ip") is not None)
    lg = lg.group_by("client_ip").update(lambda v: handled(v, source=False))
    (
        lg.sliding_window(duration_ms=timedelta(minutes=1), grace_ms=timedelta(minutes=1))
        .agg(times=Times())
        .final()
        .apply(lambda w, key, _ts, _h: scan(w, key), metadata=True)
        .filter(lambda a: a is not None)
        .to_topic(out)
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", default="bench-quix")
    ap.add_argument("--out", default="bench.quix.alerts")
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--idle", type=float, default=3.0, help="stop after this long without a message (s)")
    args = ap.parse_args()
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        state_dir=args.state_dir,
        loglevel="WARNING",
    )
    build(app, args.out)
    app.run(timeout=args.idle)
    with open(args.result, "w") as f:
        json.dump(progress, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
