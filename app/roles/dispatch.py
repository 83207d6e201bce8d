"""The ``dispatch`` role: ``alerts`` and ``commands`` in, notifications out through a durable outbox.

Lifecycle of :func:`run`:

1. load the routes file (``APP_ROUTES_FILE``; RoutesConfigError lists every
   problem) and open the state file ``$APP_DATA_DIR/dispatch.sqlite3``
   (one dispatcher per data dir, enforced by a lock);
2. restore the dispatcher state; if the file is new (first start, or lost),
   rebuild the notification log, the undelivered outbox and the armed
   escalations from the ``notifications`` topic first, then replay ``alerts`` and ``commands``
   from the beginning (storm counting paused until caught up), so a lost
   state file neither floods receivers nor forgets silences and acks;
3. loop: read ``alerts`` and ``commands`` (all partitions, from the offsets
   kept in the state file), apply them, run due timers, and commit state,
   offsets, new outbox messages and records to publish in one SQLite
   transaction; one :class:`~app.roles.delivery.OutboxSender` per receiver
   delivers, a :class:`~app.roles.delivery.Publisher` produces the notification
   log and manual resolutions;
4. on ``stop``: finish the current batch, let attempts in progress end
   (bounded by the receiver timeouts), publish what is queued, close.

Offsets live in the state file, not in Kafka, so a kill -9 at any point
resumes exactly where the kept state ends. They are also committed to Kafka
(group ``dispatcher``, best effort) so lag shows in the usual tools.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from prometheus_client import Counter, Gauge

from app.alerts import Alert
from app.dispatch.acks import Escalation
from app.dispatch.base import Clock, wall_clock
from app.dispatch.commands import parse_command, resolved_by_hand, verify_command
from app.dispatch.config import KafkaReceiverConfig, RoutesFile, load_routes
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.messages import OutboxMessage
from app.dispatch.nflog import Entry
from app.dispatch.reload import RoutesWatcher
from app.errors import ConfigError
from app.kafka.admin import ensure_topics
from app.kafka.clients import (
    assign_kept,
    commit_for_monitoring,
    make_consumer,
    make_producer,
    read_to_end,
    stop_consumer,
)
from app.kafka.wait import until_answered
from app.notify import RetryPolicy
from app.notify.check import receiver_problems
from app.notify.receivers import make_notifier
from app.roles.delivery import OutboxSender, Publisher
from app.runtime.settings import Settings
from app.storage.dispatch_db import DispatchDB
from app.topics import ALERTS, COMMANDS, NOTIFICATIONS, receiver_topic_spec

logger = logging.getLogger(__name__)

GROUP_ID = "dispatcher"
INPUTS = (ALERTS, COMMANDS)

DISPATCHED = Counter(
    "dispatch_records",
    "Input records by topic and outcome: new, duplicate, stale, recorded (pending: kept, not "
    "notified), applied (command), forged (a command without a valid signature) and invalid.",
    ["topic", "outcome"],
)
OUTBOX = Gauge("dispatch_outbox_messages", "Outbox messages by status.", ["status"])
REBUILDING = Gauge("dispatch_rebuilding", "1 while the dispatcher replays the topics into a new state file.")


async def run(
    settings: Settings,
    stop: asyncio.Event,
    *,
    routes_file: Path | None = None,
    clock: Clock = wall_clock,
    policy: RetryPolicy | None = None,
    poll_ms: int = 200,
    max_batch: int = 500,
) -> None:
    """Dispatch until ``stop`` is set; see the module docstring."""
    config = load_routes(routes_file or settings.routes_file)
    db = DispatchDB(settings.dispatch_path)
    # queued by a release that published manual resolutions on `alerts`, which only the engines
    # may write: refused under ACLs, retried for ever, and holding back what followed them
    as_event = lambda v: orjson.dumps(resolved_by_hand(Alert.from_json(v)))  # noqa: E731
    if moved := db.retarget(ALERTS, NOTIFICATIONS, as_event):
        logger.info("%d queued manual resolution(s) moved from %s to %s", moved, ALERTS, NOTIFICATIONS)
    disp = Dispatcher(config, clock=clock, external_url=settings.external_url)
    for table in disp.tables():
        table.restore(db.load(table.name))
    retry: RetryPolicy = policy or RetryPolicy(
        base_s=config.delivery.retry_base, cap_s=config.delivery.retry_cap, max_attempts=None, max_age_s=None
    )
    delivery = config.delivery
    kafka_topics = [r.topic_name for r in config.receivers if isinstance(r, KafkaReceiverConfig)]
    if kafka_topics:
        specs = tuple(receiver_topic_spec(t) for t in kafka_topics)
        await ensure_topics(settings, settings.partitions, settings.replication_factor, specs)
    producer = make_producer(settings)
    consumer = make_consumer(settings, group_id=GROUP_ID)
    senders: dict[str, OutboxSender] = {}
    running: dict[str, tuple[asyncio.Event, asyncio.Task[None], Any]] = {}  # name -> (quit, task, config)
    quit_publisher = asyncio.Event()
    publisher_task: asyncio.Task[None] | None = None

    def start_sender(r: Any, cfg: RoutesFile) -> None:
        """A sender for receiver ``r``: disabled alone (ERROR, ``dispatch_receiver_invalid``)
        when its configuration is invalid, by the check ``routes check`` runs."""
        invalid = "; ".join(
            f"'{field}': {msg}" for field, msg in receiver_problems(r, settings.webhook_allow_private)
        )
        notifier = None
        if not invalid:
            try:
                notifier = make_notifier(
                    r,
                    producer=producer,
                    allow_private=settings.webhook_allow_private,
                    external_url=settings.external_url,
                )
            except ConfigError as exc:  # what the check missed: still this receiver's alone
                invalid = str(exc)
        if invalid:
            where = routes_file or settings.routes_file
            logger.error(
                "RECEIVER %s DISABLED: invalid configuration in %s: %s; the other receivers keep "
                "delivering, its messages wait in the outbox", r.name, where, invalid,
            )  # fmt: skip
        senders[r.name] = OutboxSender(
            db,
            r.name,
            notifier,
            retry,
            max_age_s=cfg.delivery.max_age,
            clock=clock,
            on_published=wake_publisher,
            invalid=invalid,
        )
        quit_sender = asyncio.Event()
        running[r.name] = (quit_sender, asyncio.create_task(senders[r.name].run(quit_sender)), r)

    async def stop_sender(name: str) -> None:
        quit_sender, task, _ = running.pop(name)
        quit_sender.set()
        await asyncio.gather(task, return_exceptions=True)  # an attempt in progress ends first
        notifier = senders.pop(name).notifier
        if notifier is not None:
            await notifier.aclose()

    async def reload(cfg: RoutesFile) -> None:
        """Apply an edited routes file: receivers whose settings changed get a new sender
        (after the old one's attempt in progress ends); new ones start; removed ones keep
        delivering what they have queued until the next restart. Edited ``delivery`` settings
        (retry base and cap, max age) apply to every sender from its next attempt on."""
        nonlocal retry, delivery
        if cfg.delivery != delivery:
            delivery = cfg.delivery
            retry = dataclasses.replace(retry, base_s=delivery.retry_base, cap_s=delivery.retry_cap)
            for sender in senders.values():
                sender.policy, sender.max_age_s = retry, delivery.max_age
        topics = [r.topic_name for r in cfg.receivers if isinstance(r, KafkaReceiverConfig)]
        if topics:
            specs = tuple(receiver_topic_spec(t) for t in topics)
            await ensure_topics(settings, settings.partitions, settings.replication_factor, specs)
        for r in cfg.receivers:
            if r.name in running and running[r.name][2] != r:
                await stop_sender(r.name)
            if r.name not in running:
                start_sender(r, cfg)
        disp.reconfigure(cfg)
        logger.info("routes file reloaded: %d receiver(s), %d route(s)", len(cfg.receivers), len(disp.routes))

    def wake_publisher() -> None:
        publisher.wake.set()

    watcher = RoutesWatcher(routes_file or settings.routes_file, config)
    try:
        await producer.start()
        if db.fresh:
            rebuild = lambda: _rebuild_log(settings, disp, db)  # noqa: E731
            if await until_answered("read the notification log back", rebuild, stop) is None:
                return
        await consumer.start()
        assign = lambda: _assign(settings, consumer, db)  # noqa: E731
        if (marks := await until_answered("assign the inputs' partitions", assign, stop)) is None:
            return
        disp.rebuilding = bool(marks)
        REBUILDING.set(1 if marks else 0)
        publisher = Publisher(db, producer)
        for r in config.receivers:
            start_sender(r, config)
        publisher_task = asyncio.create_task(publisher.run(quit_publisher))
        logger.info(
            "dispatching %s to %d receiver(s) from %s%s", "/".join(INPUTS), len(senders),
            routes_file or settings.routes_file, " (rebuilding state from the topics)" if marks else "",
        )  # fmt: skip
        await _loop(
            disp, db, consumer, stop, senders, publisher, marks, clock, poll_ms, max_batch, watcher, reload,
            command_secret=settings.command_secret.get_secret_value(),
        )  # fmt: skip
        await _commit_kafka(consumer, db)
    finally:
        for name in list(running):
            running[name][0].set()
        await asyncio.gather(*(t for _, t, _ in running.values()), return_exceptions=True)
        quit_publisher.set()
        if publisher_task is not None:
            await asyncio.gather(publisher_task, return_exceptions=True)
        for s in senders.values():
            if s.notifier is not None:
                await s.notifier.aclose()
        await stop_consumer(consumer)
        await producer.stop()
        db.close()
        logger.info("dispatcher stopped")


async def _loop(
    disp: Dispatcher,
    db: DispatchDB,
    consumer: AIOKafkaConsumer,
    stop: asyncio.Event,
    senders: dict[str, OutboxSender],
    publisher: Publisher,
    marks: dict[TopicPartition, int],
    clock: Clock,
    poll_ms: int,
    max_batch: int,
    watcher: RoutesWatcher | None = None,
    reload: Callable[[RoutesFile], Awaitable[None]] | None = None,
    *,
    command_secret: str,
) -> None:
    offsets: dict[tuple[str, int], int] = {}
    reached: dict[TopicPartition, int] = {}
    last_kafka_commit = 0.0
    while not stop.is_set():
        edited = watcher.poll() if watcher is not None else None
        if edited is not None and reload is not None:
            await reload(edited)
        timer = disp.next_timer()
        wait_ms = poll_ms if timer is None else int(min(poll_ms, max(0.0, timer - clock()) * 1000))
        polled = await consumer.getmany(timeout_ms=wait_ms, max_records=max_batch)
        for tp, records in polled.items():
            _apply(disp, tp, records, command_secret)
            offsets[(tp.topic, tp.partition)] = records[-1].offset + 1
        # ``offsets`` only holds what this batch moved; the replay may end over several batches.
        # The position, not the last record: a transaction's commit marker ends a partition
        # written by an exactly-once worker, and a read_committed consumer never returns it.
        for tp in marks:
            reached[tp] = await consumer.position(tp)
        if marks and all(reached.get(tp, 0) >= m for tp, m in marks.items()):
            marks.clear()
            disp.rebuilding = False
            REBUILDING.set(0)
            logger.info("state rebuilt from the topics; storm control is on")
        timer = disp.next_timer()
        if timer is not None and timer <= clock():
            disp.tick()
        effects = disp.take_effects()
        changes = [(t.name, k, v) for t in disp.tables() for k, v in t.drain()]
        if not (polled or effects or changes):
            continue
        publish = [(NOTIFICATIONS, key.encode(), orjson.dumps(ev)) for key, ev in effects.log]
        publish += [
            (NOTIFICATIONS, a.fingerprint.encode(), orjson.dumps(resolved_by_hand(a))) for a in effects.alerts
        ]
        db.commit(changes, offsets, effects.outbox, publish)
        offsets_now, offsets = offsets, {}
        for msg in effects.outbox:
            if msg.receiver in senders:
                senders[msg.receiver].wake.set()
        if publish:
            publisher.wake.set()
        if offsets_now and clock() - last_kafka_commit >= 5.0:
            last_kafka_commit = clock()
            await _commit_kafka(consumer, db)
        for status, n in db.counts().items():
            OUTBOX.labels(status).set(n)


def _apply(
    disp: Dispatcher, tp: TopicPartition, records: Iterable[ConsumerRecord[bytes, bytes]], secret: str
) -> None:
    for rec in records:
        outcome: str
        try:
            if tp.topic == ALERTS:
                outcome = disp.on_alert(Alert.from_json(rec.value or b""))
            else:
                cmd = parse_command(rec.value or b"")
                if verify_command(cmd, secret):
                    disp.on_command(cmd)
                    outcome = "applied"
                else:
                    outcome = "forged"
                    why = (
                        "it is not signed"
                        if not cmd.sig
                        else "its signature does not match APP_COMMAND_SECRET"
                    )
                    logger.error(
                        "refusing a %s command at %s:%d@%d (by %r): %s; it is not applied",
                        cmd.type, tp.topic, tp.partition, rec.offset, cmd.by, why,
                    )  # fmt: skip
        except (ValueError, TypeError, KeyError) as exc:
            outcome = "invalid"
            logger.error("skipping unusable record at %s:%d@%d: %s", tp.topic, tp.partition, rec.offset, exc)
        DISPATCHED.labels(tp.topic, outcome).inc()


async def _assign(
    settings: Settings, consumer: AIOKafkaConsumer, db: DispatchDB
) -> dict[TopicPartition, int]:
    """Assign every input partition at its kept offset (or the beginning); return the high
    watermarks when replaying from the beginning, so the caller knows when it caught up.
    A kept offset past a partition's end means the topic was recreated (an embedded broker
    restarted empty): that partition is read from the beginning, with a warning. The
    consumer is started."""
    kept = db.offsets()
    marks = await assign_kept(consumer, settings, list(INPUTS), kept)
    return {} if kept else {tp: m for tp, m in marks.items() if m}


async def _commit_kafka(consumer: AIOKafkaConsumer, db: DispatchDB) -> None:
    await commit_for_monitoring(consumer, {TopicPartition(t, p): n for (t, p), n in db.offsets().items()})


async def _rebuild_log(settings: Settings, disp: Dispatcher, db: DispatchDB) -> int:
    """Restore the notification log and undelivered messages from the notifications topic;
    how many events it read."""
    events = await read_topic(settings, NOTIFICATIONS)
    pending: dict[str, OutboxMessage] = {}
    for ev in events:
        kind = ev.get("event")
        if kind in ("queued", "absorbed", "recorded") and "log_key" in ev:
            entry = Entry(frozenset(ev["firing"]), frozenset(ev["resolved"]), ev["at"], ev["seq"])
            disp.nflog.restore_entry(ev["log_key"], entry)
        if kind == "armed":
            disp.restore_escalation(Escalation.from_dict(ev["escalation"]))
        if kind == "queued":
            pending[ev["msg_id"]] = OutboxMessage(
                ev["msg_id"], ev["receiver"], ev["group_key"], ev["at"], ev["body"].encode(),
                tuple(ev["alert_ids"]), ev.get("notice", ""),
            )  # fmt: skip
        elif kind in ("delivered", "dead"):
            pending.pop(ev["msg_id"], None)
    changes = [(t.name, k, v) for t in disp.tables() for k, v in t.drain()]
    db.commit(changes, {}, pending.values())
    logger.info(
        "rebuilt the notification log from %d event(s); %d undelivered message(s) recovered",
        len(events), len(pending),
    )  # fmt: skip
    return len(events)


async def read_topic(settings: Settings, topic: str, stall_s: float = 60.0) -> list[dict[str, Any]]:
    """Every JSON record of ``topic`` up to its current end (its last stable offset), in
    partition order. Raises :class:`~app.errors.BrokerError` when no record came for
    ``stall_s`` before the end (:func:`~app.kafka.clients.read_to_end`): the read once stopped
    at a 60 s deadline and rebuilt the notification log from what it had, without a word."""
    out: list[dict[str, Any]] = []
    consumer = make_consumer(settings)
    try:
        await consumer.start()
        ends = await assign_kept(consumer, settings, [topic], {})  # every partition from its start
        async for rec in read_to_end(consumer, ends, stall_s=stall_s, poll_ms=200, max_records=2000):
            with contextlib.suppress(orjson.JSONDecodeError):
                out.append(orjson.loads(rec.value or b""))
    finally:
        await stop_consumer(consumer)
    return out
