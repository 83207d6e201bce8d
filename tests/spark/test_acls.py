"""The Spark engine as `make run` runs it under ACLs: as its own principal (`spark`), on a
broker with SASL/SCRAM and the StandardAuthorizer, with either Kafka source; it reads the
events ingest wrote and writes the alerts the Faust-engine backtest gives."""

from __future__ import annotations

import asyncio
import os
from itertools import islice
from pathlib import Path

import orjson
import pytest
from pyspark.sql import SparkSession

from app.backtest import BacktestReport, backtest, read_events
from app.kafka.acls import ROLES, apply_acls
from app.kafka.admin import ensure_topics
from app.kafka.broker import KafkaBroker
from app.kafka.clients import make_producer
from app.rules.loader import load_rules
from app.runtime.settings import Settings
from app.topics import ALERTS, SENSORS
from ingest.adapters.nab import nab_events
from tests.conftest import NAB_MACHINE_TEMP, make_settings, require_dataset
from tests.kafka_helpers import consume
from tests.spark.conftest import FORMATS
from tests.spark.helpers import run_once

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RULES = Path(__file__).with_name("rules.yaml")  # machine-overheat and machine-cold, engine: both


async def _publish(settings: Settings, lines: list[bytes]) -> None:
    producer = make_producer(settings)
    await producer.start()
    try:
        for line in lines:
            await producer.send(SENSORS, line, key=b"machine-temp-1")
        await producer.flush()
    finally:
        await producer.stop()


def test_the_spark_engine_reads_and_writes_as_its_own_principal_under_acls(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = nab_events(str(require_dataset(NAB_MACHINE_TEMP)), device="machine-temp-1", field="temperature")
    lines = [orjson.dumps(r) for r in islice(rows, 2600)]  # the first overheat episode
    ruleset = load_rules([RULES])
    report = BacktestReport()
    with open(os.devnull, "w") as out:
        want = {a.alert_id for a in backtest(ruleset, read_events(lines, "nab", report), out, report)}
    assert want
    users = {"admin": "admin-pw", **{r: f"{r}-pw" for r in ROLES}}
    with KafkaBroker(tmp_path / "kafka", heap="384m", sasl_users=users, acls=True) as broker:

        def as_(user: str, data: str = "data") -> Settings:
            return make_settings(
                tmp_path, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_DATA_DIR=str(tmp_path / data),
                KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT", KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
                KAFKA_SASL_USERNAME=user, KAFKA_SASL_PASSWORD=users[user],
            )  # fmt: skip

        admin = as_("admin")
        asyncio.run(ensure_topics(admin, partitions=2))
        asyncio.run(apply_acls(admin))
        asyncio.run(_publish(as_("ingest"), lines))
        for fmt in FORMATS:
            monkeypatch.setenv("APP_SPARK_KAFKA_FORMAT", fmt)
            run_once(spark, as_("spark", f"data-{fmt}"), ruleset, per_trigger=200_000, timeout_s=180)
            written = {orjson.loads(r.value)["alert_id"] for r in consume(admin, ALERTS, timeout_s=3)}
            assert written == want, fmt  # each format writes the same ids (the second, again)
