"""Operator commands on the ``commands`` topic: ack, silence, unsilence and resolve.

The dashboard and the CLI produce them; the dispatcher applies them and the
alert store records them, so the topic is the source of truth for silences
and acks and both can be rebuilt by replaying it. Every command carries a
unique ``cmd_id``, the wall-clock time ``at`` (RFC 3339), who sent it (``by``, the
signed-in operator) and a comment. The record key is the alert fingerprint or the
silence id.

Every command is signed (:func:`sign_command`): ``sig`` is the HMAC-SHA256, keyed with
``APP_COMMAND_SECRET``, of the command's canonical JSON without ``sig``. Readers apply
only commands whose signature :func:`verify_command` accepts, so a record that someone
who can reach the broker wrote by hand (a forged silence, say) changes nothing.

:func:`parse_command` raises ValueError naming the problem for anything that
is not a valid command, so a bad record is logged and skipped, never applied.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import uuid
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from app.alerts import Alert
from app.dispatch.base import parse_iso
from app.dispatch.matchers import parse_matcher

logger = logging.getLogger(__name__)


class _Command(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cmd_id: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=1, max_length=64)
    at: str
    by: str = Field(default="", max_length=200)
    comment: str = Field(default="", max_length=2000)
    sig: str = Field(default="", max_length=100)

    @field_validator("at")
    @classmethod
    def _time(cls, value: str) -> str:
        parse_iso(value)
        return value

    @property
    def at_s(self) -> float:
        return parse_iso(self.at)


class AckCommand(_Command):
    """Acknowledge one alert (fingerprint); ``starts_at`` limits it to one episode."""

    type: Literal["ack"] = "ack"
    fingerprint: str = Field(min_length=1, max_length=64)
    rule_id: str = ""
    starts_at: str = ""


class SilenceCommand(_Command):
    """Create (or replace, same id) a silence from ``starts_at`` to ``ends_at``."""

    type: Literal["silence"] = "silence"
    silence_id: str = Field(default_factory=lambda: uuid.uuid4().hex, min_length=1, max_length=64)
    matchers: tuple[str, ...] = Field(min_length=1)
    starts_at: str
    ends_at: str

    @field_validator("matchers")
    @classmethod
    def _matchers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(str(parse_matcher(m)) for m in value)

    @field_validator("starts_at", "ends_at")
    @classmethod
    def _times(cls, value: str) -> str:
        parse_iso(value)
        return value


class UnsilenceCommand(_Command):
    """End a silence now."""

    type: Literal["unsilence"] = "unsilence"
    silence_id: str = Field(min_length=1, max_length=64)


class ResolveCommand(_Command):
    """Resolve a firing alert by hand (the current episode, or the one starting at ``starts_at``)."""

    type: Literal["resolve"] = "resolve"
    fingerprint: str = Field(min_length=1, max_length=64)
    starts_at: str = ""


#: the ``notifications`` event that carries the resolved transition of a :class:`ResolveCommand`,
#: as the dispatcher built it, to the alert store. Not on ``alerts``: only the engines may write
#: there (``app/kafka/acls.py``), and under ``make run``'s ACLs the dispatcher's publisher, stuck
#: on that refusal, retried it forever and held back its notification log behind it
RESOLVED_BY_HAND = "resolved_by_hand"


def resolved_by_hand(alert: Alert) -> dict[str, Any]:
    """The :data:`RESOLVED_BY_HAND` event of a manual resolution's transition."""
    return {"event": RESOLVED_BY_HAND, "alert_id": alert.alert_id, "alert": orjson.loads(alert.to_json())}


Command = Annotated[
    AckCommand | SilenceCommand | UnsilenceCommand | ResolveCommand, Field(discriminator="type")
]
_ADAPTER: TypeAdapter[Command] = TypeAdapter(Command)


def parse_command(raw: bytes | str) -> Command:
    """Decode and validate one command record; ValueError with the reason otherwise."""
    try:
        return _ADAPTER.validate_json(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = f"invalid command: {where}: {err['msg']}" if where else f"invalid command: {err['msg']}"
        raise ValueError(msg) from None


def command_key(cmd: Command) -> str:
    """The record key: the silence id for silences, else the alert fingerprint."""
    if isinstance(cmd, SilenceCommand | UnsilenceCommand):
        return cmd.silence_id
    return cmd.fingerprint


def _signature(cmd: Command, secret: str) -> str:
    payload = cmd.model_dump_json(exclude={"sig"}).encode()
    digest = hmac.new(secret.encode(), payload, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def sign_command(cmd: Command, secret: str) -> Command:
    """``cmd`` with its ``sig`` set for ``secret`` (the canonical JSON of the validated command)."""
    return cmd.model_copy(update={"sig": _signature(cmd, secret)})


def verify_command(cmd: Command, secret: str) -> bool:
    """True when ``cmd`` carries a signature made with ``secret`` over exactly these fields."""
    return bool(cmd.sig) and hmac.compare_digest(cmd.sig, _signature(cmd, secret))
