"""The notification pipeline of one group flush: small stages, as in Alertmanager ``notify/notify.go``.

A :class:`Stage` takes the flush context and the alerts still in play and
returns the alerts to pass on; an empty result ends the flush (nothing more
to do). :class:`Pipeline` runs stages in sequence. The standard order,
built by the Dispatcher, is:

1. :class:`MuteStage` for inhibition, silences, flapping and acks (each a Muter);
2. :class:`DedupStage`: the notification log decides whether anything
   changed or the repeat interval has passed;
3. :class:`StormStage`: a storming route absorbs the flush;
4. :class:`NotifyStage`: builds the outbox message, records the
   notification log entry and arms escalations.

Sending and retrying happen later, from the durable outbox, under the one
retry policy of the delivery loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.alerts import Alert
from app.dispatch.base import Muter
from app.dispatch.messages import OutboxMessage, ReceiverConfig, build_message
from app.dispatch.nflog import Entry, NotificationLog, log_key, needs_update, why_not
from app.dispatch.routes import Route
from app.dispatch.storm import StormControl

logger = logging.getLogger(__name__)


@dataclass
class Effects:
    """What the dispatcher decided, to be committed with its state: outbox messages,
    events for the notifications topic, and alert transitions for the alerts topic."""

    outbox: list[OutboxMessage] = field(default_factory=list)
    log: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.outbox or self.log or self.alerts)


@dataclass
class FlushContext:
    """One flush of one group to one receiver. Stages fill ``firing``/``resolved`` (alert ids)."""

    route: Route
    receiver: ReceiverConfig
    group_key: str
    group_labels: dict[str, str]
    now: float
    firing: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)
    muted: Counter[str] = field(default_factory=Counter)

    @property
    def log_key(self) -> str:
        return log_key(self.group_key, self.receiver.name)


class Stage(Protocol):
    def run(self, ctx: FlushContext, alerts: list[Alert]) -> list[Alert]: ...


class Pipeline:
    """Stages in sequence; stops at the first empty result."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)

    def run(self, ctx: FlushContext, alerts: list[Alert]) -> list[Alert]:
        for stage in self.stages:
            if not alerts:
                return []
            alerts = stage.run(ctx, alerts)
        return alerts


class MuteStage:
    """Drops the alerts ``muter`` mutes, counting them in ``ctx.muted[reason]``."""

    def __init__(self, muter: Muter, reason: str) -> None:
        self.muter = muter
        self.reason = reason

    def run(self, ctx: FlushContext, alerts: list[Alert]) -> list[Alert]:
        kept = [a for a in alerts if not self.muter.mutes(a, ctx.now)]
        if len(kept) < len(alerts):
            ctx.muted[self.reason] += len(alerts) - len(kept)
        return kept


#: at most one log line per group and receiver in this many seconds says why alerts were held back
SUPPRESSED_LOG_EVERY_S = 300.0
#: groups remembered for that; past it, the oldest are forgotten (a line may then come sooner)
MAX_SUPPRESSED_GROUPS = 10_000


class DedupStage:
    """Passes the alerts on only when the notification log says the receiver needs an update.

    When it holds back every alert of a flush as already sent, an INFO line says so, with
    the count and the reason (:func:`~app.dispatch.nflog.why_not`): at most one per group
    and receiver every ``log_every_s`` (of the dispatcher's clock), counting the alerts held
    back since the last line."""

    def __init__(self, nflog: NotificationLog, log_every_s: float = SUPPRESSED_LOG_EVERY_S) -> None:
        self.nflog = nflog
        self.log_every_s = log_every_s
        #: per log key: when its last line was written, and alerts held back since
        self._said: dict[str, tuple[float, int]] = {}

    def run(self, ctx: FlushContext, alerts: list[Alert]) -> list[Alert]:
        ctx.firing = [a.alert_id for a in alerts if a.status == "firing"]
        ctx.resolved = [a.alert_id for a in alerts if a.status == "resolved"]
        entry = self.nflog.get(ctx.log_key)
        if needs_update(
            entry,
            ctx.firing,
            ctx.resolved,
            repeat_s=ctx.route.repeat_interval,
            send_resolved=ctx.receiver.send_resolved,
            now=ctx.now,
        ):
            return alerts
        self._suppressed(ctx, entry, len(alerts))
        return []

    def _suppressed(self, ctx: FlushContext, entry: Entry | None, n: int) -> None:
        key = ctx.log_key
        last, held = self._said.pop(key, (float("-inf"), 0))
        held += n
        if ctx.now - last < self.log_every_s:
            self._said[key] = (last, held)  # (re-inserted: the dict keeps the least recent first)
            return
        if len(self._said) >= MAX_SUPPRESSED_GROUPS:
            del self._said[next(iter(self._said))]
        self._said[key] = (ctx.now, 0)
        why = why_not(
            entry, ctx.firing, ctx.resolved, repeat_s=ctx.route.repeat_interval,
            send_resolved=ctx.receiver.send_resolved,
        )  # fmt: skip
        logger.info(
            "not notifying %s of group %s: %d alert(s) held back by the notification log: %s",
            ctx.receiver.name, ctx.group_key, held, why,
        )  # fmt: skip


class StormStage:
    """While the route storms, records the flush as notified (absorbed) and sends nothing."""

    def __init__(self, storms: StormControl, nflog: NotificationLog, effects: Effects) -> None:
        self.storms = storms
        self.nflog = nflog
        self.effects = effects

    def run(self, ctx: FlushContext, alerts: list[Alert]) -> list[Alert]:
        if not self.storms.active(ctx.route.key):
            return alerts
        entry = self.nflog.record(ctx.log_key, ctx.firing, ctx.resolved, ctx.now)
        self.storms.absorb(ctx.route.key, len(alerts))
        self.effects.log.append((ctx.group_key, nflog_event("absorbed", ctx, entry.seq)))
        return []


#: ``(route, receiver name, firing alerts just notified, now)``: arms escalations.
OnNotified = Callable[[Route, str, list[Alert], float], None]


class NotifyStage:
    """Enqueues the notification: an outbox message (unless only resolved alerts remain
    and the receiver does not want them), the log entry and its event."""

    def __init__(
        self, nflog: NotificationLog, effects: Effects, external_url: str, on_notified: OnNotified
    ) -> None:
        self.nflog = nflog
        self.effects = effects
        self.external_url = external_url
        self.on_notified = on_notified

    def run(self, ctx: FlushContext, alerts: list[Alert]) -> list[Alert]:
        entry = self.nflog.record(ctx.log_key, ctx.firing, ctx.resolved, ctx.now)
        to_send = [a for a in alerts if a.status == "firing" or ctx.receiver.send_resolved]
        event = nflog_event("queued" if to_send else "recorded", ctx, entry.seq)
        if to_send:
            msg = build_message(
                ctx.receiver,
                to_send,
                group_key=ctx.group_key,
                group_labels=ctx.group_labels,
                seq=entry.seq,
                now=ctx.now,
                external_url=self.external_url,
            )
            self.effects.outbox.append(msg)
            event = msg.log_event(event)
        self.effects.log.append((ctx.group_key, event))
        self.on_notified(ctx.route, ctx.receiver.name, [a for a in to_send if a.status == "firing"], ctx.now)
        return to_send


def nflog_event(kind: str, ctx: FlushContext, seq: int) -> dict[str, Any]:
    """A notification-log event: enough to rebuild the log entry from the topic."""
    return {
        "event": kind, "receiver": ctx.receiver.name, "group_key": ctx.group_key, "route": ctx.route.name,
        "log_key": ctx.log_key, "firing": sorted(ctx.firing), "resolved": sorted(ctx.resolved),
        "seq": seq, "at": ctx.now,
    }  # fmt: skip
