"""The Kafka topics this system owns and their keys.

Topic names are constants here and nowhere else. This module is pure data: creating
the topics on a cluster is :func:`app.kafka.admin.ensure_topics`.
"""

from __future__ import annotations

from dataclasses import dataclass

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
#: the source of each source topic
SOURCE_OF_TOPIC: dict[str, str] = {t: s for s, t in SOURCE_TOPICS.items()}

#: The system's own topics, which no rule may branch events to (the engines write only
#: alerts and dead letters there, never a rule's copies), and the prefixes of such topics
#: (registry tables, notification topics of Kafka receivers, Kafka's internal topics).
SYSTEM_TOPICS: tuple[str, ...] = (ALERTS, COMMANDS, NOTIFICATIONS, DLQ)
SYSTEM_TOPIC_PREFIXES: tuple[str, ...] = ("tables.", f"{ALERTS}.", "__")


@dataclass(frozen=True)
class TopicSpec:
    """A topic, what its record key is, whether it is compacted, and the largest record batch
    it takes (None: the cluster's default, 1 MiB)."""

    name: str
    key: str
    compacted: bool = False
    partitions: int | None = None  # None: the configured default
    max_message_bytes: int | None = None

    def config(self) -> dict[str, str]:
        config = {"cleanup.policy": "compact"} if self.compacted else {}
        if self.max_message_bytes is not None:
            config["max.message.bytes"] = str(self.max_message_bytes)
        return config


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
