"""Frozen, typed rule models parsed from YAML, with durations converted at the boundary.

A rule file holds ``rules:`` (a list) and may set a file-wide ``engine``.
Unknown keys are errors. Semantic checks that need the source schema
(expressions, group_by fields, template names) happen in
:mod:`app.rules.compile`, which reports them against the same YAML paths.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from app.rules.durations import parse_duration

Severity = Literal["critical", "warning", "info"]
Engine = Literal["faust", "spark", "both"]
Source = Literal["sensors", "logs", "finance"]

#: A duration in milliseconds, written as ``30s``, ``15m``, ``1h``...
DurationMs = Annotated[int, BeforeValidator(parse_duration)]

_ID_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
_LABEL_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Rule(_Frozen):
    """One alerting rule. Without ``for``/``consecutive`` it fires on the first
    matching event of its group and resolves on the first non-matching one."""

    id: str = Field(pattern=_ID_PATTERN)
    description: str = ""
    source: Source
    severity: Severity = "warning"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    group_by: tuple[str, ...] = ()
    where: str
    for_ms: DurationMs = Field(default=0, alias="for")
    consecutive: int = Field(default=1, ge=1, le=10_000)
    engine: Engine | None = None

    @field_validator("labels")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        import re

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


class RuleFile(_Frozen):
    """The top level of a rule file. Each item of ``rules`` is validated on its
    own as a :class:`Rule`, so one bad rule does not hide another's problems."""

    rules: list[Any] = Field(min_length=1)
    engine: Engine = "faust"


def dump_canonical(rule: Rule) -> dict[str, Any]:
    """The rule as plain data with defaults included: the input of its version hash."""
    return rule.model_dump(mode="json", by_alias=True)
