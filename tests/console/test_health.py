"""Pipeline health: roles from roles.json probed over /metrics, rates, Spark's lag."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from app.console.health import (
    ROLE_STATES_FILE,
    HealthSample,
    HealthSampler,
    probe_roles,
    rates,
    spark_lag,
    take_sample,
    worker_stats,
    write_roles_file,
)
from app.kafka.broker import free_port


def test_roles_are_up_when_their_metrics_answer(tmp_path: Path) -> None:
    port, dead = free_port(), free_port()
    reg = CollectorRegistry()
    Counter("worker_events_total", "x", ["source"], registry=reg).labels("sensors").inc(3)
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        write_roles_file(tmp_path, [
            {"name": "worker", "metrics": f"http://127.0.0.1:{port}/metrics"},
            {"name": "dispatch", "metrics": f"http://127.0.0.1:{dead}/metrics"},
        ])  # fmt: skip
        assert [(r.name, r.up) for r in probe_roles(tmp_path)] == [("worker", True), ("dispatch", False)]
        sample = take_sample(tmp_path, "")
        assert sample.error == "KAFKA_BOOTSTRAP_SERVERS is not set" and len(sample.roles) == 2
    finally:
        server.shutdown()
        thread.join(5)


def test_rates_are_the_difference_between_two_samples() -> None:
    a = HealthSample(100.0, ends={"events.sensors": 100, "dlq.events": 4})
    b = HealthSample(110.0, ends={"events.sensors": 300, "dlq.events": 5})
    assert rates(a, b) == {"events.sensors": 20.0, "dlq.events": 0.1}
    assert rates(None, b) == {}


def test_spark_lag_from_the_latest_offsets_file(tmp_path: Path) -> None:
    offsets = tmp_path / "spark" / "checkpoints" / "q" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"events.sensors":{"0":5,"1":5}}\n')
    (offsets / "2").write_text('v1\n{"batchWatermarkMs":0}\n{"events.sensors":{"0":10,"1":7}}\n')
    assert spark_lag(tmp_path, {("events.sensors", 0): 12, ("events.sensors", 1): 7}) == 2
    assert spark_lag(tmp_path / "none", {}) is None


def test_worker_stats_read_each_rules_evaluated_and_matched_events(tmp_path: Path) -> None:
    port = free_port()
    reg = CollectorRegistry()
    Counter("worker_events_total", "x", ["source"], registry=reg).labels("sensors").inc(10)
    seen = Counter("worker_rule_events_total", "x", ["rule"], registry=reg)
    matched = Counter("worker_rule_matched_total", "x", ["rule"], registry=reg)
    seen.labels("hot").inc(10)
    matched.labels("hot").inc(4)
    seen.labels("quiet")  # declared, nothing evaluated yet
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        write_roles_file(tmp_path, [{"name": "worker", "metrics": f"http://127.0.0.1:{port}/metrics"}])
        stats = worker_stats(tmp_path)
    finally:
        server.shutdown()
        thread.join(5)
    assert stats["rule_events"] == {"hot": 10.0, "quiet": 0.0}
    assert stats["rule_matched"] == {"hot": 4.0}
    assert stats["events"] == {"sensors": 10.0}
    assert worker_stats(tmp_path) == {}  # the worker is gone


def test_a_role_s_state_joins_the_supervisor_s_view_and_its_metrics(tmp_path: Path) -> None:
    """With the supervisor's process states: a running role whose /metrics does not answer is
    starting, not down; one that serves no /metrics (mosquitto) is up while it runs; a crash
    and a finished one-shot role say so."""
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=CollectorRegistry())
    try:
        write_roles_file(tmp_path, [
            {"name": "worker", "metrics": f"http://127.0.0.1:{port}/metrics"},
            {"name": "spark", "metrics": f"http://127.0.0.1:{free_port()}/metrics"},
            {"name": "mosquitto", "metrics": None},
            {"name": "dispatch", "metrics": f"http://127.0.0.1:{free_port()}/metrics"},
            {"name": "replay", "metrics": f"http://127.0.0.1:{free_port()}/metrics", "one_shot": True},
            {"name": "store-sync", "metrics": f"http://127.0.0.1:{free_port()}/metrics"},
        ])  # fmt: skip
        (tmp_path / ROLE_STATES_FILE).write_bytes(orjson.dumps({"roles": [
            {"name": "worker", "state": "running", "crashes": 0},
            {"name": "spark", "state": "running", "crashes": 0},
            {"name": "mosquitto", "state": "running", "crashes": 0},
            {"name": "dispatch", "state": "restarting", "crashes": 2, "exit_code": 1,
             "last_error": "app.errors.BrokerError: cannot read topic metadata: TimeoutError()"},
            {"name": "replay", "state": "done", "crashes": 0, "exit_code": 0},
            {"name": "store-sync", "state": "crash-looping", "crashes": 7, "exit_code": 1,
             "last_error": "sqlite3.OperationalError: disk I/O error", "retry_at": time.time() + 3600.4},
        ]}))  # fmt: skip
        got = [(r.name, r.up, r.label) for r in probe_roles(tmp_path)]
    finally:
        server.shutdown()
        thread.join(5)
    assert got == [
        ("worker", True, "up"),
        ("spark", False, "starting"),
        ("mosquitto", True, "up"),
        (
            "dispatch",
            False,
            "restarting (2 crashes, exit 1): "
            "app.errors.BrokerError: cannot read topic metadata: TimeoutError()",
        ),
        ("replay", True, "done"),
        (
            "store-sync",
            False,
            "crash-looping (7 crashes in a row, exit 1; next try in 3600 s): "
            "sqlite3.OperationalError: disk I/O error",
        ),
    ]


def test_a_sample_that_raises_is_skipped_and_sampling_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """The sampler's thread died with the first sample that raised (a roles file half written,
    a broker away), and the console's health panel froze on its last sample."""
    calls = []
    second = threading.Event()

    def sample() -> HealthSample:
        calls.append(len(calls))
        if len(calls) == 1:
            raise OSError("roles file half written")
        second.set()
        return HealthSample(at=float(len(calls)))

    sampler = HealthSampler(sample, interval_s=0.01)
    try:
        assert second.wait(5)
        assert sampler.latest()[1] == HealthSample(at=2.0)
    finally:
        sampler.stop()
    assert "a sample failed, showing the previous one: OSError('roles file half written')" in caplog.text
