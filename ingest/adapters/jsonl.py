"""JSON lines (one event object per line) as raw payloads for the publisher.

The lines are not parsed here: the publisher decodes and validates each one
with its source schema, so a malformed line reaches the dead-letter topic with
the schema's reason and the line exactly as read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from ingest.model import read_lines

logger = logging.getLogger(__name__)

ADAPTER = "jsonl"


def jsonl_lines(path: str) -> Iterator[bytes]:
    """Each non-blank line of ``path`` as bytes, without its line ending, in file order.

    Blank (whitespace-only) lines are not events and are skipped.
    """
    return (raw for _number, raw in numbered_jsonl_lines(path))


def numbered_jsonl_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """:func:`jsonl_lines` with the 1-based line number of each line."""
    for number, raw in read_lines(path):
        if raw.strip():
            yield number, raw
