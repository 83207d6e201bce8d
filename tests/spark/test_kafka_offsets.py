"""The Kafka source's option parsing and offset arithmetic (pure, no Spark, no broker)."""

from __future__ import annotations

import pytest

from app.errors import ConfigError
from jobs.kafka_offsets import (
    KafkaOptionError,
    KafkaSourceOptions,
    from_json,
    parse_spec,
    rate_limit,
    resolve,
    to_json,
)
from jobs.kafka_source import kafka_format

BASE = {"kafka.bootstrap.servers": "h:9092", "subscribe": "a,b"}


def test_defaults_follow_spark_for_streaming_and_batch() -> None:
    stream = KafkaSourceOptions.parse(BASE, streaming=True)
    batch = KafkaSourceOptions.parse(BASE, streaming=False)
    assert stream.subscribe == ("a", "b") and stream.starting == "latest"
    assert batch.starting == "earliest" and batch.ending == "latest"
    assert stream.fail_on_data_loss is True and stream.max_offsets_per_trigger is None


def test_option_keys_are_case_insensitive() -> None:
    opts = KafkaSourceOptions.parse({**BASE, "MAXOFFSETSPERTRIGGER": "7"}, streaming=True)
    assert opts.max_offsets_per_trigger == 7


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"subscribe": "a"}, True, "'kafka.bootstrap.servers' is required"),
        ({"kafka.bootstrap.servers": "h:1"}, True, "exactly one of"),
        ({**BASE, "subscribePattern": "a.*"}, True, "exactly one of"),
        ({**BASE, "startingOffsets": "{bad"}, True, "must be earliest, latest or JSON"),
        ({**BASE, "startingOffsets": "latest"}, False, "cannot be latest"),
        ({**BASE, "endingOffsets": "earliest"}, False, "cannot be earliest"),
        ({**BASE, "endingOffsets": "latest"}, True, "batch reads only"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, True, "must be a whole number > 0"),
        ({**BASE, "failOnDataLoss": "maybe"}, True, "true or false"),
        ({**BASE, "includeHeaders": "true"}, True, "not supported by the kafka_py source"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], streaming: bool, message: str) -> None:
    with pytest.raises(KafkaOptionError, match=message):
        KafkaSourceOptions.parse(options, streaming=streaming)


def test_json_spec_resolves_earliest_and_latest_markers() -> None:
    spec = parse_spec('{"t":{"0":5,"1":-2,"2":-1}}', "startingOffsets")
    earliest = {("t", 0): 0, ("t", 1): 3, ("t", 2): 0}
    latest = {("t", 0): 10, ("t", 1): 10, ("t", 2): 9}
    assert resolve(spec, earliest, latest, "startingOffsets") == {("t", 0): 5, ("t", 1): 3, ("t", 2): 9}


def test_json_spec_must_name_every_partition() -> None:
    spec = parse_spec('{"t":{"0":5}}', "startingOffsets")
    with pytest.raises(KafkaOptionError, match=r"missing \[t-1\]"):
        resolve(spec, {("t", 0): 0, ("t", 1): 0}, {("t", 0): 9, ("t", 1): 9}, "startingOffsets")


def test_rate_limit_shares_the_budget_by_backlog_and_starves_nobody() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 50}
    latest = {("t", 0): 90, ("t", 1): 10, ("t", 2): 51}
    end = rate_limit(start, latest, 20)
    assert end == {("t", 0): 17, ("t", 1): 1, ("t", 2): 51}
    assert sum(end[tp] - start[tp] for tp in start) <= 20 + len(start)
    assert rate_limit(start, latest, 1000) == latest


def test_checkpoint_json_round_trips() -> None:
    offsets = {("b", 1): 7, ("a", 0): 3}
    assert to_json(offsets) == {"a": {"0": 3}, "b": {"1": 7}}
    assert from_json(to_json(offsets)) == offsets


def test_one_setting_selects_the_fallback_source() -> None:
    assert kafka_format({}) == "kafka"
    assert kafka_format({"APP_SPARK_KAFKA_FORMAT": "kafka_py"}) == "kafka_py"
    with pytest.raises(ConfigError, match=r"expected kafka \(.*\) or kafka_py"):
        kafka_format({"APP_SPARK_KAFKA_FORMAT": "kafka-0-10"})


def test_isolation_level_defaults_to_kafkas_and_is_checked() -> None:
    assert KafkaSourceOptions.parse(BASE, streaming=True).isolation == "read_uncommitted"
    opts = KafkaSourceOptions.parse({**BASE, "kafka.isolation.level": "READ_COMMITTED"}, streaming=False)
    assert opts.isolation == "read_committed"
    with pytest.raises(KafkaOptionError, match=r"'kafka\.isolation\.level' must be read_uncommitted or"):
        KafkaSourceOptions.parse({**BASE, "kafka.isolation.level": "committed"}, streaming=True)


def test_the_subscription_check_ignores_what_only_the_connector_knows() -> None:
    opts = KafkaSourceOptions.subscription(
        {**BASE, "startingTimestamp": "1000", "kafka.default.api.timeout.ms": "5000"}
    )
    assert (opts.bootstrap, opts.subscribe, opts.timeout_ms) == ("h:9092", ("a", "b"), 5000)
    assigned = KafkaSourceOptions.subscription({"kafka.bootstrap.servers": "h:1", "assign": '{"t":[1,0]}'})
    assert assigned.assign == (("t", 1), ("t", 0)) and assigned.subscribe == ()
    with pytest.raises(KafkaOptionError, match="exactly one of"):
        KafkaSourceOptions.subscription({"kafka.bootstrap.servers": "h:1"})
