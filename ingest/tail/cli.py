"""``python -m ingest tail FILE --format F --state PATH``: see :mod:`ingest.tail.tailer`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from ingest.adapters.logformats import LOG_FORMATS
from ingest.cliargs import add_command, add_tz, positive
from ingest.runtime import run_adapter
from ingest.tail.tailer import TailOptions, tail

logger = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    p = add_command(
        commands,
        "tail",
        summary="follow a log file onto events.logs",
        run=run,
        description=(
            "Follow FILE (surviving rotation and truncation) and publish each line, stack traces joined, "
            "to events.logs. The position is saved in --state after the broker acknowledged the lines, so "
            "a restart neither loses nor repeats a line. SIGTERM/SIGINT stop it cleanly."
        ),
    )
    p.add_argument("file", help="the log file to follow (it may not exist yet)")
    p.add_argument("--format", required=True, choices=list(LOG_FORMATS), help="line format")
    p.add_argument("--state", required=True, type=Path, help="JSON state file of the saved position")
    p.add_argument("--host", help="host of every event (required by formats whose lines carry none)")
    add_tz(p, "zone-less times")
    p.add_argument(
        "--start-at",
        choices=["beginning", "end"],
        default="beginning",
        help="without a saved position: read the existing lines (beginning) or only new ones (end)",
    )
    p.add_argument("--poll", type=positive(float), default=0.2, metavar="S", help="poll interval (0.2 s)")
    p.add_argument(
        "--rotate-wait",
        type=positive(float),
        default=1.0,
        metavar="S",
        help="keep reading a rotated file until it was quiet this long (1 s)",
    )


def run(args: argparse.Namespace) -> int:
    opts = TailOptions(
        path=args.file,
        fmt=args.format,
        state_path=args.state,
        host=args.host,
        tz=args.tz,
        start_at=args.start_at,
        poll_interval_s=args.poll,
        rotate_wait_s=args.rotate_wait,
    )
    return run_adapter(lambda settings, stop: tail(settings, opts, stop))
