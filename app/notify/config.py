"""The receivers' typed configuration, as written under ``receivers:`` in the routes file.

Each receiver type has one frozen pydantic model (unknown keys refused, durations
converted while validating); :data:`AnyReceiver` is any of them, :data:`Receivers`
the non-empty list of them under ``receivers:``. The notifiers
(:mod:`app.notify.webhook`, :mod:`app.notify.receivers`) and the checks
(:mod:`app.notify.check`) take these; the dispatcher's routes file embeds them.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr

from app.rules.durations import parse_duration

logger = logging.getLogger(__name__)

#: A receiver's (or route's) name.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


def _seconds(value: object) -> float:
    return parse_duration(value) / 1000


#: Seconds, written as a duration (``30s``, ``5m``).
Seconds = Annotated[float, BeforeValidator(_seconds)]


def non_empty(what: str) -> BeforeValidator:
    """A list that must have items, checked as written, before its items are validated.

    ``Field(min_length=1)`` counts the items that validated: a list whose every item is
    invalid also got ``Tuple should have at least 1 item after validation, not 0``, a
    second error for the same mistake. This says only what is wrong: an empty list."""

    def check(value: object) -> object:
        if isinstance(value, list | tuple) and not value:
            msg = f"at least one {what} is needed, got an empty list"
            raise ValueError(msg)
        return value

    return BeforeValidator(check)


class FrozenModel(BaseModel):
    """A frozen model that refuses unknown keys: the base of every routes-file section."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, arbitrary_types_allowed=True
    )


class WebhookReceiverConfig(FrozenModel):
    """A signed (Standard Webhooks) HTTP POST of the Alertmanager v4 payload."""

    type: Literal["webhook"]
    name: str = Field(pattern=NAME_PATTERN)
    url: str
    secret: SecretStr
    timeout: Seconds = 10.0
    headers: dict[str, str] = Field(default_factory=dict)
    send_resolved: bool = True


class AlertmanagerReceiverConfig(FrozenModel):
    """A push of the alerts to an Alertmanager's ``/api/v2/alerts`` (``url`` is its base URL)."""

    type: Literal["alertmanager"]
    name: str = Field(pattern=NAME_PATTERN)
    url: str
    timeout: Seconds = 10.0
    headers: dict[str, str] = Field(default_factory=dict)
    send_resolved: bool = True


class KafkaReceiverConfig(FrozenModel):
    """The v4 payload as a record on ``topic`` (default ``alerts.<name>``), keyed by group key."""

    type: Literal["kafka"]
    name: str = Field(pattern=NAME_PATTERN)
    topic: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,200}$")
    send_resolved: bool = True

    @property
    def topic_name(self) -> str:
        return self.topic or f"alerts.{self.name}"


#: Any receiver's configuration.
AnyReceiver = WebhookReceiverConfig | AlertmanagerReceiverConfig | KafkaReceiverConfig

#: The ``receivers:`` of the routes file: at least one, each told apart by its ``type``.
Receivers = Annotated[tuple[Annotated[AnyReceiver, Field(discriminator="type")], ...], non_empty("receiver")]
