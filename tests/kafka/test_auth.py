"""Kafka security settings (app/kafka/auth.py): parsing, and SASL against a real Apache Kafka
broker with a SASL listener (PLAIN and both SCRAM mechanisms)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.errors import BrokerError, ConfigError
from app.kafka.admin import ensure_topics
from app.kafka.auth import KafkaAuth
from app.kafka.broker import KafkaBroker
from app.kafka.clients import end_offsets, make_consumer, make_producer
from app.runtime.settings import Settings
from tests.conftest import make_settings


def test_plaintext_is_the_default_and_has_no_credentials() -> None:
    auth = KafkaAuth.from_env({})
    assert auth.client_options() == {"security_protocol": "PLAINTEXT"}
    assert auth.spark_options() == {"kafka.security.protocol": "PLAINTEXT"}


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "SASL"}, "KAFKA_SECURITY_PROTOCOL"),
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "KAFKA_SASL_USERNAME"),
        ({"KAFKA_SASL_MECHANISM": "GSSAPI"}, "KAFKA_SASL_MECHANISM"),
        ({"KAFKA_SSL_CAFILE": "/no/such.pem", "KAFKA_SECURITY_PROTOCOL": "SSL"}, "KAFKA_SSL_CAFILE"),
        ({"KAFKA_SSL_CAFILE": "/etc/hostname"}, "uses no TLS"),
        ({"KAFKA_SSL_CHECK_HOSTNAME": "maybe"}, "KAFKA_SSL_CHECK_HOSTNAME"),
    ],
)
def test_unusable_settings_name_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        KafkaAuth.from_env(env)


def test_the_password_is_in_no_repr_and_is_quoted_for_java() -> None:
    auth = KafkaAuth.from_env(
        {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
         "KAFKA_SASL_USERNAME": "worker", "KAFKA_SASL_PASSWORD": 's3"cr\\et'}
    )  # fmt: skip
    assert 's3"cr' not in repr(auth) and 's3"cr' not in repr(make_settings(Path("/tmp")))
    jaas = auth.spark_options()["kafka.sasl.jaas.config"]
    assert jaas == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="worker" '
        'password="s3\\"cr\\\\et";'
    )


def sasl(tmp_path: Path, bootstrap: str, mechanism: str, user: str, password: str) -> Settings:
    env = {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": mechanism,
           "KAFKA_SASL_USERNAME": user, "KAFKA_SASL_PASSWORD": password}  # fmt: skip
    return make_settings(tmp_path, KAFKA_BOOTSTRAP_SERVERS=bootstrap, **env)


@pytest.mark.slow
@pytest.mark.integration
def test_roles_authenticate_with_sasl_plain_and_scram_and_strangers_are_refused(tmp_path: Path) -> None:
    users = {"admin": "admin-secret", "worker": "worker-secret"}
    with KafkaBroker(tmp_path / "kafka", heap="512m", sasl_users=users) as broker:
        admin = sasl(tmp_path, broker.bootstrap, "SCRAM-SHA-256", "admin", users["admin"])
        asyncio.run(ensure_topics(admin, partitions=1))
        for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            worker = sasl(tmp_path, broker.bootstrap, mechanism, "worker", users["worker"])
            asyncio.run(_round_trip(worker, mechanism.encode()))
        assert asyncio.run(end_offsets(admin, ["events.logs"])) == {"events.logs": 3}

        wrong = sasl(tmp_path, broker.bootstrap, "SCRAM-SHA-256", "worker", "guess")
        with pytest.raises(BrokerError):
            asyncio.run(end_offsets(wrong, ["events.logs"], timeout_s=5))
        with pytest.raises(BrokerError):  # no credentials at all
            asyncio.run(end_offsets(broker.bootstrap, ["events.logs"], timeout_s=5))


async def _round_trip(settings: Settings, value: bytes) -> None:
    producer = make_producer(settings)
    await producer.start()
    try:
        await (await producer.send("events.logs", value=value, partition=0))
    finally:
        await producer.stop()
    consumer = make_consumer(settings, "events.logs")
    await consumer.start()
    try:
        got = await asyncio.wait_for(_read_until(consumer, value), 20)
    finally:
        await consumer.stop()
    assert got == value


async def _read_until(consumer: object, value: bytes) -> bytes:
    while True:
        batch = await consumer.getmany(timeout_ms=500)  # type: ignore[attr-defined]
        for records in batch.values():
            for r in records:
                if r.value == value:
                    return bytes(r.value)


def test_spark_options_round_trip_into_the_kafka_py_source() -> None:
    """The connector's kafka.* options describe the same TLS/SASL to the project's own source."""
    from jobs.kafka_offsets import KafkaOptionError, KafkaSourceOptions

    secret = 'p"w\\d'  # a quote and a backslash, escaped in JAAS
    auth = KafkaAuth(protocol="SASL_SSL", mechanism="SCRAM-SHA-512", username="spark",
                     password=secret, cafile="/etc/hostname", check_hostname=False)  # fmt: skip
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "events.sensors"}
    parsed = KafkaSourceOptions.parse({**base, **auth.spark_options()}, streaming=True)
    assert parsed.auth == auth
    assert KafkaSourceOptions.parse(base, streaming=True).auth == KafkaAuth()
    with pytest.raises(KafkaOptionError, match="jaas"):
        KafkaSourceOptions.parse({**base, "kafka.security.protocol": "SASL_PLAINTEXT"}, streaming=True)
    with pytest.raises(KafkaOptionError, match="keystore"):
        KafkaSourceOptions.parse({**base, "kafka.ssl.keystore.location": "/k.jks"}, streaming=True)
