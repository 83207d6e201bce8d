"""The alert record that goes on the ``alerts`` topic, with deterministic ids.

Compatible with Alertmanager's alert model (labels, annotations, startsAt,
endsAt, fingerprint, generatorURL) plus our fields: the rule id and version,
severity, the triggering values, and ``alert_id``.

Determinism: ``fingerprint`` is a hash of the sorted labels, and ``alert_id``
is a hash of (rule, fingerprint, episode start, status). The same input gives
the same ids on every run, replay, retry and restart, so receivers can dedup.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson

logger = logging.getLogger(__name__)

Status = Literal["pending", "firing", "resolved", "inactive", "no_data"]
#: Every status an alert transition can carry. ``pending``: the condition holds
#: but ``for``/``consecutive`` are not met yet; ``inactive``: a pending (or
#: no-data) episode ended without firing; ``no_data``: the group stopped
#: reporting (a rule's ``no_data`` option). Only firing and resolved are notified.
STATUSES: tuple[str, ...] = ("pending", "firing", "resolved", "inactive", "no_data")


#: fingerprints by label items, as given (a rule's group raises many transitions): at most
#: ``MAX_FINGERPRINTS`` entries, emptied when full
FINGERPRINTS: dict[tuple[tuple[str, Any], ...], str] = {}
MAX_FINGERPRINTS = 100_000


def fingerprint(labels: Mapping[str, str]) -> str:
    """A 16-hex-digit hash of the sorted label set (like Alertmanager's).

    Remembered by the labels' items in their order (the same set in another order is
    hashed once more, to the same value), up to ``MAX_FINGERPRINTS`` sets at a time."""
    items = tuple(labels.items())
    found = FINGERPRINTS.get(items)
    if found is not None:
        return found
    h = hashlib.blake2b(digest_size=8)
    for k in sorted(labels):
        h.update(k.encode())
        h.update(b"\xff")
        h.update(str(labels[k]).encode())
        h.update(b"\xff")
    fp = h.hexdigest()
    if len(FINGERPRINTS) >= MAX_FINGERPRINTS:
        FINGERPRINTS.clear()
    FINGERPRINTS[items] = fp
    return fp


def alert_id(rule_id: str, fp: str, starts_at: str, status: str) -> str:
    """The id of one transition of one alert episode (32 hex digits)."""
    raw = "\x1f".join((rule_id, fp, starts_at, status)).encode()
    return hashlib.sha256(raw).hexdigest()[:32]


class RuleFacts:
    """What every alert of one rule takes from the rule, read from its model once.

    Each :class:`CompiledRule <app.rules.loader.CompiledRule>` holds one (``facts``). The
    rule's model is a pydantic model: each attribute read from compiled code is a generic
    lookup through its ``__getattr__`` hook, and the evaluator builds an alert for every
    transition and a group row for every window it closes. ``labels`` holds the labels
    every alert of the rule starts with, in their order: ``alertname``, ``severity``, then
    the rule's own."""

    def __init__(
        self, rule_id: str, version: str, severity: str, source: str, labels: Mapping[str, str],
        annotations: Mapping[str, str], description: str, group_by: tuple[str, ...],
    ) -> None:  # fmt: skip
        self.rule_id = rule_id
        self.version = version
        self.severity = severity
        self.source = source
        self.labels: dict[str, str] = {"alertname": rule_id, "severity": severity, **labels}
        self.annotations: dict[str, str] = dict(annotations)
        self.description = description
        self.group_by = group_by


@dataclass(init=False)
class Alert:
    """One alert transition. Times are RFC 3339 UTC strings in event time. Treat it as
    immutable: nothing changes an alert once built.

    Not a frozen dataclass, and its ``__init__`` is written out: the ``__init__`` that
    ``dataclass`` generates runs as interpreted code even where this module is compiled,
    and a frozen one sets each field through ``object.__setattr__``. This one, compiled,
    stores the fields directly, which keeps building an alert (the evaluator builds one for
    every transition) cheap."""

    alert_id: str
    rule_id: str
    rule_version: str
    status: Status
    severity: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str
    ends_at: str | None
    fingerprint: str
    source: str
    event_ts: str
    values: dict[str, Any] = field(default_factory=dict)
    generator_url: str = ""

    def __init__(
        self, alert_id: str, rule_id: str, rule_version: str, status: Status, severity: str,
        labels: dict[str, str], annotations: dict[str, str], starts_at: str, ends_at: str | None,
        fingerprint: str, source: str, event_ts: str, values: dict[str, Any] | None = None,
        generator_url: str = "",
    ) -> None:  # fmt: skip
        self.alert_id = alert_id
        self.rule_id = rule_id
        self.rule_version = rule_version
        self.status = status
        self.severity = severity
        self.labels = labels
        self.annotations = annotations
        self.starts_at = starts_at
        self.ends_at = ends_at
        self.fingerprint = fingerprint
        self.source = source
        self.event_ts = event_ts
        self.values = {} if values is None else values
        self.generator_url = generator_url

    @classmethod
    def build(
        cls,
        *,
        rule_id: str,
        rule_version: str,
        status: Status,
        severity: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        starts_at: str,
        ends_at: str | None,
        source: str,
        event_ts: str,
        values: Mapping[str, Any],
    ) -> Alert:
        """Derive the fingerprint and the id, so callers cannot get them wrong.

        It builds an ``Alert`` by name, not ``cls``: compiled, that is a direct call of the
        constructor, where a call of ``cls`` goes through the type's call and parses the
        keywords. Compiled classes take no interpreted subclasses, so ``cls`` is always
        ``Alert``."""
        lbls = dict(labels)
        fp = fingerprint(lbls)
        return Alert(
            alert_id=alert_id(rule_id, fp, starts_at, status),
            rule_id=rule_id,
            rule_version=rule_version,
            status=status,
            severity=severity,
            labels=lbls,
            annotations=dict(annotations),
            starts_at=starts_at,
            ends_at=ends_at,
            fingerprint=fp,
            source=source,
            event_ts=event_ts,
            values=dict(values),
            generator_url=f"/rules/{rule_id}",
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> bytes:
        """The same bytes as ``orjson.dumps(self.to_dict())``, without ``asdict``'s deep copy (~100 us)."""
        return orjson.dumps(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Alert:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    @classmethod
    def from_json(cls, raw: bytes | str) -> Alert:
        return cls.from_dict(orjson.loads(raw))


#: Within one episode (same ``starts_at`` and ``event_ts``): pending, then firing or
#: no data, then its end (resolved, or inactive for an episode that never fired).
STATUS_RANK = {"pending": 0, "firing": 1, "no_data": 1, "resolved": 2, "inactive": 2}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(value: str, what: str, alert_id: str) -> int:
    try:
        ts = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        msg = f"alert {alert_id}: {what}={value!r} is not an RFC 3339 time"
        raise ValueError(msg) from None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return (ts - _EPOCH) // _MICROSECOND  # exact, unlike float timestamps


def order_key(alert: Alert) -> tuple[int, int, int]:
    """``(starts_at µs, event_ts µs, status rank)``: how an alert's transitions are ordered,
    compared as instants (not strings); a greater key is the newer state.
    Raises ValueError naming the alert and field when a time does not parse."""
    if alert.status not in STATUS_RANK:
        msg = f"alert {alert.alert_id}: unknown status {alert.status!r}"
        raise ValueError(msg)
    return (
        _micros(alert.starts_at, "starts_at", alert.alert_id),
        _micros(alert.event_ts, "event_ts", alert.alert_id),
        STATUS_RANK[alert.status],
    )
