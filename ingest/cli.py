"""``python -m ingest``: every ingest adapter as a command. This module is the wiring.

Commands: ``convert`` (a dataset to JSON lines), ``replay`` (a file onto a
topic), ``tail`` (follow a log file), ``syslog`` (UDP/TCP receiver), ``http``
(ingest endpoint), ``mqtt`` (MQTT bridge), ``simulate`` (fleet or market) and
``registry`` (device registry and watchlists). Each one that publishes prints
one JSON summary line on stdout when it ends (also after SIGTERM/SIGINT).

``replay`` and ``simulate`` take ``--progress FILE`` to resume after what an
earlier run published (:mod:`ingest.progress`); ``registry`` skips a load the
file records as done.

Exit codes: 0 success (also an adapter stopped by SIGTERM/SIGINT), 1 some
input lines could not be converted or some records were not delivered, 2 bad
usage or configuration. Diagnostics go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Iterator, Sequence
from typing import BinaryIO

import orjson

from app.errors import AppError, ConfigError
from app.runtime.outfile import OutputPathError, check_output
from app.runtime.settings import Settings
from ingest.adapters import FORMAT_SOURCES, apache_events, nab_events, ohlc_events
from ingest.adapters.logfile import log_events
from ingest.adapters.logformats import LOG_FORMATS
from ingest.adapters.ohlc import SYMBOLS
from ingest.cliargs import add_clock, add_progress, add_tz, clock_of, positive, timestamp_ms
from ingest.httpd import cli as http_cli
from ingest.model import Converter, ConvertError, IngestArgError
from ingest.mqtt import cli as mqtt_cli
from ingest.progress import ProgressFile
from ingest.registry import cli as registry_cli
from ingest.replay import (
    ReplayInput,
    ReplayOptions,
    ReplaySummary,
    open_input,
    replay,
    source_for_topic,
    starting_at,
)
from ingest.runtime import run_adapter
from ingest.sim import cli as sim_cli
from ingest.syslogd import cli as syslog_cli
from ingest.tail import cli as tail_cli

logger = logging.getLogger(__name__)

#: The commands that live next to their integration, in the order of ``--help``.
COMMANDS = (tail_cli, syslog_cli, http_cli, mqtt_cli, sim_cli, registry_cli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ingest",
        description="Ingest real data into validated events on Kafka: files, logs, syslog, HTTP, MQTT, "
        "simulations and reference tables.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_convert(commands)
    _add_replay(commands)
    for module in COMMANDS:
        module.add_parser(commands)
    return parser


def _add_convert(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    convert = commands.add_parser("convert", help="convert a dataset to JSON-lines events")
    convert.description = "Convert a real dataset to JSON-lines events; bad lines are reported as FILE:LINE."
    kinds = convert.add_subparsers(dest="kind", required=True, metavar="{nab,apache,ohlc,log}")
    nab = kinds.add_parser("nab", help="NAB timestamp,value CSV -> sensors events")
    nab.add_argument("file", help="NAB CSV file (naive timestamps are UTC)")
    nab.add_argument("--device", required=True, help="device_id of every event")
    nab.add_argument("--field", required=True, help="numeric sensors field for the value, e.g. temperature")
    nab.add_argument("--kind", dest="metric_kind", metavar="KIND", help=KIND_HELP)
    apache = kinds.add_parser("apache", help="Apache/nginx combined access log -> logs events")
    apache.add_argument("file", help="access log in combined (or common) log format")
    apache.add_argument("--host", required=True, help="host of every event (the key)")
    ohlc = kinds.add_parser("ohlc", help="daily bars from bokeh_sampledata.stocks -> finance events")
    ohlc.add_argument("--symbol", required=True, help=f"one of {', '.join(SYMBOLS)}")
    log = kinds.add_parser("log", help="a log file in any tail format -> logs events (stack traces joined)")
    log.add_argument("file", help="log file")
    log.add_argument("--format", required=True, choices=list(LOG_FORMATS), help="line format")
    log.add_argument("--host", help="host of every event (required by formats whose lines carry none)")
    add_tz(log, "zone-less times")
    for sub in (nab, apache, ohlc, log):
        sub.add_argument("--out", metavar="FILE", help="write here instead of stdout")
        sub.set_defaults(run=_convert)


KIND_HELP = (
    "also carry the reading as `value` with this `kind` (temperature, cpu, latency...), the shape "
    "the anomaly pack reads (rules/anomaly.yaml)"
)


def _add_replay(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rp = commands.add_parser("replay", help="validate and publish a file to an event topic")
    rp.description = (
        "Publish FILE to an event topic, validated against the topic's schema; invalid lines go to "
        "dlq.events. Prints one JSON summary line. SIGTERM/SIGINT stop it cleanly (exit 0)."
    )
    rp.add_argument("file", help="input file")
    rp.add_argument("--topic", required=True, help="events.sensors, events.logs or events.finance")
    rp.add_argument("--format", default="jsonl", choices=list(FORMAT_SOURCES), help="input format (jsonl)")
    rp.add_argument("--device", help="device_id, with --format nab")
    rp.add_argument("--field", help="sensors field for the value, with --format nab")
    rp.add_argument("--kind", dest="metric_kind", metavar="KIND", help=KIND_HELP + ", with --format nab")
    rp.add_argument("--host", help="host, with the log formats whose lines carry none")
    add_tz(rp, "zone-less log times")
    rp.add_argument(
        "--speedup",
        type=positive(float),
        metavar="X",
        help="divide event-time gaps by X (one wait is capped at 5 s); default: as fast as possible",
    )
    rp.add_argument("--limit", type=positive(int), metavar="N", help="publish at most N events")
    rp.add_argument(
        "--from",
        dest="time_from",
        type=timestamp_ms,
        metavar="T",
        help="skip events before this event time (RFC 3339)",
    )
    shift = rp.add_mutually_exclusive_group()
    shift.add_argument("--live", action="store_true", help="shift event times so the first event is now")
    shift.add_argument(
        "--shift-to",
        type=timestamp_ms,
        metavar="T",
        help="shift event times by one offset so that --from's time falls at T (RFC 3339; needs --from): "
        "a series recorded on other dates joins another replay's axis, and a resumed run keeps it",
    )
    add_clock(rp, " (needs --speedup)")
    add_progress(
        rp,
        "resume after the items an earlier run published, and record how far this one gets "
        "(--limit then counts over all runs; a finished replay exits at once)",
    )
    rp.set_defaults(run=_replay)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
        return code
    except BrokenPipeError:
        # stdout was closed early (e.g. `| head`): silence the flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except AppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _convert(args: argparse.Namespace) -> int:
    results: Converter
    if args.kind == "nab":
        results, name = (
            nab_events(args.file, device=args.device, field=args.field, kind=args.metric_kind),
            args.file,
        )
    elif args.kind == "apache":
        results, name = apache_events(args.file, host=args.host), args.file
    elif args.kind == "log":
        results, name = log_events(args.file, args.format, host=args.host, tz=args.tz), args.file
    else:
        results, name = ohlc_events(args.symbol), "bokeh_sampledata.stocks"
    if args.out is not None:  # before the output is opened, which empties it
        check_output(args.out, [("the input", args.file)] if args.kind != "ohlc" else [])
    errors = 0
    with _output(args.out) as out:
        for result in results:
            if isinstance(result, ConvertError):
                errors += 1
                print(result.describe(name), file=sys.stderr)
            else:
                out.write(orjson.dumps(result) + b"\n")
    if errors:
        print(f"{name}: {errors} line(s) could not be converted", file=sys.stderr)
    return 1 if errors else 0


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[BinaryIO]:
    if path is None:
        yield sys.stdout.buffer
        sys.stdout.flush()
        return
    try:
        f = open(path, "wb")  # closed below; its errors named as --out's
    except OSError as exc:
        msg = f"--out {path}: cannot write: {exc.strerror or exc}"
        raise OutputPathError(msg) from None
    with f:
        yield f


def _replay(args: argparse.Namespace) -> int:
    clock = clock_of(args)
    if clock is not None and args.speedup is None:
        msg = "--clock and --clock-gate pace the replay: give --speedup too"
        raise IngestArgError(msg)

    if args.shift_to is not None and args.time_from is None:
        msg = "--shift-to T moves --from's time to T: give --from too"
        raise IngestArgError(msg)
    shift_ms = 0 if args.shift_to is None else args.shift_to - args.time_from

    def body(settings: Settings, stop: asyncio.Event) -> Awaitable[ReplaySummary]:
        source = source_for_topic(args.topic)
        if not os.path.isfile(args.file):
            msg = f"{args.file}: no such file"
            raise ConfigError(msg)
        items: Iterator[ReplayInput] = open_input(
            args.file, args.format, source, device=args.device, field=args.field, host=args.host, tz=args.tz,
            kind=args.metric_kind,
        )  # fmt: skip
        if args.time_from is not None:
            items = starting_at(items, args.time_from)
        progress = None if args.progress is None else ProgressFile(args.progress, replay_identity(args))
        options = ReplayOptions(
            speedup=args.speedup, limit=args.limit, live=args.live, shift_ms=shift_ms, progress=progress,
            clock=clock,
        )  # fmt: skip
        topic, fmt, origin = args.topic, args.format, args.file
        return replay(settings, items, topic=topic, adapter=fmt, options=options, stop=stop, origin=origin)

    return run_adapter(body)


def replay_identity(args: argparse.Namespace) -> dict[str, object]:
    """What decides the sequence of a replay's items (and, with ``--shift-to``, their times): a
    progress file of another is refused. The file's name, not its directory, so a moved dataset
    still resumes. ``shift_to`` only when given, so the files of earlier runs still match."""
    shifted = {} if args.shift_to is None else {"shift_to": args.shift_to}
    return {
        "command": "replay",
        "file": os.path.basename(args.file),
        "format": args.format,
        "topic": args.topic,
        "device": args.device,
        "field": args.field,
        "host": args.host,
        "tz": str(args.tz),
        "from": args.time_from,
        **shifted,
    }
