"""``python -m ingest http [--bind HOST] [--port N]``: see :mod:`ingest.httpd.server`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from app.topics import SOURCE_TOPICS
from ingest.cliargs import add_command, positive, read_secret
from ingest.model import IngestArgError
from ingest.runtime import run_adapter

logger = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    p = add_command(
        commands,
        "http",
        summary="HTTP endpoint for events and batches",
        run=run,
        description=(
            "Serve POST /v1/events/{sensors,logs,finance} (application/json: one event; "
            "application/x-ndjson: a batch) and GET /healthz. 202 only after the broker acknowledged every "
            "event; 400 with per-line errors, publishing nothing, when any line is invalid. SIGTERM/SIGINT "
            "stop it cleanly."
        ),
    )
    p.add_argument("--bind", default="127.0.0.1", help="listen address (127.0.0.1)")
    p.add_argument("--port", type=int, default=8088, help="listen port (8088; 0 picks a free one)")
    p.add_argument(
        "--max-body",
        type=positive(int),
        default=10 * 1024 * 1024,
        metavar="BYTES",
        help="largest request body; larger gets 413 (10 MiB)",
    )
    p.add_argument(
        "--ack-timeout",
        type=positive(float),
        default=30.0,
        metavar="S",
        help="how long to wait for the broker's acks before answering 503 (30 s)",
    )
    p.add_argument("--token-file", type=Path, help="require 'Authorization: Bearer <token in this file>'")


def run(args: argparse.Namespace) -> int:
    token = read_secret(args.token_file, "--token-file")
    if token == "":
        msg = f"--token-file {args.token_file} is empty"
        raise IngestArgError(msg)
    # here, not at the top: aiohttp is a third of every `python -m ingest` start (0.3 s of 0.8),
    # and make run starts six other ingest commands at once
    from ingest.httpd.server import HttpOptions, serve_http

    opts = HttpOptions(args.bind, args.port, int(args.max_body), args.ack_timeout, token)
    return run_adapter(lambda settings, stop: serve_http(settings, opts, stop, tuple(SOURCE_TOPICS)))
