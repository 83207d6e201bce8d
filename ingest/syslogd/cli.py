"""``python -m ingest syslog --udp ADDR --tcp ADDR``: see :mod:`ingest.syslogd.server`."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ingest.cliargs import add_command, add_tz, address, positive
from ingest.model import IngestArgError
from ingest.runtime import run_adapter
from ingest.syslogd.server import SyslogOptions, serve_syslog

logger = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    p = add_command(
        commands,
        "syslog",
        summary="receive syslog over UDP/TCP",
        run=run,
        description=(
            "Receive RFC 3164 and RFC 5424 syslog over UDP and/or TCP (octet counting or newline framing) "
            "and publish to events.logs keyed by host. SIGTERM/SIGINT stop it cleanly."
        ),
    )
    p.add_argument("--udp", type=address, metavar="HOST:PORT", help="UDP address, e.g. 127.0.0.1:5514")
    p.add_argument("--tcp", type=address, metavar="HOST:PORT", help="TCP address, e.g. 127.0.0.1:5514")
    add_tz(p, "RFC 3164 times")
    p.add_argument(
        "--max-message",
        type=positive(int),
        default=64 * 1024,
        metavar="BYTES",
        help="longest message accepted (65536)",
    )


def run(args: argparse.Namespace) -> int:
    if args.udp is None and args.tcp is None:
        msg = "give --udp HOST:PORT, --tcp HOST:PORT or both"
        raise IngestArgError(msg)
    opts = SyslogOptions(udp=args.udp, tcp=args.tcp, tz=args.tz, max_message_bytes=int(args.max_message))
    return run_adapter(lambda settings, stop: serve_syslog(settings, opts, stop))
