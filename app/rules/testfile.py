"""The shape of a rule test file (``*.test.yaml``), as pydantic models: what
:mod:`app.rules.ruletest` validates a file against before any of its cases runs.

Unknown keys are refused (``extra="forbid"``), times are RFC 3339 with an offset, an
expected label, annotation or value is a plain value (compared as text), and ``rule_files``,
``tests`` and each case's ``expect`` are required. What needs the rules or the schemas (rule
ids, events, registry rows) is checked once a file has this shape.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import date
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from app.alerts import Status
from app.errors import IngestDecodeError
from app.events import parse_ts
from app.rules.model import Severity
from app.rules.problems import describe
from app.tables import TABLES

logger = logging.getLogger(__name__)

#: the keys an expectation may give, in the order a diff shows them
KEYS = ("rule", "status", "severity", "starts_at", "ends_at", "event_ts", "labels", "annotations", "values")


def yaml_time(value: Any) -> Any:
    """A time or date YAML read unquoted as the text it was (``2024-01-01T00:00:00+00:00``),
    so that it is checked as a time written in quotes is; any other value as it is."""
    return value.isoformat() if isinstance(value, date) else value


def _timestamp(value: str) -> str:
    try:
        parse_ts(value)
    except IngestDecodeError:
        msg = f"expected an RFC 3339 time with an offset, such as 2024-01-01T00:00:00Z, got {value[:64]!r}"
        raise ValueError(msg) from None
    return value


def _scalar(value: Any) -> Any:
    if isinstance(value, dict | list):
        msg = f"expected a plain value (text or a number), got {describe(value)}"
        raise ValueError(msg)
    return value


def _table_name(name: str) -> str:
    if name not in TABLES:
        msg = f"unknown table {name!r}; the tables are {', '.join(TABLES)}"
        raise ValueError(msg)
    return name


def _not_null(value: Any) -> Any:
    if value is None:
        msg = "must not be null (leave the key out to accept any)"
        raise ValueError(msg)
    return value


#: an expected time: RFC 3339 text with an offset (checked when the file is read)
Timestamp = Annotated[str, BeforeValidator(yaml_time), AfterValidator(_timestamp)]
#: an expected label, annotation or value (compared as text)
Scalar = Annotated[Any, AfterValidator(_scalar)]
#: a table's rows, each checked against its table's columns once the file validates
Rows = tuple[dict[str, Any], ...]
TableName = Annotated[str, AfterValidator(_table_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Expectation(_Strict):
    """One expected transition; only the keys given are compared (:meth:`given`).
    ``ends_at: null`` expects a transition that has not ended."""

    rule: Annotated[str | None, BeforeValidator(_not_null)] = None
    status: Annotated[Status | None, BeforeValidator(_not_null)] = None
    severity: Annotated[Severity | None, BeforeValidator(_not_null)] = None
    starts_at: Timestamp | None = None
    ends_at: Timestamp | None = None
    event_ts: Timestamp | None = None
    labels: Mapping[str, Scalar] = Field(default_factory=dict)
    annotations: Mapping[str, Scalar] = Field(default_factory=dict)
    values: Mapping[str, Scalar] = Field(default_factory=dict)

    def given(self) -> dict[str, Any]:
        """The keys the test file gave, with their values, in :data:`KEYS` order."""
        return {k: getattr(self, k) for k in KEYS if k in self.model_fields_set}


class RuleTestCase(_Strict):
    """One case: events in (``input``, then ``input_file``'s lines), transitions out."""

    name: str | None = None
    rules: tuple[str, ...] | None = Field(default=None, min_length=1)
    input: tuple[dict[str, Any], ...] = ()
    input_file: str | None = None
    tables: Mapping[TableName, Rows] = Field(default_factory=dict)
    partitions: int | None = Field(default=None, ge=1, strict=True)
    statuses: tuple[Status, ...] | None = Field(default=None, min_length=1)
    expect: tuple[Expectation, ...]


class RuleTestFile(_Strict):
    """A ``*.test.yaml`` file; ``tables``, ``partitions`` and ``statuses`` are each case's
    defaults (a case's ``tables`` replace the file's table by table)."""

    rule_files: tuple[str, ...] = Field(min_length=1)
    tables: Mapping[TableName, Rows] = Field(default_factory=dict)
    partitions: int | None = Field(default=None, ge=1, strict=True)
    statuses: tuple[Status, ...] | None = Field(default=None, min_length=1)
    tests: tuple[RuleTestCase, ...] = Field(min_length=1)
