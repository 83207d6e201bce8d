"""``python -m ingest registry devices|watchlists FILE``: load a reference table.

Validates the whole file first (all problems reported as ``FILE:LINE``, exit
2, nothing published), then upserts every row, sends tombstones for
``deleted: true`` rows and ``--delete KEY`` options, and with ``--prune`` for
keys on the topic that the file no longer lists. ``--dry-run`` prints the
records (``{"key", "value"}`` JSON lines) without Kafka. Prints one JSON
summary line; exit 1 when a record was not acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import sys
from pathlib import Path
from typing import Any

import orjson

from app.runtime.settings import Settings
from ingest.cliargs import add_progress
from ingest.model import IngestArgError
from ingest.progress import OtherInputError, Progress, ProgressFile
from ingest.registry.load import TableRecord, load_rows
from ingest.registry.model import TABLES
from ingest.registry.publish import LoadSummary, load_table
from ingest.runtime import run_adapter

logger = logging.getLogger(__name__)


def add_parser(commands: Any) -> None:
    reg: argparse.ArgumentParser = commands.add_parser(
        "registry", help="load the device registry or watchlists"
    )
    tables = reg.add_subparsers(dest="table", required=True, metavar="{devices,watchlists}")
    for spec in TABLES.values():
        t = tables.add_parser(spec.name, help=f"load {spec.topic} (key {spec.key}) from CSV or YAML")
        t.add_argument("file", nargs="?", help=".csv, .yaml or .yml file of rows")
        t.add_argument(
            "--delete", action="append", default=[], metavar="KEY", help="tombstone KEY (repeatable)"
        )
        t.add_argument(
            "--prune", action="store_true", help="also tombstone keys on the topic but not in FILE"
        )
        t.add_argument("--dry-run", action="store_true", help="print the records, publish nothing")
        add_progress(t, "skip the load when this file says the same rows were loaded before; record it after")
        t.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    spec = TABLES[args.table]
    if args.file is None and not args.delete:
        msg = "give a FILE of rows, --delete KEY, or both"
        raise IngestArgError(msg)
    if args.prune and args.file is None:
        msg = "--prune needs the FILE that lists every row to keep"
        raise IngestArgError(msg)
    records: list[TableRecord] = load_rows(Path(args.file), spec) if args.file else []
    if args.dry_run:
        for r in [*records, *(TableRecord(k, None, 0) for k in args.delete)]:
            value = None if r.value is None else orjson.loads(r.value)
            sys.stdout.buffer.write(orjson.dumps({"key": r.key, "value": value}) + b"\n")
        return 0

    progress = None if args.progress is None else ProgressFile(args.progress, _identity(args, records))
    if progress is not None and _loaded_before(progress):
        logger.info("%s: these rows were loaded before; nothing to publish", progress.path)
        sys.stdout.buffer.write(LoadSummary(spec.name, spec.topic, 0, 0, 0, skipped=True).to_json() + b"\n")
        return 0

    async def body(settings: Settings, _stop: asyncio.Event) -> LoadSummary:
        summary = await load_table(settings, spec, records, deletes=args.delete, prune=args.prune)
        if progress is not None and not summary.failed:
            n = summary.upserted + summary.deleted
            progress.save(Progress(n, n, finished=True))
        return summary

    return run_adapter(body)


def _identity(args: argparse.Namespace, records: list[TableRecord]) -> dict[str, object]:
    """The load's content: the table, a digest of its records, the deletes and pruning. A
    table is a set of rows, so another content is no error: it is simply loaded."""
    digest = hashlib.sha256()
    for r in records:
        digest.update(orjson.dumps([r.key, None if r.value is None else r.value.decode()]) + b"\n")
    return {"command": f"registry {args.table}", "records": digest.hexdigest(), "delete": args.delete,
            "prune": args.prune}  # fmt: skip


def _loaded_before(progress: ProgressFile) -> bool:
    try:
        return progress.load().finished
    except OtherInputError:
        return False  # other rows: load them
