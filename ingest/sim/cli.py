"""``python -m ingest simulate fleet|ticks``: publish a seeded simulation.

Events come from :mod:`ingest.sim.fleet` or :mod:`ingest.sim.ticks` and are
published by :func:`ingest.replay.replay`, so pacing, the summary line and a
clean stop on SIGTERM/SIGINT work as for replays. The run is bounded by
``--count`` (events) and/or ``--duration`` (seconds of event time after
``--start``); without either it runs until stopped. Pacing: real time
(``--speedup 1``) unless ``--speedup X`` or ``--fast``; ``--rate`` caps
events per second in any case.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.events import parse_ts
from app.topics import SOURCE_TOPICS
from ingest.cliargs import now_ms, positive, timestamp_ms
from ingest.model import IngestArgError, Record
from ingest.replay import ReplayOptions, replay, source_for_topic
from ingest.runtime import run_adapter
from ingest.sim.fleet import FleetConfig, fleet_events, fleet_registry
from ingest.sim.ticks import TickConfig, tick_events

logger = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    sim: argparse.ArgumentParser = commands.add_parser("simulate", help="publish a seeded simulation")
    kinds = sim.add_subparsers(dest="kind", required=True, metavar="{fleet,ticks}")
    fleet = kinds.add_parser("fleet", help="IoT sensors with drift and faults, vehicles with GPS tracks")
    fleet.add_argument("--sensors", type=int, default=20, help="fixed sensors (20)")
    fleet.add_argument("--vehicles", type=int, default=5, help="vehicles (5)")
    fleet.add_argument(
        "--interval",
        type=positive(float),
        default=10.0,
        metavar="S",
        help="event-time seconds between two readings of a device (10)",
    )
    fleet.add_argument("--geofence-km", type=positive(float), default=5.0, help="depot geofence radius (5)")
    fleet.add_argument(
        "--mqtt",
        metavar="HOST:PORT",
        help="publish to this MQTT broker (QoS 1, <prefix>/<device_id>/state) instead of Kafka",
    )
    fleet.add_argument("--mqtt-prefix", default="fleet", help="MQTT topic prefix (fleet)")
    fleet.add_argument(
        "--write-registry",
        type=Path,
        metavar="FILE.csv",
        help="also write the devices' registry rows as CSV, for `registry devices`",
    )
    ticks = kinds.add_parser("ticks", help="intraday trades: GBM with jumps, sizes, sides")
    ticks.add_argument("--symbols", default="AAPL,MSFT", help="comma-separated symbols (AAPL,MSFT)")
    ticks.add_argument(
        "--mean-gap",
        type=positive(float),
        default=1.0,
        metavar="S",
        help="mean seconds between two trades of a symbol (1)",
    )
    for sub, topic in ((fleet, SOURCE_TOPICS["sensors"]), (ticks, SOURCE_TOPICS["finance"])):
        sub.add_argument("--seed", type=int, required=True, help="the same seed gives the same events")
        sub.add_argument("--start", type=timestamp_ms, help="event time of the first tick (default: now)")
        sub.add_argument("--count", type=positive(int), metavar="N", help="stop after N events")
        sub.add_argument("--duration", type=positive(float), metavar="S", help="stop after S s of event time")
        sub.add_argument(
            "--speedup",
            type=positive(float),
            default=1.0,
            metavar="X",
            help="event time runs X times faster than wall time (1: real time)",
        )
        sub.add_argument("--fast", action="store_true", help="no pacing: publish as fast as possible")
        sub.add_argument("--rate", type=positive(float), metavar="N", help="at most N events per second")
        sub.add_argument("--topic", default=topic, help=f"topic ({topic})")
        sub.set_defaults(run=run)


def events(args: argparse.Namespace) -> Iterator[Record]:
    """The simulation's events, bounded by ``--duration`` (not ``--count``)."""
    start = args.start if args.start is not None else now_ms()
    if args.kind == "fleet":
        cfg = FleetConfig(args.seed, start, args.sensors, args.vehicles, args.interval, args.geofence_km)
        if args.write_registry is not None:
            _write_csv(args.write_registry, fleet_registry(cfg))
        items = fleet_events(cfg)
    else:
        symbols = tuple(s.strip().upper() for s in args.symbols.split(",") if s.strip())
        items = tick_events(TickConfig(args.seed, symbols, start, mean_gap_s=args.mean_gap))
    if args.duration is None:
        return items
    end = start + int(args.duration * 1000)
    return itertools.takewhile(lambda r: parse_ts(r["ts"]) < end, items)


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)


def run(args: argparse.Namespace) -> int:
    source_for_topic(args.topic)
    if args.kind == "fleet" and (args.sensors < 0 or args.vehicles < 0 or args.sensors + args.vehicles == 0):
        msg = "--sensors and --vehicles must be >= 0, and not both 0"
        raise IngestArgError(msg)
    if args.kind == "ticks" and not [s for s in args.symbols.split(",") if s.strip()]:
        msg = "--symbols needs at least one symbol, e.g. AAPL,MSFT"
        raise IngestArgError(msg)
    if args.kind == "fleet" and args.mqtt:
        from ingest.sim.mqtt_out import publish_mqtt

        speed = None if args.fast else args.speedup
        return publish_mqtt(events(args), args.mqtt, args.mqtt_prefix, speed, args.count)
    opts = ReplayOptions(speedup=None if args.fast else args.speedup, limit=args.count, rate=args.rate)
    adapter = f"sim-{args.kind}"
    return run_adapter(
        lambda settings, stop: replay(
            settings, events(args), topic=args.topic, adapter=adapter, options=opts, stop=stop
        )
    )
