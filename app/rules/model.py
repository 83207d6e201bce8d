"""Frozen, typed rule models parsed from YAML, with durations converted at the boundary.

A rule file holds ``rules:`` (a list) and may set a file-wide ``engine``.
Unknown keys are errors. A rule's *kind* follows from the keys it uses (see
:attr:`Rule.kind`); combining two kinds is an error. Semantic checks that
need the source schema (expressions, fields, templates) happen in
:mod:`app.rules.loader`, which reports them against the same YAML paths.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from app.rules.durations import parse_duration
from app.topics import SYSTEM_TOPIC_PREFIXES, SYSTEM_TOPICS

Severity = Literal["critical", "warning", "info"]
Engine = Literal["faust", "spark", "both"]
Source = Literal["sensors", "logs", "finance"]
Kind = Literal["threshold", "window", "absence", "change", "new_term", "sequence", "branch"]
LatePolicy = Literal["drop", "side", "amend"]

#: A duration in milliseconds, written as ``30s``, ``15m``, ``1h``...
DurationMs = Annotated[int, BeforeValidator(parse_duration)]
#: A duration that must be above 0: a window's size, advance or gap, a wait, a horizon.
#: ``0s`` is refused when the rule loads (``'size' must be above 0``), never met per event.
PositiveDurationMs = Annotated[int, BeforeValidator(parse_duration), Field(gt=0)]

_ID_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
_LABEL_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$"
_NAME_PATTERN = r"^[a-z_][a-z0-9_]{0,63}$"
_TOPIC_PATTERN = r"^[a-zA-Z0-9._-]{1,200}$"

#: Event alerts (change, new term, sequence, session windows) resolve on their own
#: this long (event time) after their last trigger unless a rule says otherwise.
DEFAULT_RESOLVE_AFTER_MS = 5 * 60_000


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class WindowSpec(_Frozen):
    """Event-time window. ``tumbling``: fixed ``size``; ``hopping``: ``size``
    every ``advance``; ``sliding``: the trailing ``size`` before every event and
    every expiry; ``session``: events closer than ``gap``."""

    type: Literal["tumbling", "hopping", "sliding", "session"]
    size: PositiveDurationMs | None = None
    advance: PositiveDurationMs | None = None
    gap: PositiveDurationMs | None = None

    @model_validator(mode="after")
    def _shape(self) -> WindowSpec:
        need = {"tumbling": {"size"}, "sliding": {"size"}, "hopping": {"size", "advance"}, "session": {"gap"}}
        given = {k for k in ("size", "advance", "gap") if getattr(self, k) is not None}
        if given != need[self.type]:
            want = " and ".join(sorted(need[self.type]))
            msg = f"a {self.type} window takes {want} (got {', '.join(sorted(given)) or 'nothing'})"
            raise ValueError(msg)
        if self.type == "hopping" and self.size and self.advance:
            if self.advance > self.size or self.size % self.advance:
                msg = "a hopping window's size must be a whole multiple of its advance"
                raise ValueError(msg)
        return self

    @property
    def step(self) -> int:
        """Distance between consecutive window starts (tumbling: size)."""
        return int(self.advance or self.size or 0)


class EnrichSpec(_Frozen):
    """Join each event with a row of a registry table, fields named ``<as>.<column>``."""

    table: Literal["devices", "watchlists"]
    on: str
    as_: str = Field(alias="as", pattern=_NAME_PATTERN)
    missing: Literal["skip", "null"] = "skip"


class NewTermSpec(_Frozen):
    field: str
    horizon: PositiveDurationMs = 7 * 86_400_000


NoDataState = Literal["no_data", "alerting", "ok", "keep"]


class NoDataSpec(_Frozen):
    """What a threshold rule's group does once it has sent nothing for longer
    than ``after`` (event time, as absence rules measure silence), like
    Grafana's "no data" handling: ``no_data`` (a ``no_data`` transition,
    recorded and shown, not notified), ``alerting`` (fire), ``ok`` (resolve a
    firing alert, end a pending one) or ``keep`` (change nothing)."""

    after: PositiveDurationMs
    state: NoDataState = "no_data"


class SequenceStep(_Frozen):
    name: str = Field(pattern=_NAME_PATTERN)
    where: str
    times: int = Field(default=1, ge=1, le=1000)
    absent: bool = False


class BranchArm(_Frozen):
    when: str | None = None
    to: str | None = Field(default=None, pattern=_TOPIC_PATTERN)
    otherwise: str | None = Field(default=None, pattern=_TOPIC_PATTERN)

    @field_validator("to", "otherwise")
    @classmethod
    def _kafka_topic(cls, value: str | None) -> str | None:
        if value in (".", ".."):
            msg = f"{value!r} is not a Kafka topic name"
            raise ValueError(msg)
        if value is not None and (value in SYSTEM_TOPICS or value.startswith(SYSTEM_TOPIC_PREFIXES)):
            msg = f"{value!r} is one of the system's own topics; a rule may branch events to any other topic"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _shape(self) -> BranchArm:
        if self.otherwise is not None and (self.when is not None or self.to is not None):
            msg = "a branch arm is either {when, to} or {otherwise}"
            raise ValueError(msg)
        if self.otherwise is None and (self.when is None or self.to is None):
            msg = "a branch arm needs both 'when' and 'to' (or just 'otherwise')"
            raise ValueError(msg)
        return self

    @property
    def topic(self) -> str:
        return str(self.to or self.otherwise)


class Rule(_Frozen):
    """One rule. See docs/rules.md for every key."""

    id: str = Field(pattern=_ID_PATTERN)
    description: str = ""
    source: Source
    severity: Severity = "warning"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    group_by: tuple[str, ...] = ()
    enrich: tuple[EnrichSpec, ...] = ()
    where: str | None = None
    engine: Engine | None = None
    # threshold lifecycle
    for_ms: DurationMs = Field(default=0, alias="for")
    consecutive: int = Field(default=1, ge=1, le=10_000)
    keep_firing_for: DurationMs = 0
    clear: str | None = None
    no_data: NoDataSpec | None = None
    # windows
    window: WindowSpec | None = None
    aggregate: dict[str, str] = Field(default_factory=dict)
    having: str | None = None
    allowed_lateness: DurationMs = 0
    late_policy: LatePolicy = "drop"
    #: threshold, change and sequence rules: evaluate each group's events as they arrive, or in
    #: event-time order once the watermark (clock - allowed_lateness) passes them
    order: Literal["arrival", "event_time"] = "arrival"
    # absence, change, new term, sequence
    absent_for: PositiveDurationMs | None = None
    expect_from: Literal["devices"] | None = None
    change: str | None = None
    new_term: NewTermSpec | None = None
    sequence: tuple[SequenceStep, ...] = ()
    within: PositiveDurationMs | None = None
    resolve_after: PositiveDurationMs = DEFAULT_RESOLVE_AFTER_MS
    # routing of events
    branch: tuple[BranchArm, ...] = ()

    @field_validator("labels")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.match(_LABEL_PATTERN, name):
                msg = f"label name {name!r} must match {_LABEL_PATTERN}"
                raise ValueError(msg)
            if name in ("alertname", "severity"):
                msg = f"label {name!r} is set by the system; use the rule id or severity instead"
                raise ValueError(msg)
        return value

    @field_validator("group_by")
    @classmethod
    def _unique_group_by(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            msg = "group_by lists a field twice"
            raise ValueError(msg)
        return value

    @field_validator("aggregate")
    @classmethod
    def _aggregate_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.match(_NAME_PATTERN, name):
                msg = f"aggregate name {name!r} must match {_NAME_PATTERN}"
                raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Rule:
        markers = {
            "window": self.window is not None,
            "absent_for": self.absent_for is not None,
            "change": self.change is not None,
            "new_term": self.new_term is not None,
            "sequence": bool(self.sequence),
            "branch": bool(self.branch),
        }
        used = [k for k, v in markers.items() if v]
        if len(used) > 1:
            msg = f"a rule has one kind, but this one combines {' and '.join(used)}"
            raise ValueError(msg)
        kind = self.kind
        if kind == "threshold" and self.where is None:
            msg = (
                "a threshold rule needs 'where' "
                "(or one of window, absent_for, change, new_term, sequence, branch)"
            )
            raise ValueError(msg)
        if kind == "window":
            if not self.aggregate or self.having is None:
                msg = "a window rule needs 'aggregate' and 'having'"
                raise ValueError(msg)
        elif self.aggregate or self.having is not None:
            msg = "'aggregate' and 'having' belong to window rules"
            raise ValueError(msg)
        if kind == "sequence":
            if self.within is None:
                msg = "a sequence needs 'within'"
                raise ValueError(msg)
            if any(s.absent for s in self.sequence[:-1]) or self.sequence[0].absent:
                msg = "only the last step of a sequence (after the first) may be 'absent'"
                raise ValueError(msg)
            if len(self.sequence) < 2:
                msg = "a sequence needs at least two steps"
                raise ValueError(msg)
        elif self.within is not None:
            msg = "'within' belongs to sequence rules"
            raise ValueError(msg)
        if kind == "branch" and not any(a.when is not None for a in self.branch):
            msg = "a branch needs at least one arm with 'when'"
            raise ValueError(msg)
        if kind == "branch" and sum(a.otherwise is not None for a in self.branch) > 1:
            msg = "a branch has at most one 'otherwise' arm"
            raise ValueError(msg)
        if self.expect_from is not None and kind != "absence":
            msg = "'expect_from' belongs to absent_for rules"
            raise ValueError(msg)
        if self.order == "event_time":
            if kind not in ("threshold", "change", "sequence"):
                msg = "'order: event_time' applies to threshold, change and sequence rules"
                raise ValueError(msg)
            if not self.allowed_lateness:
                msg = "'order: event_time' needs 'allowed_lateness': how long an event waits for older ones"
                raise ValueError(msg)
        lifecycle = self.for_ms or self.consecutive != 1 or self.clear is not None
        if lifecycle and kind not in ("threshold", "window"):
            msg = "'for', 'consecutive' and 'clear' apply to threshold and window rules"
            raise ValueError(msg)
        return self

    @property
    def kind(self) -> Kind:
        if self.window is not None:
            return "window"
        if self.absent_for is not None:
            return "absence"
        if self.change is not None:
            return "change"
        if self.new_term is not None:
            return "new_term"
        if self.sequence:
            return "sequence"
        if self.branch:
            return "branch"
        return "threshold"


class RuleFile(_Frozen):
    """The top level of a rule file. Each item of ``rules`` is validated on its
    own as a :class:`Rule`, so one bad rule does not hide another's problems."""

    rules: list[Any] = Field(min_length=1)
    engine: Engine = "faust"


def dump_canonical(rule: Rule) -> dict[str, Any]:
    """The rule as plain data with defaults included: the input of its version hash.

    Options added after rules were deployed are left out while unset, so that
    adding them does not change every existing rule's version (and state)."""
    unset_later = {"no_data"} if rule.no_data is None else set()
    if rule.order == "arrival":
        unset_later.add("order")
    return rule.model_dump(mode="json", by_alias=True, exclude=unset_later)
