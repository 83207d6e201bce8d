"""Operator actions as commands, shared by the CLI (:mod:`app.cli.alerts`) and the dashboard.

Each builder returns a validated command from :mod:`app.dispatch.commands`
(ValueError, naming the bad field or matcher, on bad input);
:func:`publish_command` signs it with ``APP_COMMAND_SECRET`` and produces it to the
``commands`` topic, keyed as the dispatcher and store-sync expect. Kafka's client is imported only inside
:func:`publish_command`, so the dashboard can import this module without
loading aiokafka until a button is pressed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pydantic import ValidationError

from app.dispatch.commands import (
    AckCommand,
    Command,
    ResolveCommand,
    SilenceCommand,
    UnsilenceCommand,
    command_key,
    sign_command,
)
from app.dispatch.matchers import parse_matcher
from app.rules.durations import parse_duration
from app.runtime.settings import Settings
from app.storage.alert_store import CurrentAlert

logger = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 30.0
C = TypeVar("C", AckCommand, ResolveCommand, SilenceCommand, UnsilenceCommand)


def now_iso() -> str:
    return datetime.now(tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _aware(value: str, what: str) -> datetime:
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        msg = f"{what}: {value!r} is not an RFC 3339 time"
        raise ValueError(msg) from None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _checked(build: type[C], **fields: Any) -> C:
    try:
        return build(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = f"{where}: {err['msg']}" if where else str(err["msg"])
        raise ValueError(msg) from None


def ack_command(alert: CurrentAlert, *, by: str, comment: str = "", all_episodes: bool = False) -> AckCommand:
    """Acknowledge ``alert``'s current episode (or every episode)."""
    cmd = _checked(
        AckCommand,
        fingerprint=alert.fingerprint,
        rule_id=alert.rule_id,
        starts_at="" if all_episodes else alert.starts_at,
        at=now_iso(),
        by=by,
        comment=comment,
    )
    return cmd


def resolve_command(alert: CurrentAlert, *, by: str, comment: str = "") -> ResolveCommand:
    cmd = _checked(
        ResolveCommand,
        fingerprint=alert.fingerprint,
        starts_at=alert.starts_at,
        at=now_iso(),
        by=by,
        comment=comment,
    )
    return cmd


def silence_command(
    matchers: list[str],
    *,
    by: str,
    comment: str = "",
    duration: str | None = "2h",
    start: str | None = None,
    end: str | None = None,
) -> SilenceCommand:
    """A silence from ``start`` (default now) to ``end`` or for ``duration``.
    Raises ValueError naming the bad matcher, duration or time."""
    if not matchers:
        msg = 'a silence needs at least one matcher, e.g. device_id="pump-7"'
        raise ValueError(msg)
    for m in matchers:
        parse_matcher(m)  # the matcher's own error names it
    begin = _aware(start, "start") if start else datetime.now(tz=UTC)
    if end:
        until = _aware(end, "end")
    else:
        try:
            until = begin + timedelta(milliseconds=parse_duration(duration or ""))
        except ValueError as exc:
            msg = f"duration: {exc}"
            raise ValueError(msg) from None
    if until <= begin:
        msg = "the silence must end after it starts"
        raise ValueError(msg)
    cmd = _checked(
        SilenceCommand,
        matchers=tuple(matchers),
        starts_at=begin.isoformat(),
        ends_at=until.isoformat(),
        at=now_iso(),
        by=by,
        comment=comment,
    )
    return cmd


def unsilence_command(silence_id: str, *, by: str, comment: str = "") -> UnsilenceCommand:
    cmd = _checked(UnsilenceCommand, silence_id=silence_id, at=now_iso(), by=by, comment=comment)
    return cmd


def publish_command(settings: Settings, cmd: Command) -> None:
    """Produce ``cmd`` to the commands topic and wait for the broker's ack (see
    :func:`publish_commands`)."""
    publish_commands(settings, [cmd])


def publish_commands(settings: Settings, cmds: Sequence[Command]) -> None:
    """Produce ``cmds``, in order, to the commands topic with one producer, and wait for the
    broker's acks.

    Without ``KAFKA_BOOTSTRAP_SERVERS`` it goes to the ``make run`` of the same data dir, as
    its console principal and signed with its command secret
    (:func:`app.runtime.credentials.operator_settings`).
    Raises ConfigError without a broker, BrokerError/TimeoutError when it fails."""
    from app.kafka.clients import make_producer
    from app.runtime.credentials import operator_settings
    from app.topics import COMMANDS

    settings = operator_settings(settings)
    secret = settings.command_secret.get_secret_value()

    async def main() -> None:
        producer = make_producer(settings)
        await producer.start()
        try:
            for cmd in cmds:
                signed = sign_command(cmd, secret)
                await producer.send_and_wait(
                    COMMANDS, signed.model_dump_json().encode(), key=command_key(cmd).encode()
                )
        finally:
            await producer.stop()

    asyncio.run(asyncio.wait_for(main(), PUBLISH_TIMEOUT_S))
    for cmd in cmds:
        logger.info("published %s command %s by %s", cmd.type, cmd.cmd_id, cmd.by or "-")
