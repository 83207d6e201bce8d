"""Creating this system's topics on a cluster (idempotent: a topic that exists is left as it is)."""

from __future__ import annotations

import asyncio
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError, for_code

from app.errors import BrokerError
from app.kafka.clients import Target, bootstrap_of, connection
from app.kafka.errors import broker_errors
from app.topics import TOPICS, TopicSpec

logger = logging.getLogger(__name__)


async def ensure_topics(
    bootstrap: Target,
    partitions: int,
    replication_factor: int = 1,
    specs: tuple[TopicSpec, ...] = TOPICS,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create every topic in ``specs`` that does not exist yet; return those created, once the
    cluster's metadata lists them.

    A create is answered by the controller before every broker's metadata has the new topics,
    so a client that lists, describes or deletes them right after could miss them (a test's
    reset that deleted "every topic" then left the previous ones standing)."""
    admin = AIOKafkaAdminClient(**connection(bootstrap), request_timeout_ms=10_000)
    try:
        with broker_errors(f"create topics on {bootstrap_of(bootstrap)}"):
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
            await _listed(admin, created, timeout_s)
        if created:
            logger.info("created topics %s", ", ".join(created))
        return created
    finally:
        await admin.close()


async def max_message_bytes(bootstrap: Target, topics: list[str], timeout_s: float = 30.0) -> dict[str, int]:
    """Each of ``topics``' largest record batch, its ``max.message.bytes`` as the cluster
    has it: the topic's own, or the cluster's default (a topic created by an earlier release
    keeps what it was created with)."""
    admin = AIOKafkaAdminClient(**connection(bootstrap), request_timeout_ms=10_000)
    try:
        with broker_errors(f"describe topics on {bootstrap_of(bootstrap)}"):
            await asyncio.wait_for(admin.start(), timeout_s)
            resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in topics]
            responses = await asyncio.wait_for(admin.describe_configs(resources), timeout_s)
    finally:
        await admin.close()
    found: dict[str, int] = {}
    for response in responses:
        for code, message, _, name, entries, *_ in response.resources:
            if code:
                why = f"{for_code(code).__name__} {message or ''}".rstrip()
                msg = f"cannot read the configuration of topic {name}: {why}"
                raise BrokerError(msg)
            for entry in entries:
                if entry[0] == "max.message.bytes":
                    found[name] = int(entry[1])
    return found


async def _listed(admin: AIOKafkaAdminClient, names: list[str], timeout_s: float) -> None:
    """Wait until the cluster's metadata lists every topic in ``names``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while missing := set(names) - set(await admin.list_topics()):
        if asyncio.get_running_loop().time() > deadline:
            msg = f"topics created but not listed within {timeout_s:.0f} s: {', '.join(sorted(missing))}"
            raise BrokerError(msg)
        await asyncio.sleep(0.05)
