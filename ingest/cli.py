"""``python -m ingest``: convert real data to JSON lines, or replay a file onto Kafka.

Exit codes: 0 success (also a replay stopped by SIGTERM/SIGINT), 1 some input
lines could not be converted or some records were not delivered, 2 bad usage
or configuration. Converted events and the replay summary go to stdout, one
JSON object per line; diagnostics go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import orjson

from app.config import Settings, setup_logging
from app.errors import AppError, ConfigError
from app.metrics import serve
from ingest.adapters import FORMAT_SOURCES, apache_events, nab_events, ohlc_events
from ingest.adapters.ohlc import SYMBOLS
from ingest.model import Converter, ConvertError, IngestArgError
from ingest.publisher import NO_BOOTSTRAP
from ingest.replay import ReplayItem, ReplayOptions, ReplaySummary, open_input, replay, source_for_topic

logger = logging.getLogger(__name__)

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ingest",
        description="Convert real data to JSON-lines events, or replay a file onto Kafka.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{convert,replay}")

    convert = commands.add_parser("convert", help="convert a dataset to JSON-lines events")
    convert.description = "Convert a real dataset to JSON-lines events; bad lines are reported as FILE:LINE."
    kinds = convert.add_subparsers(dest="kind", required=True, metavar="{nab,apache,ohlc}")
    nab = kinds.add_parser("nab", help="NAB timestamp,value CSV -> sensors events")
    nab.add_argument("file", help="NAB CSV file (naive timestamps are UTC)")
    nab.add_argument("--device", required=True, help="device_id of every event")
    nab.add_argument("--field", required=True, help="numeric sensors field for the value, e.g. temperature")
    apache = kinds.add_parser("apache", help="Apache/nginx combined access log -> logs events")
    apache.add_argument("file", help="access log in combined (or common) log format")
    apache.add_argument("--host", required=True, help="host of every event (the key)")
    ohlc = kinds.add_parser("ohlc", help="daily bars from bokeh_sampledata.stocks -> finance events")
    ohlc.add_argument("--symbol", required=True, help=f"one of {', '.join(SYMBOLS)}")
    for sub in (nab, apache, ohlc):
        sub.add_argument("--out", metavar="FILE", help="write here instead of stdout")

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
    rp.add_argument("--host", help="host, with --format apache")
    rp.add_argument(
        "--speedup",
        type=_positive(float),
        metavar="X",
        help="divide event-time gaps by X (one wait is capped at 5 s); default: as fast as possible",
    )
    rp.add_argument("--limit", type=_positive(int), metavar="N", help="publish at most N events")
    rp.add_argument("--live", action="store_true", help="shift event times so the first event is now")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "convert":
            return _convert(args)
        return _replay(args)
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
        results, name = nab_events(args.file, device=args.device, field=args.field), args.file
    elif args.kind == "apache":
        results, name = apache_events(args.file, host=args.host), args.file
    else:
        results, name = ohlc_events(args.symbol), "bokeh_sampledata.stocks"
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
    with open(path, "wb") as f:
        yield f


def _replay(args: argparse.Namespace) -> int:
    # Until the event loop takes over, remember a stop request instead of dying.
    early: list[int] = []
    for sig in _STOP_SIGNALS:
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    settings = Settings.from_env()
    setup_logging(settings.log_level)
    if not settings.bootstrap_servers:
        raise ConfigError(NO_BOOTSTRAP)
    source = source_for_topic(args.topic)
    if not os.path.isfile(args.file):
        msg = f"{args.file}: no such file"
        raise IngestArgError(msg)
    items = open_input(args.file, args.format, source, device=args.device, field=args.field, host=args.host)
    serve(settings.metrics_port)
    options = ReplayOptions(speedup=args.speedup, limit=args.limit, live=args.live)
    summary = asyncio.run(_replay_until_signal(settings, items, args.topic, args.format, options, early))
    sys.stdout.buffer.write(summary.to_json() + b"\n")
    sys.stdout.flush()
    return 1 if summary.failed else 0


async def _replay_until_signal(
    settings: Settings,
    items: Iterator[ReplayItem],
    topic: str,
    adapter: str,
    options: ReplayOptions,
    early: list[int],
) -> ReplaySummary:
    """Run the replay with SIGTERM and SIGINT setting its stop event (also when
    one arrived during start-up, as recorded in ``early``)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    if early:
        stop.set()
    try:
        return await replay(settings, items, topic=topic, adapter=adapter, options=options, stop=stop)
    finally:
        for sig in _STOP_SIGNALS:
            loop.remove_signal_handler(sig)


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse ``type`` accepting numbers > 0 of ``kind``."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            msg = f"expected a number > 0, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None
        if value <= 0:
            msg = f"expected a number > 0, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse
