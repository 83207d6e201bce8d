"""One exception root for the whole application, with small specific subclasses.

Every error an operator can see names what to fix: the file, line or field.
"""

from __future__ import annotations


class AppError(Exception):
    """Root of every error raised on purpose by this application."""


class ConfigError(AppError):
    """An environment variable or config file holds a value we cannot use."""


class BrokerError(AppError):
    """The Kafka broker could not be started, reached or used."""


class IngestDecodeError(AppError):
    """An incoming event is not valid for its source's schema.

    ``reason`` is a one-line, human-readable explanation that goes into the
    dead-letter record; ``field`` names the offending field when there is one.
    """

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


class RuleConfigError(AppError):
    """One or more rule files are invalid. ``problems`` holds every one found."""

    def __init__(self, problems: list[RuleProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class RuleProblem:
    """One problem in a rule file, printed like promtool: ``file:line:col: rule: message``."""

    __slots__ = ("col", "line", "message", "path", "rule_id")

    def __init__(self, path: str, line: int, col: int, rule_id: str | None, message: str) -> None:
        self.path = path
        self.line = line
        self.col = col
        self.rule_id = rule_id
        self.message = message

    def __str__(self) -> str:
        rule = self.rule_id or "-"
        return f"{self.path}:{self.line}:{self.col}: {rule}: {self.message}"

    def __repr__(self) -> str:
        return f"RuleProblem({self})"


class ExpressionError(AppError):
    """A rule expression is not in the supported SQL subset or does not type-check."""


class NotifierError(AppError):
    """A notification could not be delivered. ``retryable`` says whether to try again."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
