"""Backtest: run rules over recorded events in event-time order with the production evaluator.

Input is JSON lines of events (the converters' output); each line's source is
given (``--source``) or inferred from its key field (``device_id`` -> sensors,
``host`` -> logs, ``symbol`` -> finance). Invalid lines are reported with
their line number and skipped, never silently. Output is one JSON object per
alert transition whose status is in the report's ``statuses``: firing and
resolved by default (what a receiver is told), ``--statuses all`` adds
pending, inactive and no_data. The ids are the same either way.
"""

from __future__ import annotations

import bz2
import gzip
import io
import logging
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import orjson

from app.alerts import STATUSES, Alert
from app.errors import IngestDecodeError
from app.events import SCHEMAS, Event, loads, parse_ts, record_time_ms
from app.rules.evaluator import Engine
from app.rules.loader import RuleSet
from app.tables import TABLES, Tables, read_table_file

if TYPE_CHECKING:
    from app.kafka.clients import Target

logger = logging.getLogger(__name__)

_KEY_TO_SOURCE = {s.key: s.source for s in SCHEMAS.values()}

#: The statuses a backtest prints unless told otherwise: the notified ones.
DEFAULT_STATUSES = frozenset({"firing", "resolved"})

#: The problems the summary names one by one; a note gives the number of the others.
NAMED_PROBLEMS = 50


def parse_statuses(text: str | None) -> frozenset[str]:
    """``firing,resolved``-style list, or ``all``; raises ValueError naming a bad status."""
    if not text:
        return DEFAULT_STATUSES
    if text == "all":
        return frozenset(STATUSES)
    given = {s.strip() for s in text.split(",") if s.strip()}
    bad = sorted(given - set(STATUSES))
    if bad or not given:
        msg = f"--statuses {text!r}: expected 'all' or a comma-separated list of {', '.join(STATUSES)}"
        raise ValueError(msg)
    return frozenset(given)


def load_tables(specs: Iterable[str]) -> Tables:
    """Registry tables from ``--table NAME=FILE`` arguments; raises ValueError or
    IngestDecodeError naming the bad argument, file or row."""
    tables = Tables()
    for spec in specs:
        name, _, file = spec.partition("=")
        if name not in TABLES or not file:
            msg = f"--table {spec!r}: expected NAME=FILE with NAME one of {', '.join(TABLES)}"
            raise ValueError(msg)
        try:
            rows = read_table_file(name, Path(file))
        except UnicodeDecodeError as exc:  # a ValueError, but one that names no file
            msg = f"--table {spec}: {file} is not UTF-8 ({exc.reason} at byte {exc.start})"
            raise ValueError(msg) from None
        except OSError as exc:  # missing, a directory, unreadable: one line, not a traceback
            msg = f"--table {spec}: cannot read {file}: {exc.strerror or exc}"
            raise ValueError(msg) from None
        tables.load_rows(name, rows)
    return tables


@dataclass
class BacktestReport:
    events: int = 0
    skipped: int = 0
    alerts: int = 0  # transitions written
    routed: int = 0
    late: int = 0  # late events copied aside (``late_policy: side``), as the worker's events.late
    #: events a rule could not use for their time, every late policy: counted once per rule
    #: the event came too late for (the evaluator's ``stats.late``); the Faust engine's only
    late_events: int = 0
    refused: int = 0  # events refused for their time (APP_MAX_EVENT_SKEW, docs/event-time.md)
    problems: list[str] = field(default_factory=list)
    statuses: frozenset[str] = DEFAULT_STATUSES
    #: per rule, its evaluations that raised (each logged with its traceback): the event was
    #: skipped for that rule, so its output may lack transitions (:attr:`complete`)
    rule_errors: dict[str, int] = field(default_factory=dict)
    #: per rule, the transitions written (those of the shown statuses): ``--watch`` compares runs
    by_rule: dict[str, int] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Every rule evaluated every event: no evaluation raised. The command exits 1 otherwise."""
        return not self.rule_errors

    def count_rule_errors(self, counts: Mapping[str, int]) -> None:
        for rule_id, n in counts.items():
            self.rule_errors[rule_id] = self.rule_errors.get(rule_id, 0) + n

    def print_summary(self, label: str = "backtest") -> None:
        """The first problems (a note counts the others), the late events when there are
        some, and the totals, last, on stderr (stdout may carry the alert lines)."""
        for line in self.problems[:NAMED_PROBLEMS]:
            print(line, file=sys.stderr)
        if len(self.problems) > NAMED_PROBLEMS:
            print(
                f"{label}: ... and {len(self.problems) - NAMED_PROBLEMS} more not shown "
                f"(the first {NAMED_PROBLEMS} are named above)",
                file=sys.stderr,
            )
        if self.late_events:
            n = self.late_events
            print(
                f"{label}: {n} late event{'' if n == 1 else 's'} not used by a rule (past its "
                "allowed_lateness, or older than its group's newest; once per rule: docs/rules.md)",
                file=sys.stderr,
            )
        if self.rule_errors:
            failed = ", ".join(f"{rid} ({n})" for rid, n in sorted(self.rule_errors.items()))
            print(
                f"{label}: incomplete: rule evaluations raised, each logged with its error, and "
                f"those events were skipped for the rule: {failed}",
                file=sys.stderr,
            )
        print(
            f"{label}: {self.events} events, {self.alerts} alert transitions, "
            f"{self.skipped} invalid lines skipped"
            + (f", {self.refused} events refused for their time" if self.refused else "")
            + (f", {sum(self.rule_errors.values())} rule errors" if self.rule_errors else ""),
            file=sys.stderr,
        )

    def refuse(self, refused: Iterable[tuple[Event, str]]) -> None:
        """Count events the evaluator refused for their time, each a problem naming the event."""
        for ev, reason in refused:
            self.refused += 1
            self.problems.append(f"refused {ev.key} at {ev.fields.get('ts')}: {reason}")

    def emit(self, out: TextIO, alert: Alert) -> None:
        """Write ``alert`` as one output line if its status is shown."""
        if alert.status in self.statuses:
            out.write(backtest_line(alert).decode() + "\n")
            self.alerts += 1
            self.by_rule[alert.rule_id] = self.by_rule.get(alert.rule_id, 0) + 1


def infer_source(obj: dict[str, Any]) -> str | None:
    for key, source in _KEY_TO_SOURCE.items():
        if key in obj:
            return source
    return None


@dataclass(frozen=True)
class TimeRange:
    """A backtest's ``--from``/``--to``: ``[lo, hi)`` in epoch milliseconds, either end open.

    A record is in it by :func:`app.events.record_time_ms`: a valid event by its event time,
    an invalid record by the ``ts`` it carries if the decoder reads it, else by the time Kafka
    stamped it; an invalid line of a file with no readable ``ts`` has no time and is in every
    range. Every backtest (the Faust engine's and Spark's, over a file, a topic or the archive)
    selects by this, so their counts of invalid records agree as their alerts do."""

    lo: int | None = None
    hi: int | None = None

    @classmethod
    def of(cls, time_from: str | None, time_to: str | None) -> TimeRange:
        """The range of the two options as given (RFC 3339), IngestDecodeError naming a bad one,
        ValueError naming both when ``--from`` is not before ``--to`` (a range of no time)."""
        lo = parse_ts(time_from, "--from") if time_from else None
        hi = parse_ts(time_to, "--to") if time_to else None
        if lo is not None and hi is not None and lo >= hi:
            msg = (
                f"--from {time_from} is not before --to {time_to}: the range [--from, --to) "
                "holds no event time"
            )
            raise ValueError(msg)
        return cls(lo, hi)

    def holds(self, ts_ms: int | None) -> bool:
        if ts_ms is None:
            return True
        return (self.lo is None or ts_ms >= self.lo) and (self.hi is None or ts_ms < self.hi)


def read_events(
    lines: Iterable[bytes | str], name: str, report: BacktestReport, source: str | None = None,
    within: TimeRange = TimeRange(),
) -> Iterator[tuple[str, Event]]:  # fmt: skip
    """Decode JSON lines into ``(source, event)``; problems go to ``report``, those of the
    invalid lines ``within`` places in its range only (:class:`TimeRange`)."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = loads(line)
            src = source or (infer_source(obj) if isinstance(obj, dict) else None)
            if src is None:
                msg = "cannot tell the source: no device_id, host or symbol field"
                raise IngestDecodeError(msg)
            yield src, SCHEMAS[src].validate(obj)
        except IngestDecodeError as exc:
            if not within.holds(record_time_ms(line, None)):
                continue
            report.skipped += 1
            reason = exc.reason
            report.problems.append(f"{name}:{lineno}: {reason}")


def backtest(
    ruleset: RuleSet,
    events: Iterable[tuple[str, Event]],
    out: TextIO,
    report: BacktestReport,
    time_from: str | None = None,
    time_to: str | None = None,
    engine: str = "faust",
    partitions: int = 1,
    tables: Tables | None = None,
    max_skew_ms: int = -1,
) -> list[Alert]:
    """Evaluate ``events`` in order; write each shown transition to ``out`` as one JSON
    line (see :attr:`BacktestReport.statuses`) and return every transition.

    ``partitions`` emulates the topic's partition count: per-partition event-time
    clocks decide when windows close and timers fire, exactly as in the worker.
    ``max_skew_ms`` (APP_MAX_EVENT_SKEW, -1: off) bounds how far one event may move a
    partition's clock, as in the worker; refused events are counted and listed in
    ``report`` (docs/event-time.md).
    """
    within = TimeRange.of(time_from, time_to)
    lo, hi = within.lo, within.hi  # plain compares below: the loop runs per event
    eng = Engine(ruleset, engine=engine, partitions=partitions, tables=tables, max_skew_ms=max_skew_ms)
    alerts: list[Alert] = []
    try:
        for source, e in events:
            if (lo is not None and e.ts_ms < lo) or (hi is not None and e.ts_ms >= hi):
                continue
            report.events += 1
            result = eng.process(source, e)
            report.routed += len(result.routed)
            report.late += len(result.late)
            report.refuse(result.refused)
            for a in result.alerts:
                alerts.append(a)
                report.emit(out, a)
    except InputError:  # the summary then counts the late events read before the damage
        report.late_events += eng.stats.late
        raise
    report.refuse(eng.finish().refused)
    report.late_events += eng.stats.late
    report.count_rule_errors(eng.take_rule_errors())
    return alerts


def backtest_line(a: Alert) -> bytes:
    """The documented backtest output line: the alert fields plus ``rule`` for short, first
    (``orjson.dumps({"rule": a.rule_id, **a.to_dict()})``), written from the alert's own JSON
    (``Alert.to_json``): no ``asdict`` deep copy, which took about 1 s of a 9,748-line
    backtest."""
    return b'{"rule":' + orjson.dumps(a.rule_id) + b"," + a.to_json()[1:]


async def read_topics(bootstrap: Target, topics: list[str]) -> list[tuple[int, str, int, int, bytes]]:
    """Every committed record of ``topics`` from the earliest offset up to the last stable
    offset now, as (record timestamp, topic, partition, offset, value), in that order: records
    of one millisecond in the order of their topic, partition and offset, as the Spark
    engine's topic backtest orders them (``jobs.backtest.ordered_records``). Before, they kept
    the order the fetches happened to bring the partitions in, so two runs over the same topic
    could evaluate such records in another order (and a group that spans partitions could
    change its alerts).

    Read to the end (:func:`~app.kafka.clients.read_to_end`): a fetch that brought nothing
    for a second once ended the read there, and the backtest ran on a part of the topic as if
    it were all of it."""
    from app.kafka.clients import topic_records

    out: list[tuple[int, str, int, int, bytes]] = []
    async for r in topic_records(bootstrap, topics):  # committed records only
        if r.value is not None:
            out.append((r.timestamp, r.topic, r.partition, r.offset, r.value))
    out.sort(key=lambda r: r[:4])  # (topic, partition, offset) is unique: a total order
    return out


def read_topic_events(
    bootstrap: Target, topics: list[str], report: BacktestReport, within: TimeRange = TimeRange()
) -> list[tuple[str, Event]]:
    """Source topics from the earliest offset to the current end, as backtest input,
    in record-timestamp order across topics, then topic, partition and offset (as the Spark
    engine's topic backtest orders them). Invalid records are reported with their topic,
    partition and offset (:func:`record_place`), in that order, never silently dropped: each one
    ``within`` places in its range (its readable ``ts``, else its record timestamp:
    :class:`TimeRange`)."""
    import asyncio

    from app.topics import SOURCE_OF_TOPIC

    stamped: list[tuple[tuple[int, str, int, int], str, Event]] = []
    dead: list[tuple[tuple[int, str, int, int], str]] = []
    for topic in topics:
        source = SOURCE_OF_TOPIC.get(topic)
        if source is None:
            msg = f"--topic {topic}: expected one of {', '.join(SOURCE_OF_TOPIC)}"
            raise ValueError(msg)
        for ts, name, part, offset, value in asyncio.run(read_topics(bootstrap, [topic])):
            try:
                stamped.append(((ts, name, part, offset), source, SCHEMAS[source].decode(value)))
            except IngestDecodeError as exc:
                if within.holds(record_time_ms(value, ts)):
                    dead.append(
                        ((ts, name, part, offset), f"{record_place(name, part, offset)}: {exc.reason}")
                    )
    dead.sort(key=lambda x: x[0])  # in the range's order across topics, as the Spark engine lists them
    report.skipped += len(dead)
    report.problems.extend(problem for _, problem in dead)
    stamped.sort(key=lambda x: x[0])
    return [(source, ev) for _, source, ev in stamped]


def record_place(topic: str, partition: int, offset: int) -> str:
    """Where an invalid record of a topic range is, as a backtest's problems name it, on both
    engines: what a consumer needs to read it again (``kcat -t TOPIC -p P -o O -c 1``)."""
    return f"{topic} partition {partition} offset {offset}"


#: compressed input, by the file name's suffix: both backtests read these (Spark's text reader
#: decompresses them itself, with Hadoop's codecs)
COMPRESSED: dict[str, Callable[[Path], io.BufferedIOBase]] = {
    ".gz": lambda p: gzip.open(p, "rb"),
    ".bz2": lambda p: bz2.open(p, "rb"),
}
#: the other suffixes Hadoop's codecs decompress: Spark would read the events and the Faust
#: engine the compressed bytes, so neither reads them
OTHER_CODECS = (".deflate", ".lz4", ".snappy", ".zst")


def input_file(path: Path) -> Path:
    """``path`` if a backtest can read it (a file of JSON lines, plain, ``.gz`` or ``.bz2``),
    else :class:`ValueError` naming it and why; checked before any work starts."""
    if path.suffix in OTHER_CODECS:
        msg = f"--input {path}: compressed as {path.suffix}; a backtest reads JSON lines, plain, .gz or .bz2"
        raise ValueError(msg)
    if path.is_dir():
        msg = f"--input {path}: a directory, not a file of JSON lines"
        raise ValueError(msg)
    if not path.exists():
        msg = f"--input {path}: no such file"
        raise ValueError(msg)
    return path


def open_input(path: Path) -> io.BufferedIOBase:
    """The file's bytes, decompressed when its name says ``.gz`` or ``.bz2``."""
    opener = COMPRESSED.get(path.suffix)
    return opener(path) if opener is not None else path.open("rb")


class InputError(ValueError):
    """The input file could not be read to its end (a damaged ``.gz`` or ``.bz2``, a disk error)."""


#: what reading a damaged file raises: OSError (a disk error; gzip.BadGzipFile, a bad header;
#: bz2's "Invalid data stream"), EOFError (a file cut short) and zlib.error (a ``.gz`` damaged
#: inside its deflate stream: "invalid distance too far back", a bad block type, ...)
UNREADABLE = (OSError, EOFError, zlib.error)


def _read_lines(f: io.BufferedIOBase, path: Path) -> Iterator[bytes]:
    n = 0
    try:
        for n, line in enumerate(f, 1):  # noqa: B007  # n: the lines read, for the error
            yield line
    except UNREADABLE as exc:
        msg = f"--input {path}: unreadable after line {n}: {exc}"
        raise InputError(msg) from exc


def backtest_file(
    ruleset: RuleSet, path: Path, out: TextIO, report: BacktestReport, **kw: Any
) -> list[Alert]:
    """The backtest of the JSON lines of ``path`` (plain, ``.gz`` or ``.bz2``); a file that cannot
    be read to its end raises :class:`InputError` once the lines before the damage are done."""
    with open_input(path) as f:
        within = TimeRange.of(kw.get("time_from"), kw.get("time_to"))
        events = read_events(_read_lines(f, path), str(path), report, kw.pop("source", None), within)
        return backtest(ruleset, events, out, report, **kw)
