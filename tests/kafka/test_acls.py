"""The per-role ACLs (app/kafka/acls.py) on a real Apache Kafka broker with SASL/SCRAM and the
StandardAuthorizer: the probe's forged alert cannot even be written."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.errors import KafkaError

from app.errors import BrokerError
from app.kafka.acls import ALL, PREFIXED, ROLES, TOPIC, WRITE, apply_acls, bindings
from app.kafka.admin import ensure_topics
from app.kafka.broker import KafkaBroker
from app.kafka.clients import end_offsets, make_producer
from app.runtime.settings import Settings
from app.topics import ALERTS, COMMANDS, SENSORS
from tests.conftest import make_settings


def test_only_the_engines_write_alerts_and_only_the_console_writes_commands() -> None:
    def covers(name: str, pattern: int, topic: str) -> bool:
        return name == topic or (pattern == PREFIXED and topic.startswith(name))

    def writers(topic: str) -> set[str]:
        return {
            r
            for r in ROLES
            for (kind, name, pattern, _, op) in bindings(r)
            if kind == TOPIC and op in (ALL, WRITE) and covers(name, pattern, topic)
        }

    assert writers(ALERTS) == {"worker", "spark"}
    assert writers(COMMANDS) == {"console"}


def as_role(tmp_path: Path, bootstrap: str, user: str, password: str) -> Settings:
    env = {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "KAFKA_SASL_USERNAME": user, "KAFKA_SASL_PASSWORD": password}  # fmt: skip
    return make_settings(tmp_path, KAFKA_BOOTSTRAP_SERVERS=bootstrap, **env)


async def write(settings: Settings, topic: str) -> bool:
    """True when ``settings``' principal could write one record to ``topic``."""
    producer = make_producer(settings, request_timeout_ms=5000)
    try:
        await asyncio.wait_for(producer.start(), 10)
        await asyncio.wait_for(producer.send_and_wait(topic, b"{}", key=b"k"), 10)
    except (KafkaError, TimeoutError):
        return False
    finally:
        await producer.stop()
    return True


@pytest.mark.slow
@pytest.mark.integration
def test_each_role_writes_only_what_its_acls_allow_and_strangers_nothing(tmp_path: Path) -> None:
    users = {"admin": "admin-pw", **{r: f"{r}-pw" for r in ROLES}}
    with KafkaBroker(tmp_path / "kafka", heap="512m", sasl_users=users, acls=True) as broker:
        admin = as_role(tmp_path, broker.bootstrap, "admin", users["admin"])
        asyncio.run(ensure_topics(admin, partitions=1))
        assert asyncio.run(apply_acls(admin)) == sum(len(bindings(r)) for r in ROLES)
        role = {r: as_role(tmp_path, broker.bootstrap, r, users[r]) for r in ROLES}
        allowed = {
            ("worker", ALERTS): True, ("spark", ALERTS): True, ("ingest", SENSORS): True,
            ("console", COMMANDS): True,
            # the probe: a forged alert or silence from a principal that may not write it
            ("ingest", ALERTS): False, ("console", ALERTS): False, ("dispatch", ALERTS): False,
            ("worker", COMMANDS): False, ("ingest", COMMANDS): False,
        }  # fmt: skip
        seen = {(r, t): asyncio.run(write(role[r], t)) for r, t in allowed}
        assert seen == allowed
        assert asyncio.run(end_offsets(admin, [ALERTS, COMMANDS])) == {ALERTS: 2, COMMANDS: 1}
        with pytest.raises(BrokerError):  # no credentials: no connection at all
            asyncio.run(end_offsets(broker.bootstrap, [ALERTS], timeout_s=5))
