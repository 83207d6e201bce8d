"""argparse helpers shared by the ``python -m ingest`` commands.

- The ``type`` helpers (:func:`positive`, :func:`timezone`, :func:`address`,
  :func:`timestamp_ms`) turn one option's text into a typed value or raise
  ``argparse.ArgumentTypeError`` with the expected form, so bad usage exits 2 with a
  message naming the option before anything starts.
- :func:`add_command` declares one command; :func:`add_tz`, :func:`add_progress` and
  :func:`add_clock` add the options several commands share, with the same type, default and form.
- :func:`read_secret` reads a secret an option names in a file, at run time
  (IngestArgError, exit 2, when the file cannot be read).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.errors import IngestDecodeError
from app.events import parse_ts
from app.eventtime import Clock
from app.runtime.clockgate import ClockGate
from ingest.model import IngestArgError

logger = logging.getLogger(__name__)


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """A ``type`` accepting numbers > 0 of ``kind`` (int or float)."""

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


def timezone(text: str) -> tzinfo:
    """An IANA zone name (``Europe/Berlin``) or ``UTC``."""
    if text.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        msg = f"unknown time zone {text!r}; expected an IANA name such as Europe/Berlin, or UTC"
        raise argparse.ArgumentTypeError(msg) from None


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``PORT`` (then on 127.0.0.1); port 0 picks a free one."""
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        msg = f"expected HOST:PORT or PORT, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return (host.strip("[]") or "127.0.0.1"), number


def timestamp_ms(text: str) -> int:
    """An RFC 3339 time with a zone (``2024-01-01T00:00:00Z``) as epoch ms. argparse names the
    option in its error (``argument --from: the time is not an RFC 3339 timestamp: ...``)."""
    try:
        return parse_ts(text, "T")
    except IngestDecodeError as exc:
        raise argparse.ArgumentTypeError(exc.reason.replace("field 'T'", "the time", 1)) from None


def shared_clock(text: str) -> Clock:
    """``--clock WALL@TIME``: the schedule several producers share (``app.eventtime.Clock``)."""
    try:
        return Clock.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except IngestDecodeError as exc:
        raise argparse.ArgumentTypeError(exc.reason) from None


CLOCK_HELP = (
    "pace on a schedule shared with other producers: event time TIME is due at Unix time WALL "
    "(e.g. 1764432000@2013-12-10T12:00:00Z), so producers given the same clock publish on one "
    "event-time axis whenever each starts; events already due go at once, holes are not shortened"
)


def add_clock(parser: argparse.ArgumentParser, needs: str = "") -> None:
    """``--clock WALL@TIME``, or ``--clock-gate FILE`` with ``--clock-party NAME``
    (:mod:`app.runtime.clockgate`); read them with :func:`clock_of`. ``needs`` ends their help."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--clock", type=shared_clock, metavar="WALL@TIME", help=CLOCK_HELP + needs)
    group.add_argument(
        "--clock-gate",
        type=Path,
        metavar="FILE",
        help="pace on a shared clock that starts once every producer FILE names is ready "
        "(they write FILE.<party>.ready and wait); give --clock-party too" + needs,
    )
    parser.add_argument("--clock-party", metavar="NAME", help="this producer's name among the gate's parties")


def clock_of(args: argparse.Namespace) -> Clock | ClockGate | None:
    """The shared clock ``add_clock``'s options give; IngestArgError when they do not go together."""
    if (args.clock_gate is None) != (args.clock_party is None):
        msg = "--clock-gate and --clock-party go together"
        raise IngestArgError(msg)
    if args.clock_gate is not None:
        return ClockGate(args.clock_gate, args.clock_party)
    clock: Clock | None = args.clock
    return clock


def now_ms() -> int:
    """The wall clock in epoch ms, whole seconds (a readable default start)."""
    return int(datetime.now(tz=UTC).timestamp()) * 1000


def add_command(
    commands: Any, name: str, *, summary: str, description: str, run: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """The command ``python -m ingest <name>`` (``summary`` in the list of commands,
    ``description`` in its own ``--help``), which calls ``run(args)``; add its options to it."""
    parser: argparse.ArgumentParser = commands.add_parser(name, help=summary, description=description)
    parser.set_defaults(run=run)
    return parser


def add_tz(parser: argparse.ArgumentParser, times: str) -> None:
    """``--tz ZONE`` (default UTC): the zone of ``times``, the input's times that carry none."""
    parser.add_argument("--tz", type=timezone, default=UTC, help=f"zone of {times} (UTC)")


def add_progress(parser: argparse.ArgumentParser, what: str) -> None:
    """``--progress FILE.json`` (a :class:`~pathlib.Path`, default None); ``what`` is its help."""
    parser.add_argument("--progress", type=Path, metavar="FILE.json", help=what)


def read_secret(path: Path | None, option: str) -> str | None:
    """The text of the file ``path`` an ``option`` names, stripped; None without one.
    IngestArgError naming the option when the file cannot be read."""
    if path is None:
        return None
    try:
        return path.read_text().strip()
    except OSError as exc:
        msg = f"{option}: {exc}"
        raise IngestArgError(msg) from None
