"""The Kafka topics this system owns, their keys, and how they are created.

Topic names are constants here and nowhere else. ``ensure_topics`` is
idempotent: a topic that exists already is left as it is.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from app.errors import BrokerError
from app.kafka import Target, bootstrap_of, connection

logger = logging.getLogger(__name__)

SENSORS = "events.sensors"
LOGS = "events.logs"
FINANCE = "events.finance"
DLQ = "dlq.events"
ALERTS = "alerts"
COMMANDS = "commands"
NOTIFICATIONS = "notifications"
DEVICES_TABLE = "tables.devices"
WATCHLISTS_TABLE = "tables.watchlists"

#: Event source name -> its topic.
SOURCE_TOPICS: dict[str, str] = {"sensors": SENSORS, "logs": LOGS, "finance": FINANCE}


@dataclass(frozen=True)
class TopicSpec:
    """A topic, what its record key is, and whether it is compacted."""

    name: str
    key: str
    compacted: bool = False
    partitions: int | None = None  # None: the configured default

    def config(self) -> dict[str, str]:
        return {"cleanup.policy": "compact"} if self.compacted else {}


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(SENSORS, key="device_id"),
    TopicSpec(LOGS, key="host"),
    TopicSpec(FINANCE, key="symbol"),
    TopicSpec(DLQ, key="source"),
    TopicSpec(ALERTS, key="fingerprint"),
    TopicSpec(COMMANDS, key="fingerprint or silence id"),
    TopicSpec(NOTIFICATIONS, key="group key"),
    TopicSpec(DEVICES_TABLE, key="device_id", compacted=True, partitions=1),
    TopicSpec(WATCHLISTS_TABLE, key="symbol", compacted=True, partitions=1),
)


def receiver_topic_spec(topic: str) -> TopicSpec:
    """The spec of a Kafka receiver's notification topic (``alerts.<receiver>`` by default),
    created by the dispatcher at start for every kafka receiver in the routes file."""
    return TopicSpec(topic, key="group key")


async def ensure_topics(
    bootstrap: Target,
    partitions: int,
    replication_factor: int = 1,
    specs: tuple[TopicSpec, ...] = TOPICS,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create every topic in ``specs`` that does not exist yet; return those created."""
    admin = AIOKafkaAdminClient(**connection(bootstrap), request_timeout_ms=10_000)
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(
                name=s.name,
                num_partitions=s.partitions or partitions,
                replication_factor=replication_factor,
                topic_configs=s.config(),
            )
            for s in specs
            if s.name not in existing
        ]
        refused: list[str] = []
        if wanted:
            try:
                response = await admin.create_topics(wanted)
            except TopicAlreadyExistsError:
                logger.info("topics were created concurrently by another process")
            else:  # per-topic errors come back in the answer, not as an exception
                for name, code, *rest in response.topic_errors:
                    if code not in (0, TopicAlreadyExistsError.errno):
                        why = f": {rest[0]}" if rest and rest[0] else ""
                        refused.append(f"{name} ({for_code(code).__name__}{why})")
        if refused:
            msg = f"the cluster refused to create {', '.join(refused)}"
            raise BrokerError(msg)
        created = [t.name for t in wanted]
        if created:
            logger.info("created topics %s", ", ".join(created))
        return created
    except (TimeoutError, KafkaError, OSError) as exc:
        msg = f"cannot create topics on {bootstrap_of(bootstrap)}: {exc!r}"
        raise BrokerError(msg) from exc
    finally:
        await admin.close()
