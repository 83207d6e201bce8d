"""The Dispatcher: alert transitions and operator commands in, notification decisions out.

Pure and single-threaded: no Kafka, no HTTP, no SQLite. Time comes from the
injected ``clock``. The role feeds it with :meth:`Dispatcher.on_alert` and
:meth:`Dispatcher.on_command`, calls :meth:`Dispatcher.tick` when
:meth:`Dispatcher.next_timer` comes due, then takes the :class:`Effects`
(outbox messages, notification-log events, manual resolutions) and the
changed state (:meth:`Dispatcher.drain_state`) and commits them together.

Per alert transition: the registry drops duplicates and stale records;
pending, no_data and inactive statuses are recorded but never notified, as
Prometheus never notifies a pending alert (a rule that wants to be paged
when data stops uses ``no_data: {state: alerting}``, which fires); firing
and resolved ones feed flapping detection, then every matching route (storm
counting, then the route's aggregation group). Group flushes run the pipeline (:mod:`app.dispatch.pipeline`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any, Literal

from app.alerts import Alert
from app.dispatch.acks import Ack, Acks, Escalation, Escalations
from app.dispatch.base import Clock, Table, parse_iso, wall_clock
from app.dispatch.commands import AckCommand, Command, ResolveCommand, SilenceCommand, UnsilenceCommand
from app.dispatch.config import RoutesFile
from app.dispatch.flapping import FlapDetector
from app.dispatch.grouping import Group, Groups
from app.dispatch.inhibit import Inhibitor
from app.dispatch.matchers import parse_matchers
from app.dispatch.messages import ReceiverConfig, build_message
from app.dispatch.nflog import Entry, NotificationLog, log_key
from app.dispatch.pipeline import (
    DedupStage,
    Effects,
    FlushContext,
    MuteStage,
    NotifyStage,
    Pipeline,
    StormStage,
)
from app.dispatch.registry import AlertRegistry
from app.dispatch.routes import Route, build_tree
from app.dispatch.silences import Silence, Silencer
from app.dispatch.storm import StormControl
from app.notify.payload import alert_labels

logger = logging.getLogger(__name__)

#: The only statuses routed to receivers; pending, no_data and inactive are recorded only.
NOTIFIED_STATUSES = ("firing", "resolved")
PRUNE_EVERY_S = 60.0
AlertOutcome = Literal["new", "duplicate", "stale", "recorded"]


class Dispatcher:
    """See the module docstring. ``rebuilding`` pauses storm counting during a replay."""

    def __init__(self, config: RoutesFile, *, clock: Clock = wall_clock, external_url: str = "") -> None:
        self.config = config
        self.clock = clock
        self.external_url = external_url
        self.tree = build_tree(config)
        self.routes = {r.key: r for r in self.tree.walk()}
        self.registry = AlertRegistry()
        self.groups = Groups()
        self.nflog = NotificationLog()
        self.silences = Silencer()
        self.inhibitor = Inhibitor(config.inhibit_rules, self.registry)
        self.acks = Acks()
        self.escalations = Escalations()
        self.flapping = FlapDetector(config.flapping)
        self.storms = StormControl()
        self.effects = Effects()
        self.rebuilding = False
        self._pruned_at = 0.0
        self.pipeline = Pipeline(
            [
                MuteStage(self.inhibitor, "inhibited"),
                MuteStage(self.silences, "silenced"),
                MuteStage(self.flapping, "flapping"),
                MuteStage(self.acks, "acked"),
                DedupStage(self.nflog),
                StormStage(self.storms, self.nflog, self.effects),
                NotifyStage(self.nflog, self.effects, external_url, self._arm_escalations),
            ]
        )

    def reconfigure(self, config: RoutesFile) -> None:
        """Adopt an edited routes file without losing state: routes, timers, receivers,
        inhibition, flapping and escalation settings change; groups, the notification log,
        silences, acks and armed escalations stay. A group whose route is gone is dropped at
        its next flush (logged); its alerts join the new routes with their next transition."""
        self.config = config
        self.tree = build_tree(config)
        self.routes = {r.key: r for r in self.tree.walk()}
        self.inhibitor.set_rules(config.inhibit_rules)
        self.flapping.config = config.flapping

    # -- state ---------------------------------------------------------------------------------
    def tables(self) -> list[Table[Any]]:
        return [
            self.registry.table, self.groups.table, self.nflog.table, self.silences.table,
            self.acks.table, self.escalations.table, self.flapping.table, self.storms.table,
        ]  # fmt: skip

    def take_effects(self) -> Effects:
        out, self.effects.outbox, self.effects.log, self.effects.alerts = (
            Effects(list(self.effects.outbox), list(self.effects.log), list(self.effects.alerts)),
            [],
            [],
            [],
        )
        return out

    def receiver(self, name: str) -> ReceiverConfig | None:
        return next((r for r in self.config.receivers if r.name == name), None)

    # -- input ---------------------------------------------------------------------------------
    def on_alert(self, alert: Alert) -> AlertOutcome:
        """Apply one transition. Raises ValueError for an alert with bad times or status."""
        now = self.clock()
        applied = self.registry.apply(alert, now)
        if applied != "new":
            return applied
        if alert.status == "resolved":
            self._resolve_escalations(alert, now)
            self.acks.forget_episode(alert)
        if alert.status not in NOTIFIED_STATUSES:
            return "recorded"
        notice = self.flapping.observe(alert, now)
        self._route(alert, now)
        if notice is not None:
            self._route(notice, now)
        return "new"

    def on_command(self, cmd: Command) -> None:
        """Apply one operator command (idempotent: replaying the topic gives the same state)."""
        if isinstance(cmd, AckCommand):
            self.acks.add(Ack(cmd.fingerprint, cmd.starts_at, cmd.by, cmd.comment, cmd.at_s))
            for esc in self.escalations.for_alert(cmd.fingerprint):
                if not esc.sent and (not cmd.starts_at or esc.starts_at == cmd.starts_at):
                    self.escalations.drop(esc)
        elif isinstance(cmd, SilenceCommand):
            start, end = parse_iso(cmd.starts_at), parse_iso(cmd.ends_at)
            self.silences.add(
                Silence(cmd.silence_id, parse_matchers(cmd.matchers), start, end, cmd.by, cmd.comment)
            )
        elif isinstance(cmd, UnsilenceCommand):
            if not self.silences.expire(cmd.silence_id, cmd.at_s):
                logger.warning("unsilence of unknown silence %s ignored", cmd.silence_id)
        elif isinstance(cmd, ResolveCommand):
            self._manual_resolve(cmd)

    def _manual_resolve(self, cmd: ResolveCommand) -> None:
        cur = self.registry.get(cmd.fingerprint)
        if cur is None or cur.status != "firing" or (cmd.starts_at and cmd.starts_at != cur.starts_at):
            logger.info("resolve of %s ignored: no such open alert", cmd.fingerprint)
            return
        note = f"resolved by hand by {cmd.by or 'an operator'}" + (f": {cmd.comment}" if cmd.comment else "")
        resolved = Alert.build(
            rule_id=cur.rule_id, rule_version=cur.rule_version, status="resolved", severity=cur.severity,
            labels=cur.labels, annotations={**cur.annotations, "resolved_by": note},
            starts_at=cur.starts_at, ends_at=cmd.at, source=cur.source, event_ts=max(cmd.at, cur.event_ts),
            values=cur.values,
        )  # fmt: skip
        self.effects.alerts.append(resolved)
        self.on_alert(resolved)

    def _route(self, alert: Alert, now: float) -> None:
        for route in self.tree.match(alert_labels(alert)):
            if alert.status == "firing" and not self.rebuilding:
                notice = self.storms.observe(route, now)
                if notice is not None:
                    self._send_direct(route.receiver, f"storm:{route.key}", notice, "storm", now)
            self.groups.insert(route, alert, now)

    # -- timers --------------------------------------------------------------------------------
    def next_timer(self) -> float | None:
        times = [
            self.groups.next_timer(), None if self.rebuilding else self.escalations.next_timer(),
            self.flapping.next_timer(),
            self.storms.next_timer(),
        ]  # fmt: skip
        return min((t for t in times if t is not None), default=None)

    def tick(self) -> int:
        """Run everything due at ``clock()``; return the number of groups flushed."""
        now = self.clock()
        for route, notice in self.storms.due(self.routes, now):
            self._send_direct(route.receiver, f"storm:{route.key}", notice, "storm", now)
        for notice in self.flapping.due(now):
            self._route(notice, now)
        due = self.groups.due(now)
        for group in due:
            self._flush(group, now)
        for esc in [] if self.rebuilding else self.escalations.due(now):  # wait for the replayed alerts
            self._escalate(esc, now)
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            self.registry.prune(now)
            self.nflog.prune(now)
            self.silences.prune(now)
            self.flapping.prune(now)
        return len(due)

    def _flush(self, group: Group, now: float) -> None:
        route = self.routes.get(group.route_key)
        receiver = self.receiver(group.receiver)
        alerts = sorted(group.alerts.values(), key=lambda a: (a.starts_at, a.fingerprint))
        if route is None or receiver is None:
            logger.warning("dropping group %s: its route or receiver is no longer configured", group.key)
            self.groups.flushed(group, alerts, None, now)
            return
        ctx = FlushContext(route, receiver, group.key, group.labels, now)
        self.pipeline.run(ctx, alerts)
        if ctx.muted:
            logger.debug("group %s: muted %s", group.key, dict(ctx.muted))
        self.groups.flushed(group, alerts, route, now)

    # -- escalation and direct notices ---------------------------------------------------------
    def _arm_escalations(self, route: Route, receiver: str, firing: list[Alert], now: float) -> None:
        if route.escalate is None or receiver != route.receiver:
            return
        for alert in firing:
            if self.escalations.arm(route.key, alert, route.escalate.after, route.escalate.to, now):
                # published with the notification log, so a lost state file re-arms it
                esc = self.escalations.table.get(f"{route.key}|{alert.fingerprint}")
                if esc is not None:
                    self.effects.log.append((esc.key, {"event": "armed", "escalation": asdict(esc)}))

    def restore_escalation(self, esc: Escalation) -> None:
        """Adopt an escalation read back from the notifications topic (a later one of the
        same route and alert replaces it); the replay of alerts and commands that follows
        drops it again if the alert was acknowledged or resolved meanwhile."""
        self.escalations.table.put(esc.key, esc)

    def _escalate(self, esc: Escalation, now: float) -> None:
        cur = self.registry.get(esc.fingerprint)
        if (
            cur is None
            or cur.status != "firing"
            or cur.starts_at != esc.starts_at
            or any(m.mutes(cur, now) for m in (self.acks, self.silences, self.inhibitor, self.flapping))
        ):
            self.escalations.drop(esc)
            return
        sent = self.nflog.get(log_key(f"escalation:{esc.key}", esc.to))
        if sent is None or cur.alert_id not in sent.firing:  # not sent before a lost state file
            self._send_direct(esc.to, f"escalation:{esc.key}", cur, "escalation", now)
        self.escalations.mark_sent(esc)

    def _resolve_escalations(self, alert: Alert, now: float) -> None:
        for esc in self.escalations.for_alert(alert.fingerprint):
            if esc.starts_at != alert.starts_at:
                continue
            receiver = self.receiver(esc.to)
            if esc.sent and receiver is not None and receiver.send_resolved:
                self._send_direct(esc.to, f"escalation:{esc.key}", alert, "escalation", now)
            self.escalations.drop(esc)

    def _send_direct(self, receiver_name: str, key: str, alert: Alert, notice: str, now: float) -> None:
        """Enqueue ``alert`` to a receiver at once, outside any group (storm, escalation)."""
        receiver = self.receiver(receiver_name)
        if receiver is None:
            return
        lk = log_key(key, receiver_name)
        prev = self.nflog.get(lk)
        firing = [alert.alert_id] if alert.status == "firing" else []
        resolved = [] if firing else [alert.alert_id]
        entry = Entry(frozenset(firing), frozenset(resolved), now, (prev.seq if prev else 0) + 1)
        self.nflog.table.put(lk, entry)
        msg = build_message(
            receiver, [alert], group_key=key, group_labels=alert_labels(alert), seq=entry.seq, now=now,
            external_url=self.external_url, notice=notice,
        )  # fmt: skip
        self.effects.outbox.append(msg)
        self.effects.log.append(
            (key, msg.log_event({"log_key": lk, "firing": firing, "resolved": resolved, "seq": entry.seq}))
        )
        logger.info("%s notice %s to %s: %s", notice, alert.alert_id, receiver_name, alert.status)
