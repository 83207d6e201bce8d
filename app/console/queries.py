"""The console's reads of the alert store: bounded, indexed queries, one read-only connection.

Every query here is what one console refresh runs; each is bounded (``LIMIT``, a
time range on an indexed column, or ``GROUP BY`` over an index), so a refresh stays
well under 300 ms with 10,000 current alerts and 100,000 transitions
(``bench/bench_console.py`` prints it). Nothing here reads Kafka.

Labels as filtered and shown are the labels as notified: the alert's labels with
``alertname`` (the rule id) and ``severity`` added when absent, so a matcher such as
``severity="critical", device_id=~"pump-.*"`` means here what it means in a silence.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from app.alerts import Alert
from app.dispatch.base import iso
from app.dispatch.matchers import Matcher, matches_all, parse_matcher
from app.storage.alert_store import CurrentAlert, current_columns
from app.storage.sqlite import select_in

logger = logging.getLogger(__name__)

#: severities in the order the console shows them (others after, by name)
SEVERITY_ORDER = ("critical", "error", "warning", "info")
ACTIVE = ("firing", "pending", "no_data")


def retired(a: CurrentAlert, running: frozenset[tuple[str, str]] | None) -> bool:
    """Whether ``a`` is open under a rule version that no longer runs (removed or edited since
    it fired; ``running``: ``app.rules.loader.running_versions``, None when unknown): no engine
    will end it (docs/rules.md, hot reload)."""
    return running is not None and a.status in ACTIVE and (a.rule_id, a.rule_version) not in running


_ONE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|[^\s,"{}]*)')
_SEPARATOR = re.compile(r"[\s,]*")


def split_matchers(text: str) -> tuple[Matcher, ...]:
    """Parse a filter such as ``severity="critical", device_id=~"pump-.*"`` (commas or spaces
    between matchers; braces optional). ValueError naming what is not a matcher."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    out: list[Matcher] = []
    pos = _SEPARATOR.match(body, 0).end()  # type: ignore[union-attr]
    while pos < len(body):
        m = _ONE.match(body, pos)
        if m is None:
            rest = body[pos:].split(",")[0].strip()
            return (parse_matcher(rest),)  # raises, naming the expected form
        out.append(parse_matcher(m.group(0)))
        pos = _SEPARATOR.match(body, m.end()).end()  # type: ignore[union-attr]
    return tuple(out)


def notified_labels(a: CurrentAlert) -> dict[str, str]:
    """The labels a silence or route sees: ``alertname`` and ``severity`` added when absent."""
    return {"alertname": a.rule_id, "severity": a.severity, **a.labels}


def severity_rank(severity: str) -> int:
    return SEVERITY_ORDER.index(severity) if severity in SEVERITY_ORDER else len(SEVERITY_ORDER)


@dataclass(frozen=True)
class AlertPage:
    """Alerts that matched a filter: ``rows`` (at most the limit) of ``total`` matching."""

    rows: list[CurrentAlert]
    total: int


@dataclass(frozen=True)
class RuleActivity:
    """One rule as the store saw it: current alerts by status, transitions recorded, the latest."""

    rule_id: str
    by_status: dict[str, int]
    transitions: int
    last_event: str | None


class ConsoleQueries:
    """A read-only connection to the alert store at ``path``; FileNotFoundError if it is
    missing. Use as a context manager, one per refresh (a connection belongs to its thread)."""

    def __init__(self, path: Path | str) -> None:
        p = Path(path)
        if not p.exists():
            msg = f"alert store {p} does not exist yet"
            raise FileNotFoundError(msg)
        self._conn = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
        self._conn.execute("PRAGMA query_only=ON")
        self._conn.execute("PRAGMA busy_timeout=5000")
        #: a CurrentAlert's columns (a store not yet migrated to schema 3 reads "" as the engine)
        self._cols = current_columns(self._conn)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ConsoleQueries:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- overview -------------------------------------------------------------------------

    def has_data(self) -> bool:
        """True once the store has a transition (False while its tables do not exist yet)."""
        try:
            return self._conn.execute("SELECT 1 FROM transitions LIMIT 1").fetchone() is not None
        except sqlite3.OperationalError:
            return False

    def counts(self) -> dict[str, dict[str, int]]:
        """Current alerts as ``{status: {severity: n}}`` (the ``alerts_by_status`` index)."""
        out: dict[str, dict[str, int]] = {}
        for status, sev, n in self._conn.execute(
            "SELECT status, severity, COUNT(*) FROM alerts GROUP BY status, severity"
        ):
            out.setdefault(status, {})[sev] = n
        return out

    def rate(self, now: datetime, minutes: int = 60) -> list[dict[str, Any]]:
        """Transitions recorded per minute (wall clock) and status over the last ``minutes``:
        ``[{"minute": "2024-05-01T10:07", "status": "firing", "n": 3}, ...]``. One range
        count per minute on the covering ``transitions_by_recorded`` index (a single
        ``GROUP BY`` over an expression sorted every row of the hour: four times slower)."""
        end = now.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        out = []
        for i in range(minutes, 0, -1):
            lo, hi = end - timedelta(minutes=i), end - timedelta(minutes=i - 1)
            for status, n in self._conn.execute(
                "SELECT status, COUNT(*) FROM transitions WHERE recorded_at >= ? AND recorded_at < ? "
                "GROUP BY status",
                (lo.isoformat(), hi.isoformat()),
            ):
                out.append({"minute": lo.strftime("%Y-%m-%dT%H:%M"), "status": status, "n": n})
        return out

    def newest_event(self) -> str | None:
        """The latest event time of any recorded transition (the ``transitions_by_time`` index)."""
        row = self._conn.execute("SELECT alert FROM transitions ORDER BY event_us DESC LIMIT 1").fetchone()
        return None if row is None else Alert.from_json(row[0]).event_ts

    # -- alerts ---------------------------------------------------------------------------

    def alerts(
        self,
        matchers: Sequence[Matcher] = (),
        statuses: Iterable[str] = ACTIVE,
        limit: int = 500,
    ) -> AlertPage:
        """Current alerts in ``statuses`` whose notified labels match every matcher, most
        recently started first: the first ``limit`` of ``total``. The matchers run inside
        SQLite (a function over the labels column), so only the rows shown are decoded."""
        wanted = tuple(statuses)
        ms = tuple(matchers)

        def match(labels: str, rule_id: str, severity: str) -> int:
            got = {"alertname": rule_id, "severity": severity, **orjson.loads(labels)}
            return 1 if matches_all(ms, got) else 0

        self._conn.create_function("console_match", 3, match, deterministic=True)
        cond = f"status IN ({','.join('?' * len(wanted))})"
        args: list[Any] = list(wanted)
        for m in ms:  # equalities first, on columns, so the function sees fewer rows
            if m.op == "=" and m.name in ("alertname", "severity"):
                cond += " AND rule_id = ?" if m.name == "alertname" else " AND severity = ?"
                args.append(m.value)
        if ms:
            cond += " AND console_match(labels, rule_id, severity)"
        ids = [
            r[0]
            for r in self._conn.execute(
                f"SELECT rowid FROM alerts WHERE {cond} ORDER BY starts_us DESC",  # noqa: S608 - placeholders only
                args,
            )
        ]
        shown = ids[:limit]
        if not shown:
            return AlertPage([], len(ids))
        rows = self._conn.execute(
            f"SELECT {self._cols} FROM alerts WHERE rowid IN ({','.join('?' * len(shown))}) "  # noqa: S608
            "ORDER BY starts_us DESC",
            shown,
        ).fetchall()
        return AlertPage([_current(r) for r in rows], len(ids))

    def alert(self, rule_id: str, fingerprint: str) -> CurrentAlert | None:
        row = self._conn.execute(
            f"SELECT {self._cols} FROM alerts WHERE rule_id = ? AND fingerprint = ?",  # noqa: S608
            (rule_id, fingerprint),
        ).fetchone()
        return None if row is None else _current(row)

    def transitions(self, rule_id: str, fingerprint: str, limit: int = 200) -> list[Alert]:
        """One alert's transitions, oldest first (the ``transitions_by_alert`` index)."""
        rows = self._conn.execute(
            "SELECT alert FROM transitions WHERE rule_id = ? AND fingerprint = ? "
            "ORDER BY event_us DESC, rowid DESC LIMIT ?",
            (rule_id, fingerprint, limit),
        ).fetchall()
        return [Alert.from_json(r[0]) for r in reversed(rows)]

    def engines_of(self, alert_ids: Iterable[str]) -> dict[str, str]:
        """The engine(s) that produced each of ``alert_ids`` ("" for a transition recorded
        before the store kept engines); {} on a store not yet migrated."""
        ids = list(alert_ids)[:500]
        if not ids or "AS engine" in self._cols:
            return {}
        rows = self._conn.execute(
            "SELECT alert_id, engine FROM transitions "  # noqa: S608 - placeholders only
            f"WHERE alert_id IN ({','.join('?' * len(ids))})",
            ids,
        ).fetchall()
        return dict(rows)

    def notifications_for(self, alert_ids: Iterable[str], limit: int = 50) -> list[dict[str, Any]]:
        """Notifications that carried any of ``alert_ids``: receiver, status, webhook id (the
        message id), attempts, reason, and when the last changed (RFC 3339 UTC); latest first."""
        ids = [i for i in alert_ids if i]
        if not ids:
            return []
        cond = " OR ".join("instr(alert_ids, ?) > 0" for _ in ids)
        rows = self._conn.execute(
            "SELECT msg_id, receiver, status, attempts, reason, updated_at FROM notifications "  # noqa: S608
            f"WHERE {cond} ORDER BY updated_at DESC LIMIT ?",
            [*ids, limit],
        )
        cols = ("webhook_id", "receiver", "status", "attempts", "reason", "updated_at")
        # the store keeps Unix seconds; the console shows times as RFC 3339 UTC, like the rest
        return [dict(zip(cols, (*r[:5], iso(r[5])), strict=True)) for r in rows]

    def acks_of(self, fingerprint: str) -> list[dict[str, Any]]:
        cols = ("starts_at", "by", "comment", "at")
        rows = self._conn.execute(
            "SELECT starts_at, by, comment, at FROM acks WHERE fingerprint = ? ORDER BY at DESC",
            (fingerprint,),
        )
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def acked(self, fingerprints: Iterable[str]) -> set[tuple[str, str]]:
        """``(fingerprint, starts_at)`` pairs acked among ``fingerprints`` (starts_at "" = every
        episode)."""
        return set(
            select_in(
                self._conn, "SELECT fingerprint, starts_at FROM acks WHERE fingerprint IN", fingerprints
            )
        )

    # -- rules ----------------------------------------------------------------------------

    def rule_activity(self) -> dict[str, RuleActivity]:
        """Per rule: current alerts by status, transitions recorded and the latest event time."""
        by_status: dict[str, dict[str, int]] = {}
        for rule, status, n in self._conn.execute(
            "SELECT rule_id, status, COUNT(*) FROM alerts GROUP BY rule_id, status"
        ):
            by_status.setdefault(rule, {})[status] = n
        out: dict[str, RuleActivity] = {}
        for rule, n, last_us in self._conn.execute(
            "SELECT rule_id, COUNT(*), MAX(event_us) FROM transitions GROUP BY rule_id"
        ):
            last = datetime.fromtimestamp(last_us / 1e6, tz=UTC).isoformat() if last_us is not None else None
            out[rule] = RuleActivity(rule, by_status.get(rule, {}), n, last)
        for rule, st in by_status.items():
            out.setdefault(rule, RuleActivity(rule, st, 0, None))
        return out

    # -- map ------------------------------------------------------------------------------

    def devices(self, ids: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """Per ``device_id`` label (only ``ids`` if given, through the ``alerts_by_device``
        index): the worst active severity (None when nothing is active), how many alerts are
        active, and the last position an alert carried (``lat``/``lon`` values)."""
        out: dict[str, dict[str, Any]] = {}
        sql = (
            "SELECT json_extract(labels, '$.device_id') AS d, status, severity, "
            "json_extract(values_json, '$.lat'), json_extract(values_json, '$.lon'), event_us FROM alerts "
        )
        wanted = None if ids is None else list(ids)
        if wanted is None:
            rows = self._conn.execute(sql + "WHERE d IS NOT NULL ORDER BY event_us").fetchall()
        else:
            rows = []
            for i in range(0, len(wanted), 500):
                chunk = wanted[i : i + 500]
                rows += self._conn.execute(
                    sql + f"WHERE json_extract(labels, '$.device_id') IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
            rows.sort(key=lambda r: r[5])
        for dev, status, sev, lat, lon, _us in rows:
            cur = out.setdefault(dev, {"severity": None, "active": 0, "lat": None, "lon": None})
            if status in ACTIVE:
                cur["active"] += 1
                if cur["severity"] is None or severity_rank(sev) < severity_rank(cur["severity"]):
                    cur["severity"] = sev
            if isinstance(lat, int | float) and isinstance(lon, int | float):
                cur["lat"], cur["lon"] = float(lat), float(lon)
        return out

    # -- silences -------------------------------------------------------------------------

    def silences(
        self, now: datetime, include_expired: bool = False, limit: int = 200
    ) -> list[dict[str, Any]]:
        """Silences active at ``now`` (and expired ones too if asked), latest end first."""
        cols = ("id", "matchers", "starts_at", "ends_at", "created_by", "comment", "ended_by")
        rows = [
            dict(zip(cols, r, strict=True))
            for r in self._conn.execute(
                f"SELECT {', '.join(cols)} FROM silences ORDER BY ends_at DESC LIMIT ?",  # noqa: S608
                (limit * 4,),
            )
        ]
        out = []
        for r in rows:
            r["matchers"] = orjson.loads(r["matchers"])
            r["active"] = _instant(r["starts_at"]) <= now < _instant(r["ends_at"])
            if r["active"] or include_expired:
                out.append(r)
        return out[:limit]


def silence_preview(queries: ConsoleQueries, matchers: Sequence[Matcher], limit: int = 200) -> AlertPage:
    """The current alerts (firing, pending, no data) a silence with ``matchers`` would mute."""
    if not matchers:
        return AlertPage([], 0)
    return queries.alerts(matchers, limit=limit)


def _instant(value: str) -> datetime:
    ts = datetime.fromisoformat(value)
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _current(row: tuple[Any, ...]) -> CurrentAlert:
    fields = list(row)
    for i in (4, 5, 9):  # labels, annotations, values
        fields[i] = orjson.loads(fields[i])
    return CurrentAlert(*fields)
