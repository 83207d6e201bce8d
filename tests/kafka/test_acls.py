"""The per-role ACLs (app/kafka/acls.py) on a real Apache Kafka broker with SASL/SCRAM and the
StandardAuthorizer: the probe's forged alert cannot even be written."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from app.console.health import take_sample
from app.console.readings import ReadingsPlan, plan_readings
from app.console.source_reader import read_readings
from app.errors import BrokerError
from app.kafka.acls import (
    ALL,
    PREFIXED,
    ROLES,
    TOPIC,
    WRITE,
    apply_acls,
    bindings,
    branch_grants,
    rule_branch_topics,
)
from app.kafka.admin import ensure_topics
from app.kafka.broker import KafkaBroker
from app.kafka.clients import connection, end_offsets
from app.runtime.settings import PROJECT_ROOT, Settings
from app.runtime.system import BranchAcls
from app.topics import ALERTS, COMMANDS, DLQ, NOTIFICATIONS, SENSORS, TopicSpec
from tests.conftest import make_settings
from tests.kafka_helpers import can_write


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


def test_branch_topics_are_granted_to_the_engines_but_never_a_system_topic() -> None:
    extra = branch_grants(["finance.big", "events.copy", ALERTS, COMMANDS, NOTIFICATIONS, "tables.devices"])
    written = {
        (r, name)
        for r in ROLES
        for (kind, name, _, _, op) in bindings(r, extra)
        if kind == TOPIC and op in (ALL, WRITE)
    }
    assert {r for r, name in written if name == "finance.big"} == {"worker", "spark"}
    assert {r for r, name in written if name == COMMANDS} == {"console"}
    assert {r for r, name in written if name == NOTIFICATIONS} == {"dispatch"}
    assert {r for r, name in written if name == ALERTS} == {"worker", "spark"}


def test_the_branch_topics_of_the_shipped_rules_are_found() -> None:
    assert {"finance.high_amount", "finance.low_amount"} <= set(rule_branch_topics(PROJECT_ROOT / "rules"))


async def commit_as(settings: Settings, group: str, topic: str, offset: int) -> None:
    """Commit ``offset`` on ``topic``'s partition 0 for ``group``, as ``settings``' principal."""
    consumer = AIOKafkaConsumer(**connection(settings), group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


def as_role(tmp_path: Path, bootstrap: str, user: str, password: str) -> Settings:
    env = {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "KAFKA_SASL_USERNAME": user, "KAFKA_SASL_PASSWORD": password}  # fmt: skip
    return make_settings(tmp_path, KAFKA_BOOTSTRAP_SERVERS=bootstrap, **env)


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
        seen = {(r, t): can_write(role[r], t) for r, t in allowed}
        assert seen == allowed
        # the console reads an alert's readings from the event topics for its chart; the store may not
        reading = b'{"device_id": "k", "ts": "2024-05-01T10:00:00Z", "temperature": 101.5}'
        assert can_write(role["ingest"], SENSORS, reading)
        plan = plan_readings(source="sensors", group_by=("device_id",), field="temperature", window_ms=None,
                             labels={"device_id": "k"}, starts_at="2024-05-01T10:30:00Z",
                             ends_at="2024-05-01T11:00:00Z", now_ms=0)  # fmt: skip
        assert isinstance(plan, ReadingsPlan)
        collect, report = read_readings(role["console"], plan)
        assert ([r.value for r in collect.readings], report.error) == ([101.5], "")
        collect, report = read_readings(role["store"], plan)  # the store has no grant on events.*
        assert (collect.readings, report.error) == ([], "the topic events.sensors does not exist, or the "
                                                    "console's principal may not read it")  # fmt: skip
        assert asyncio.run(end_offsets(admin, [ALERTS, COMMANDS])) == {ALERTS: 2, COMMANDS: 1}
        # the Overview's pipeline health, as the console: topic ends (the DLQ's too) and the lag of
        # a group that committed (the store read one alert of two)
        asyncio.run(commit_as(role["store"], "alert-store", ALERTS, 1))
        sample = take_sample(tmp_path, role["console"])
        assert sample.error == "" and DLQ in sample.ends, sample.error
        assert sample.lag["store-sync"] == 1
        assert take_sample(tmp_path, broker.bootstrap).error.startswith("Kafka unreachable")  # no credentials
        with pytest.raises(BrokerError):  # no credentials: no connection at all
            asyncio.run(end_offsets(broker.bootstrap, [ALERTS], timeout_s=5))


@pytest.mark.slow
@pytest.mark.integration
def test_a_log_dir_formatted_without_users_takes_them_and_a_changed_password_replaces_the_old(
    tmp_path: Path,
) -> None:
    home = tmp_path / "kafka"
    with KafkaBroker(home, heap="384m") as plain:  # a data dir from before make run had auth
        asyncio.run(ensure_topics(plain.bootstrap, partitions=1))
    users = {"admin": "admin-pw", **{r: f"{r}-pw" for r in ROLES}}
    with KafkaBroker(home, heap="384m", sasl_users=users, acls=True) as broker:
        assert not broker.formatted_now
        admin = as_role(tmp_path, broker.bootstrap, "admin", users["admin"])
        asyncio.run(apply_acls(admin, extra=branch_grants(["finance.big"])))
        worker = as_role(tmp_path, broker.bootstrap, "worker", users["worker"])
        assert can_write(worker, ALERTS)  # SCRAM-SHA-512 with the password given now
        # a branch topic a rule names: the worker may create it, then write it
        assert asyncio.run(ensure_topics(worker, 1, specs=(TopicSpec("finance.big", key=""),))) == [
            "finance.big"
        ]
        assert can_write(worker, "finance.big")
        ingest = as_role(tmp_path, broker.bootstrap, "ingest", users["ingest"])
        refused = r"refused to create finance\.other \(TopicAuthorizationFailedError"  # logged as created
        with pytest.raises(BrokerError, match=refused):
            asyncio.run(ensure_topics(ingest, 1, specs=(TopicSpec("finance.other", key=""),)))
        # a rule file that branches to a new topic, added while make run runs: granted as it comes
        # (before, the worker's reload waited for a restart of make run)
        rules = tmp_path / "rules"
        rules.mkdir()
        branches = BranchAcls(admin, rules, ["finance.big"])
        later = (TopicSpec("finance.later", key=""),)
        (rules / "b.yaml").write_text(
            "rules:\n  - id: later\n    source: finance\n    where: amount is not null\n"
            "    branch:\n      - {when: amount >= 40, to: finance.later}\n"
        )
        with pytest.raises(BrokerError, match=r"refused to create finance\.later"):
            asyncio.run(ensure_topics(worker, 1, specs=later))
        assert branches.poll(now=1e9) == ["finance.later"]
        assert branches.poll(now=2e9) == []  # granted once, not again at every check
        assert asyncio.run(ensure_topics(worker, 1, specs=later)) == ["finance.later"]
        assert can_write(worker, "finance.later")
    users["worker"] = "a-new-password"
    with KafkaBroker(home, heap="384m", sasl_users=users, acls=True) as broker:
        assert can_write(as_role(tmp_path, broker.bootstrap, "worker", "a-new-password"), ALERTS)
        assert not can_write(as_role(tmp_path, broker.bootstrap, "worker", "worker-pw"), ALERTS)
