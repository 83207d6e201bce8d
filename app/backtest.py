"""Backtest: run rules over recorded events in event-time order with the production evaluator.

Input is JSON lines of events (the converters' output); each line's source is
given (``--source``) or inferred from its key field (``device_id`` -> sensors,
``host`` -> logs, ``symbol`` -> finance). Invalid lines are reported with
their line number and skipped, never silently. Output is one JSON object per
alert transition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson

from app.alerts import Alert
from app.errors import IngestDecodeError
from app.events import SCHEMAS, Event, parse_ts
from app.rules.evaluator import Engine
from app.rules.loader import RuleSet
from app.tables import Tables

logger = logging.getLogger(__name__)

_KEY_TO_SOURCE = {s.key: s.source for s in SCHEMAS.values()}


@dataclass
class BacktestReport:
    events: int = 0
    skipped: int = 0
    alerts: int = 0
    routed: int = 0
    late: int = 0
    problems: list[str] = field(default_factory=list)


def infer_source(obj: dict[str, Any]) -> str | None:
    for key, source in _KEY_TO_SOURCE.items():
        if key in obj:
            return source
    return None


def read_events(
    lines: Iterable[bytes | str], name: str, report: BacktestReport, source: str | None = None
) -> Iterator[tuple[str, Event]]:
    """Decode JSON lines into ``(source, event)``; problems go to ``report``."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
            src = source or (infer_source(obj) if isinstance(obj, dict) else None)
            if src is None:
                msg = "cannot tell the source: no device_id, host or symbol field"
                raise IngestDecodeError(msg)
            yield src, SCHEMAS[src].validate(obj)
        except (orjson.JSONDecodeError, IngestDecodeError) as exc:
            report.skipped += 1
            reason = exc.reason if isinstance(exc, IngestDecodeError) else f"not valid JSON: {exc}"
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
) -> list[Alert]:
    """Evaluate ``events`` in order; write each transition to ``out`` as one JSON line.

    ``partitions`` emulates the topic's partition count: per-partition event-time
    clocks decide when windows close and timers fire, exactly as in the worker.
    """
    lo = parse_ts(time_from, "--from") if time_from else None
    hi = parse_ts(time_to, "--to") if time_to else None
    eng = Engine(ruleset, engine=engine, partitions=partitions, tables=tables)
    alerts: list[Alert] = []
    for source, e in events:
        if (lo is not None and e.ts_ms < lo) or (hi is not None and e.ts_ms >= hi):
            continue
        report.events += 1
        result = eng.process(source, e)
        report.routed += len(result.routed)
        report.late += len(result.late)
        for a in result.alerts:
            alerts.append(a)
            out.write(orjson.dumps(backtest_line(a)).decode() + "\n")
    report.alerts = len(alerts)
    return alerts


def backtest_line(a: Alert) -> dict[str, Any]:
    """The documented backtest output: the alert fields plus ``rule`` for short."""
    return {"rule": a.rule_id, **a.to_dict()}


def backtest_file(
    ruleset: RuleSet, path: Path, out: TextIO, report: BacktestReport, **kw: Any
) -> list[Alert]:
    with path.open("rb") as f:
        return backtest(ruleset, read_events(f, str(path), report, kw.pop("source", None)), out, report, **kw)
