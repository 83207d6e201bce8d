"""The rule worker's start: the registry tables load before Faust's table recovery ends.

Every batch handler first waits for the registry tables. Faust's recovery ends with a
seek that waits for the fetch under way, in which a handler may already run, and Faust
starts its own tasks (``@app.task``) only after recovery. So with the tables loaded by
such a task, a worker restarted on a backlog could hang at the seek for good (CI caught
one). The worker loads them from the app's start instead (``RulesApp.early_tasks``).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from agents.outbox import STATE_TOPIC_MAX_MESSAGE_BYTES
from agents.wiring import build_app, leader_topic
from app.kafka.admin import max_message_bytes
from app.kafka.clients import partition_counts
from app.runtime.settings import Settings
from app.topics import SOURCE_TOPICS

pytestmark = pytest.mark.integration


def test_the_registry_tables_load_as_the_app_starts_before_table_recovery(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    app = build_app(settings)

    async def run() -> bool:
        await app.on_start()  # what the worker's start runs first, before any recovery
        try:
            async with asyncio.timeout(20):
                while "registry tables are empty; evaluating" not in caplog.text:
                    await asyncio.sleep(0.05)
            return app.tables.recovery.completed.is_set()
        finally:
            futures = list(app._futures)  # the tasks the app would cancel as it stops
            for fut in futures:
                fut.cancel()
            await asyncio.gather(*futures, return_exceptions=True)

    with caplog.at_level(logging.INFO, logger="agents.registry"):
        recovered = app.loop.run_until_complete(run())  # the app's futures live on its own loop
    assert recovered is False  # the tables were ready with no recovery run at all


def test_faust_topics_exist_before_the_worker_starts(settings: Settings) -> None:
    """At a first start, Faust declared its topics (the state changelogs, compacted, and its
    group leader's) while its consumer joined the group: some did not exist yet, were logged
    "not found in cluster metadata" and left unassigned (and one of them stranded a producer
    batch: tests/kafka/test_tracking_producer.py)."""
    app = build_app(settings)
    names = sorted(t.changelog_topic.get_topic_name() for t in app.tables.values())
    assert len(names) == 2 * len(SOURCE_TOPICS)

    async def compaction() -> dict[str, str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
        await admin.start()
        try:
            topics = [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
            (response,) = await admin.describe_configs(topics)
        finally:
            await admin.close()
        return {
            resource[3]: next(entry[1] for entry in resource[4] if entry[0] == "cleanup.policy")
            for resource in response.resources
        }

    assert asyncio.run(partition_counts(settings, names)) == dict.fromkeys(names, settings.partitions)
    assert asyncio.run(compaction()) == dict.fromkeys(names, "compact")
    # a commit's states of one partition fit one record batch (agents.outbox.Outbox.place)
    room = STATE_TOPIC_MAX_MESSAGE_BYTES
    assert asyncio.run(max_message_bytes(settings.bootstrap_servers, names)) == dict.fromkeys(names, room)
    leader = leader_topic(app)
    assert asyncio.run(partition_counts(settings, [leader])) == {leader: 1}
