"""``python -m ingest simulate fleet|ticks``: publish a seeded simulation.

Events come from :mod:`ingest.sim.fleet` or :mod:`ingest.sim.ticks` and are
published by :func:`ingest.replay.replay`, so pacing, the summary line and a
clean stop on SIGTERM/SIGINT work as for replays. The run is bounded by
``--count`` (events) and/or ``--duration`` (seconds of event time after
``--start``); without either it runs until stopped. Pacing: real time
(``--speedup 1``) unless ``--speedup X`` or ``--fast``; ``--rate`` caps
events per second in any case; ``--clock`` paces on a schedule shared with other
producers (``app.eventtime.Clock``).

``--progress FILE`` resumes (:mod:`ingest.progress`): the same seed, start and
options give the same sequence, so a run skips the events an earlier one
published and goes on; ``--count`` counts over all runs, and without
``--start`` the start recorded in the file is used. ``--duration`` is not part
of the sequence's identity: a later run with a longer one goes on.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.events import parse_ts
from app.topics import SOURCE_TOPICS
from ingest.cliargs import add_clock, add_progress, clock_of, now_ms, positive, timestamp_ms
from ingest.model import IngestArgError, Record
from ingest.progress import ProgressFile
from ingest.replay import ReplayOptions, replay, source_for_topic
from ingest.runtime import process_settings, run_adapter
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
        add_clock(sub)
        sub.add_argument("--rate", type=positive(float), metavar="N", help="at most N events per second")
        sub.add_argument("--topic", default=topic, help=f"topic ({topic})")
        add_progress(
            sub,
            "resume after the events an earlier run published (same seed and options; without "
            "--start, its start), and record how far this one gets (--count then counts over all runs)",
        )
        sub.set_defaults(run=run)


def events(args: argparse.Namespace, start: int) -> Iterator[Record]:
    """The simulation's events from ``start`` (epoch ms), bounded by ``--duration`` (not ``--count``)."""
    if args.kind == "fleet":
        cfg = FleetConfig(args.seed, start, args.sensors, args.vehicles, args.interval, args.geofence_km)
        if args.write_registry is not None:
            _write_csv(args.write_registry, fleet_registry(cfg))
        items = fleet_events(cfg)
    else:
        items = tick_events(TickConfig(args.seed, _symbols(args), start, mean_gap_s=args.mean_gap))
    if args.duration is None:
        return items
    end = start + int(args.duration * 1000)
    return itertools.takewhile(lambda r: parse_ts(r["ts"]) < end, items)


def _symbols(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(s.strip().upper() for s in args.symbols.split(",") if s.strip())


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    """Write the rows atomically (temp file, rename): a reader never sees half a file."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def start_of(args: argparse.Namespace) -> int:
    """``--start``; without it, the start an earlier run recorded in ``--progress``, else now."""
    if args.start is not None:
        return int(args.start)
    stored = ProgressFile.stored_input(args.progress) if args.progress is not None else None
    if stored is not None and isinstance(stored.get("start"), int):
        return int(stored["start"])
    return now_ms()


def identity(args: argparse.Namespace, start: int) -> dict[str, object]:
    """What decides the simulation's sequence: a progress file of another is refused.
    ``--duration`` is not part of it: it only cuts the sequence, so a longer one goes on."""
    base: dict[str, object] = {"command": f"simulate {args.kind}", "seed": args.seed, "start": start}
    if args.kind == "fleet":
        sizes = {"sensors": args.sensors, "vehicles": args.vehicles, "interval": args.interval}
        return {**base, **sizes, "geofence_km": args.geofence_km, "topic": args.topic}
    return {**base, "symbols": list(_symbols(args)), "mean_gap": args.mean_gap, "topic": args.topic}


def run(args: argparse.Namespace) -> int:
    source_for_topic(args.topic)
    if args.kind == "fleet" and (args.sensors < 0 or args.vehicles < 0 or args.sensors + args.vehicles == 0):
        msg = "--sensors and --vehicles must be >= 0, and not both 0"
        raise IngestArgError(msg)
    if args.kind == "ticks" and not _symbols(args):
        msg = "--symbols needs at least one symbol, e.g. AAPL,MSFT"
        raise IngestArgError(msg)
    clock = clock_of(args)
    if clock is not None and args.fast:
        msg = "--clock and --clock-gate pace the simulation: they cannot be used with --fast"
        raise IngestArgError(msg)
    start = start_of(args)
    progress = None if args.progress is None else ProgressFile(args.progress, identity(args, start))
    if args.kind == "fleet" and args.mqtt:
        from ingest.sim.mqtt_out import publish_mqtt

        process_settings(kafka=False)  # run_adapter's set-up, less Kafka: logging and /metrics
        speed = None if args.fast else args.speedup
        items = events(args, start)
        return publish_mqtt(
            items, args.mqtt, args.mqtt_prefix, speed, args.count, progress=progress, clock=clock
        )
    opts = ReplayOptions(
        speedup=None if args.fast else args.speedup,
        limit=args.count,
        rate=args.rate,
        progress=progress,
        end_is_final=False,  # --duration cuts the sequence; a later run may want more of it
        clock=clock,
    )
    adapter = f"sim-{args.kind}"
    return run_adapter(
        lambda settings, stop: replay(
            settings,
            events(args, start),
            topic=args.topic,
            adapter=adapter,
            options=opts,
            stop=stop,
            origin=f"simulate {args.kind}",
        )
    )
