"""The raw readings of an alert's group around the alert, for the input chart of its detail.

The pure half (the Kafka read is :mod:`app.console.source_reader`):

- :func:`plan_readings` says what to read: the rule's source topic (``events.<source>``),
  the topic key of the group's records when the rule groups by the source's key (then one
  partition holds them all: :func:`app.placement.partition_for`; otherwise every partition
  is read and the group's records are told by their fields), the field to plot and the
  event-time window: from the alert's start minus the rule's window (an hour for a rule
  without one) to the alert's end, or now while it is active;
- :class:`Collector` takes the records read one at a time, decodes each with the source's
  schema (the worker's own parser: nothing a device wrote is evaluated), keeps the group's
  readings of the field inside the window and says when a partition holds no more of them
  (a reading of the group past the window's end: a group's events come in event-time order);
- :func:`describe` turns what the read met (its bounds, the topic's retention) into the
  sentence shown under the chart.

Times are epoch milliseconds, UTC. Bad input (a record that does not decode, a field that
is not a number) is skipped, never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from app.errors import IngestDecodeError
from app.events import SCHEMAS, Event, format_ts
from app.topics import SOURCE_TOPICS

logger = logging.getLogger(__name__)

#: the most records one chart reads (probes included), over every partition it reads
MAX_RECORDS = 20_000
#: the most seconds one chart's read takes, connecting included
BUDGET_S = 3.0
#: how far before the alert's start the chart begins for a rule without a window
LOOKBACK_MS = 3_600_000


@dataclass(frozen=True)
class ReadingsPlan:
    """What to read for one alert's chart. ``key``: the topic key of the group's records
    (None: they may have any key, every partition is read); ``match``: the group's
    ``group_by`` fields and values each record's fields must equal; ``start_ms`` and
    ``end_ms``: the event-time window, both included."""

    source: str
    topic: str
    field: str
    key: bytes | None
    match: tuple[tuple[str, str], ...]
    start_ms: int
    end_ms: int


@dataclass(frozen=True)
class Reading:
    """One reading of the plotted field: its event time and value."""

    ts_ms: int
    value: float


@dataclass
class ReadReport:
    """What the read met. ``records``: records read (probes included); ``bound``: "" or which
    bound stopped it ("records", "time"); ``retained_from_ms``: the event time of the group's
    oldest retained reading when the topic's retention already deleted the start of the
    window (None: it did not, as far as the read can tell); ``error``: why nothing was read."""

    records: int = 0
    bound: str = ""
    retained_from_ms: int | None = None
    partitions: tuple[int, ...] = ()
    error: str = ""


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def plan_readings(
    *,
    source: str,
    group_by: Sequence[str],
    field: str | None,
    window_ms: int | None,
    labels: Mapping[str, str],
    starts_at: str,
    ends_at: str | None,
    now_ms: int,
) -> ReadingsPlan | str:
    """The read for an alert of a rule (its ``source``, ``group_by``, plotted ``field`` and
    ``window_ms``) with ``labels`` that started at ``starts_at`` (RFC 3339) and ended at
    ``ends_at`` (None: active, the window ends at ``now_ms``). A string says why there is
    nothing to read (no field, an unknown source, a group label missing, bad times)."""
    schema = SCHEMAS.get(source)
    if schema is None or source not in SOURCE_TOPICS:
        return f"the source {source!r} has no topic"
    if not field:
        return "the rule names no input field to plot"
    if "." in field:
        return f"{field} is joined from a registry table, not a field of the source's events"
    missing = [g for g in group_by if g not in labels]
    if missing:
        return f"the alert has no label {', '.join(missing)} to find its group's readings by"
    try:
        start = _ms(starts_at) - (window_ms or LOOKBACK_MS)
        end = _ms(ends_at) if ends_at else now_ms
    except ValueError:
        return f"the alert's times cannot be read ({starts_at!r}, {ends_at!r})"
    match = tuple((g, labels[g]) for g in group_by)
    key = labels[schema.key].encode() if schema.key in group_by else None
    return ReadingsPlan(source, SOURCE_TOPICS[source], field, key, match, start, max(start, end))


@dataclass
class Collector:
    """The group's readings among the records offered, per :class:`ReadingsPlan`."""

    plan: ReadingsPlan
    readings: list[Reading] = field(default_factory=list)
    #: records of the group seen (in the window or not)
    seen: int = 0

    def group_event(self, key: bytes | None, value: bytes | None) -> Event | None:
        """A record of the group, decoded; None for any other record (another group's, or
        one that does not decode)."""
        plan = self.plan
        if plan.key is not None and key != plan.key:
            return None
        try:
            ev = SCHEMAS[plan.source].decode(value)
        except IngestDecodeError:
            return None
        fields = ev.fields
        for name, wanted in plan.match:
            got = fields.get(name)
            if got is None or (got if isinstance(got, str) else str(got)) != wanted:
                return None
        return ev

    def event_time(self, key: bytes | None, value: bytes | None) -> int | None:
        """The event time of a record of the group; None for any other record."""
        ev = self.group_event(key, value)
        return None if ev is None else ev.ts_ms

    def offer(self, key: bytes | None, value: bytes | None) -> bool:
        """Take one record of a partition, in offset order; False once that partition holds
        no more readings of the window (a reading of the group past its end)."""
        ev = self.group_event(key, value)
        if ev is None:
            return True
        self.seen += 1
        if ev.ts_ms > self.plan.end_ms:
            return False
        if ev.ts_ms >= self.plan.start_ms:
            raw = ev.fields.get(self.plan.field)
            if isinstance(raw, int | float) and not isinstance(raw, bool):
                self.readings.append(Reading(ev.ts_ms, float(raw)))
        return True

    def points(self) -> list[dict[str, object]]:
        """The readings as chart rows (time as RFC 3339, value), in event-time order."""
        return [
            {"time": format_ts(r.ts_ms), "value": r.value}
            for r in sorted(self.readings, key=lambda r: r.ts_ms)
        ]


def describe(plan: ReadingsPlan, report: ReadReport, readings: int) -> str:
    """The sentence under the chart: what was read, and when a bound or the topic's retention
    cut the readings short."""
    if report.error:
        return f"raw readings not available: {report.error}"
    group = ", ".join(f"{k}={v}" for k, v in plan.match) or "every event (the rule has no group_by)"
    where = f"partition {report.partitions[0]}" if len(report.partitions) == 1 else "every partition"
    parts = [
        f"{readings} reading(s) of {plan.field} for {group} from {report.records} record(s) of "
        f"{plan.topic} ({where}), {format_ts(plan.start_ms)} to {format_ts(plan.end_ms)}"
    ]
    if report.bound == "records":
        parts.append(f"stopped at the bound of {MAX_RECORDS} records read: later readings are not shown")
    elif report.bound == "time":
        parts.append(f"stopped at the time budget of {BUDGET_S:g} s: later readings are not shown")
    if report.retained_from_ms is not None and report.retained_from_ms >= plan.end_ms:
        parts.append("the topic's retention no longer has any record of the window")
    elif report.retained_from_ms is not None:
        parts.append(
            "the topic's retention starts inside the window: readings before "
            f"{format_ts(report.retained_from_ms)} are no longer there"
        )
    return "; ".join(parts)
