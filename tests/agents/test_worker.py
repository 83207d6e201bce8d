"""The foundation pipeline against the real embedded broker, every role a real process:
real NAB events -> Faust worker -> `alerts` (ids equal to the backtest's) -> delivery ->
the demo webhook receiver; malformed events -> `dlq.events` while processing goes on."""

from __future__ import annotations

import io
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.backtest import BacktestReport, backtest, read_events
from app.kafka.broker import KafkaBroker, free_port
from app.rules.loader import load_rules
from app.runtime.settings import PROJECT_ROOT
from tests.agents.worker_helpers import consumed, metrics_answer, nab_lines, role_env
from tests.conftest import own_broker
from tests.kafka_helpers import consume_json, produce, wait_for_json
from tests.procs import http_text, role, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

N_EVENTS = 3000  # covers the first overheat episodes (row 2398 onwards)


def receiver_stats(port: int) -> dict[str, Any] | None:
    text = http_text(f"http://127.0.0.1:{port}/stats")
    data: dict[str, Any] | None = None if text is None else orjson.loads(text)
    return data


def rule_counts(port: int, rule: str) -> tuple[int, int]:
    """(``worker_rule_events_total``, ``worker_rule_matched_total``) of ``rule`` on the worker's
    /metrics ((-1, -1) while it does not answer)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = http_text(f"http://127.0.0.1:{port}/metrics")
    if text is None:
        return -1, -1
    found = {s.name: int(s.value) for fam in text_string_to_metric_families(text) for s in fam.samples
             if s.labels.get("rule") == rule and s.name.startswith("worker_rule_")}  # fmt: skip
    return found.get("worker_rule_events_total", -1), found.get("worker_rule_matched_total", -1)


def test_nab_events_flow_to_alerts_webhook_and_dlq(broker: KafkaBroker, tmp_path: Path) -> None:
    lines = nab_lines(N_EVENTS)
    bad = [
        b"{this is not json",
        b'{"device_id": "machine-temp-1", "ts": "2013-12-11T05:00:00Z", "temperature": "hot"}',
    ]
    # the malformed records sit in the middle: everything after them must still be processed
    stream = [*lines[:1000], *bad, *lines[1000:]]
    produce(broker.bootstrap, "events.sensors", [(b"machine-temp-1", v) for v in stream])

    ruleset = load_rules([PROJECT_ROOT / "rules"])
    report = BacktestReport()
    with (tmp_path / "expected.jsonl").open("w") as out:
        expected = backtest(ruleset, read_events(lines, "nab", report), out, report)
    assert len(expected) >= 4, "the first 3000 NAB rows hold several overheat episodes"

    port, metrics_port = free_port(), free_port()
    env = role_env(
        broker,
        tmp_path,
        APP_RECEIVER_PORT=str(port),
        APP_WEBHOOK_URL=f"http://127.0.0.1:{port}/webhook",
        APP_WEBHOOK_ALLOW_PRIVATE="127.0.0.1",
    )
    with (
        role(["app", "receiver"], env, tmp_path / "receiver.log"),
        role(
            ["agents", "worker", "--loglevel", "info"],
            {**env, "APP_METRICS_PORT": str(metrics_port)},
            tmp_path / "worker.log",
        ),  # fmt: skip
        role(["app", "dispatch"], env, tmp_path / "dispatch.log"),
    ):
        alerts = wait_for_json(
            broker.bootstrap, "alerts", len(expected), timeout_s=90, what="alerts on the topic"
        )

        # Kafka orders records per key: compare each alert's (fingerprint's) transitions in order
        def by_fingerprint(items: list[tuple[str, str]]) -> dict[str, list[str]]:
            out: dict[str, list[str]] = {}
            for fp, aid in items:
                out.setdefault(fp, []).append(aid)
            return out

        assert by_fingerprint([(a["fingerprint"], a["alert_id"]) for a in alerts]) == by_fingerprint(
            [(a.fingerprint, a.alert_id) for a in expected]
        )
        assert len(alerts) == len(expected)
        # the rule has `for:`: every episode is pending first; pending is recorded, never notified
        assert {a["status"] for a in alerts} == {"pending", "firing", "resolved"}
        first = next(a for a in alerts if a["rule_id"] == "machine-overheat" and a["status"] == "firing")
        assert first["labels"]["device_id"] == "machine-temp-1"
        assert first["starts_at"] == "2013-12-11T05:05:00.000Z"

        # grouping notifies an alert's latest state: the receiver must end up with the last
        # transition of the episode, signed, and nothing that the rules did not produce
        last = expected[-1].alert_id
        stats = wait_for(
            lambda: (s := receiver_stats(port)) and any(a["alert_id"] == last for a in s["recent"]) and s,
            timeout_s=60,
            what="the latest alert state at the receiver",
        )
        assert stats["bad_signature"] == 0
        received = {a["alert_id"] for a in stats["recent"]}
        assert received <= {a.alert_id for a in expected if a.status != "pending"}

        # per rule, the events it evaluated (every valid one) and those its where matched
        hot = sum(1 for v in lines if orjson.loads(v)["temperature"] > 100)
        counted = wait_for(
            lambda: (c := rule_counts(metrics_port, "machine-overheat"))[0] == N_EVENTS and c,
            timeout_s=30,
            what="the worker's per-rule counters",
        )
        assert counted == (N_EVENTS, hot) and 0 < hot < N_EVENTS

    dlq = consume_json(broker.bootstrap, "dlq.events", min_count=2, timeout_s=10)
    assert len(dlq) == 2
    assert dlq[0]["raw"] == "{this is not json" and "not valid JSON" in dlq[0]["reason"]
    assert dlq[1]["field"] == "temperature" and dlq[1]["source"] == "sensors"


def test_a_worker_stops_within_seconds_once_its_cluster_is_gone(tmp_path: Path) -> None:
    """SIGTERM stops a worker whose brokers all went away within seconds: Faust waited up to
    60 s for aiokafka's consumer thread, which retries the lost cluster until then. And its
    consumer thread stops cleanly: its consumer's stop raised a fetch's CancelledError
    (aio-libs/aiokafka#647), the thread died with a traceback, and the stop waited out the
    thread's whole timeout for it."""
    metrics = free_port()
    log = tmp_path / "worker.log"
    with (
        own_broker(tmp_path / "kafka") as broker,
        role(["agents", "worker"], role_env(broker, tmp_path, APP_METRICS_PORT=str(metrics)), log) as proc,
    ):
        wait_for(lambda: metrics_answer(metrics), 90, what="the worker's /metrics")
        time.sleep(2)  # past its start-up: consuming, committing
        broker.stop()
        time.sleep(1)
        began = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(45)  # (the role's own stop would SIGKILL it after its grace)
        assert time.monotonic() - began < 20
        assert proc.returncode == 0
    text = log.read_text(errors="replace")
    assert "Exception in thread" not in text, text[-3000:]
    assert "Error while stopping child <WorkerConsumerThread" not in text


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_a_worker_stopped_mid_replay_once_its_cluster_is_gone_stops_within_seconds_and_loses_nothing(
    tmp_path: Path, guarantee: str
) -> None:
    """The cluster goes while the worker works through the real NAB series, its outputs and
    its commit in flight; then SIGTERM. The stop's last commit, the producer's flush and its
    stop each waited for the producer's request timeout (20 minutes in Faust): the worker did
    not stop. Now they get STOP_CLUSTER_S in all, and say so. Nothing is lost: once the broker
    is back, a new worker reads again what was not committed, and the alerts are the
    backtest's, ids and all. Exactly once, the transactions' end is the step cut short, and
    the new worker reads again what the aborted transactions held."""
    # four machines (90,780 events): the worker is still at work when its first alert comes
    lines = [line for i in range(1, 5) for line in nab_lines(device=f"machine-temp-{i}")]
    report = BacktestReport()
    rules = load_rules([PROJECT_ROOT / "rules"])
    expected = backtest(rules, read_events(lines, "nab", report), io.StringIO(), report, partitions=2)
    log = tmp_path / "worker.log"
    keyed = [(orjson.loads(v)["device_id"].encode(), v) for v in lines]
    with own_broker(tmp_path / "kafka") as broker:
        produce(broker.bootstrap, "events.sensors", keyed)
        env = role_env(broker, tmp_path, APP_PROCESSING_GUARANTEE=guarantee)
        with role(["agents", "worker"], env, log) as proc:
            wait_for_json(broker.bootstrap, "alerts", 1, timeout_s=90, what="the replay's first alert")
            broker.stop()
            began = time.monotonic()
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)  # (the role's own stop would SIGKILL it after its grace)
            took = time.monotonic() - began
        text = log.read_text(errors="replace")
        assert proc.returncode == 0, text[-3000:]
        assert took < 30, text[-3000:]  # a batch under way gets 10 s, then these steps 5 s, then 5 s
        # the last commit, or the producer's flush when a timer's commit had the outputs in
        # flight; exactly once, the transactions' end
        cut = r"stopping without the (last commit|producer's flush|transactions' end): the cluster did not"
        assert re.search(cut, text), text[-3000:]
        broker.start()
        with role(["agents", "worker"], env, tmp_path / "again.log"):
            wait_for(lambda: consumed(broker.bootstrap, ["events.sensors"]), 120, what="the replay committed")
            alerts = consume_json(broker.bootstrap, "alerts", min_count=len(expected), timeout_s=10)
    # a batch read again may give some alerts twice, with their ids: receivers dedup on them
    assert {a["alert_id"] for a in alerts} == {a.alert_id for a in expected}


def test_future_dated_events_change_no_alert_of_the_worker_and_are_dead_lettered(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    """The real NAB series with a bad clock's events among it, through the worker: the
    alerts of the series without them, and each of them on dlq.events with its reason."""
    lines = nab_lines(N_EVENTS)
    bad = [
        {"device_id": "rogue-1", "ts": "2099-12-31T00:00:00Z", "temperature": 20.0},  # ahead of the wall
        {
            "device_id": "machine-temp-1",
            "ts": "2020-01-01T00:00:00Z",
            "temperature": 20.0,
        },  # of the partition
    ]
    stream = [*lines[:1000], orjson.dumps(bad[0]), *lines[1000:2000], orjson.dumps(bad[1]), *lines[2000:]]
    produce(broker.bootstrap, "events.sensors", [(orjson.loads(v)["device_id"].encode(), v) for v in stream])
    ruleset = load_rules([PROJECT_ROOT / "rules"])
    report = BacktestReport()
    expected = backtest(ruleset, read_events(lines, "nab", report), io.StringIO(), report)
    with role(["agents", "worker"], role_env(broker, tmp_path), tmp_path / "worker.log"):
        alerts = wait_for_json(broker.bootstrap, "alerts", len(expected), timeout_s=90, what="alerts")
        dead = wait_for_json(broker.bootstrap, "dlq.events", 2, timeout_s=30, what="the refused events")
    assert sorted((a["fingerprint"], a["alert_id"]) for a in alerts) == sorted(
        (a.fingerprint, a.alert_id) for a in expected
    )
    assert {(d["adapter"], d["field"], orjson.loads(d["raw"])["ts"][:4]) for d in dead} == {
        ("rule-worker", "ts", "2099"), ("rule-worker", "ts", "2020"),
    }  # fmt: skip
    by_year = {orjson.loads(d["raw"])["ts"][:4]: d["reason"] for d in dead}
    assert "ahead of the wall clock" in by_year["2099"]
    assert "ahead of its partition's clock 2013-12-" in by_year["2020"]
