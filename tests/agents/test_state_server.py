"""Interactive queries on the real broker: two rule workers in one group on 4-partition topics
serve the live rule state; any key asked through either worker gives the same answer, which
is the state a backtest of the same events ends with; after one worker is killed (SIGTERM, and
kill -9, where the group notices only at the session timeout), the other answers for its keys
once it has restored them, with the backtest's states."""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from agents.state_server import StateConfig, StateServer
from agents.topics import regroup_topic
from app.backtest import BacktestReport, read_events
from app.kafka.broker import KafkaBroker, free_port
from app.kafka.clients import high_watermarks
from app.rules.evaluator import Engine, partition_for
from app.rules.loader import load_rules
from tests.agents.worker_helpers import committed_offsets, state_get
from tests.conftest import child_env, reset_topics
from tests.kafka_helpers import produce
from tests.procs import role, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PARTITIONS = 4
DEVICES = [f"dev-{i}" for i in range(12)]
RULES = """rules:
  - id: hot
    source: sensors
    where: temperature > 50
    for: 10m
    group_by: [device_id]
  - id: kind-hourly
    source: sensors
    group_by: [kind]
    window: {type: tumbling, size: 1h}
    aggregate: {n: count(*), max_t: max(temperature)}
    having: n >= 1000
"""
TOKEN = "s3cret-token"


def readings() -> list[bytes]:
    out = []
    for m in range(0, 30, 5):
        for i, d in enumerate(DEVICES):
            temp = 60.0 + m if i % 3 == 0 else 20.0 + i  # a third hot: pending, then firing at 10 min
            out.append(orjson.dumps({"device_id": d, "kind": f"k-{i % 4}",
                                     "ts": f"2024-01-01T00:{m:02d}:00Z", "temperature": temp}))  # fmt: skip
    return out


def expected_states(lines: list[bytes], rules_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Every (rule, key)'s state as a backtest of ``lines`` leaves it, in the API's form."""
    ruleset = load_rules([rules_dir])
    engine = Engine(ruleset, partitions=PARTITIONS)
    engine.process_batch(list(read_events(lines, "in", BacktestReport())))

    class _Rt:  # what the server reads: the engine's streams and their stores
        def __init__(self) -> None:
            self.engine = engine
            self.stores = {}
            for source, streams in engine.streams.items():
                for s in streams:
                    name = source if s.fields is None else f"{source}.regroup"
                    self.stores.setdefault(name, _Store(s.evaluator.store))

    class _Store:
        def __init__(self, store: Any) -> None:
            self.live = store.data
            self.topic = ""

    server = StateServer(app=None, rt=_Rt(), config=StateConfig("127.0.0.1", 0, ""))
    out = {}
    for rule in ("hot", "kind-hourly"):
        loc = server.locate(rule)
        assert loc is not None
        for g in server.local_groups(loc):
            out[(rule, g["key"])] = g
    return out


def inputs_committed(bootstrap: str) -> bool:
    """Whether the worker group has committed every partition it reads, ``events.sensors``
    and the regroup topic among them, at its end offset."""
    done = committed_offsets(bootstrap)
    topics = sorted({tp.topic for tp in done})
    if "events.sensors" not in topics or regroup_topic("sensors") not in topics:
        return False
    ends = asyncio.run(high_watermarks(bootstrap, topics))
    return all(done.get(tp, 0) >= end for tp, end in ends.items() if not tp.topic.endswith("-changelog"))


@pytest.mark.parametrize("kill", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_any_worker_answers_any_key_with_the_backtests_state_and_takes_over_a_killed_ones(
    broker: KafkaBroker, tmp_path: Path, kill: signal.Signals
) -> None:
    asyncio.run(reset_topics(broker.bootstrap, partitions=PARTITIONS))
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "r.yaml").write_text(RULES)
    lines = readings()
    expected = expected_states(lines, rules_dir)
    assert len({partition_for(d.encode(), PARTITIONS) for d in DEVICES}) == PARTITIONS, "keys must spread"
    # the hot third of the devices (a group that never matched keeps no state) and 4 kinds
    assert sorted(expected) == [
        *(("hot", f"dev-{i}") for i in (0, 3, 6, 9)),
        *(("kind-hourly", f"k-{i}") for i in range(4)),
    ]

    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]

    def env(i: int) -> dict[str, str]:
        return child_env(
            KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_DATA_DIR=str(tmp_path / f"data{i}"),
            APP_PARTITIONS=str(PARTITIONS), APP_RULES_DIR=str(rules_dir), APP_STATE_PORT=str(ports[i]),
            APP_STATE_TOKEN=TOKEN,
        )  # fmt: skip

    def answers(base: str) -> dict[tuple[str, str], dict[str, Any]] | None:
        got = {}
        for rule, key in expected:
            code, body, _ = state_get(f"{base}/state/rules/{rule}/groups/{urllib.request.quote(key)}", TOKEN)
            if code != 200:
                return None
            got[(rule, key)] = body
        return got

    def strip(body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k != "answered_by"}

    log1, log2 = tmp_path / "w1.log", tmp_path / "w2.log"
    with role(["agents", "worker", "-l", "info"], env(0), log1) as w1:
        wait_for(lambda: "Worker ready" in log1.read_text(errors="replace"), 180, what="worker 1 ready")
        with role(["agents", "worker", "-l", "info"], env(1), log2):
            wait_for(lambda: "Worker ready" in log2.read_text(errors="replace"), 180, what="worker 2 ready")
            produce(
                broker.bootstrap,
                "events.sensors",
                [(orjson.loads(v)["device_id"].encode(), v) for v in lines],
            )

            # without the token: refused
            req = urllib.request.Request(f"{urls[0]}/state/rules/hot")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=5)
            assert refused.value.code == 401

            def settled() -> tuple[Any, Any] | None:
                a, b = answers(urls[0]), answers(urls[1])
                if a is None or b is None or {k: strip(v) for k, v in a.items()} != expected:
                    return None
                return a, b

            via_1, via_2 = wait_for(
                settled, 90, interval_s=1.0, what="every key answered with the backtest's state"
            )
            assert {k: strip(v) for k, v in via_2.items()} == expected
            # the partitions are split: each worker answered some keys itself, forwarded the others
            assert {v["answered_by"] for v in via_1.values()} == set(urls)
            assert all(via_1[k]["answered_by"] == via_2[k]["answered_by"] for k in expected)
            hot = next(v for k, v in via_1.items() if k == ("hot", "dev-0"))
            assert (hot["status"], hot["condition"]["since"], hot["condition"]["firing_since"]) == (
                "firing",
                "2024-01-01T00:00:00.000Z",
                "2024-01-01T00:00:00.000Z",
            )
            site = via_1[("kind-hourly", "k-0")]
            assert site["open_windows"][0]["aggregates"] == {"n": 18, "max_t": 85.0}

            code, summary, _ = state_get(f"{urls[1]}/state/rules/hot?limit=3", TOKEN)
            assert code == 200 and summary["total"] == 4 and len(summary["groups"]) == 3
            assert [g["key"] for g in summary["groups"]] == ["dev-0", "dev-3", "dev-6"]
            assert sorted(summary["workers"]) == sorted(urls)
            code, cold, _ = state_get(f"{urls[0]}/state/rules/hot/groups/dev-1", TOKEN)
            assert code == 404 and cold["error"] == "no state for this group"

            # the takeover is checked from a committed point, so that worker 2's answers are the
            # backtest's from the first on: every input the group reads, the regroup topic
            # included, committed to its end (at most a second)
            wait_for(
                lambda: inputs_committed(broker.bootstrap), 30, interval_s=0.5, what="every input committed"
            )
            # worker 1 is killed (SIGTERM: it leaves the group; kill -9: the group waits for its
            # session timeout); worker 2 takes its partitions and restores their state from the
            # changelogs
            os.killpg(w1.pid, kill)
            w1.wait(30)
            busy = []

            def taken_over() -> dict[tuple[str, str], dict[str, Any]] | None:
                for rule, key in list(expected)[:3]:
                    code, _, headers = state_get(f"{urls[1]}/state/rules/{rule}/groups/{key}", TOKEN)
                    if code == 503:
                        busy.append(headers.get("Retry-After"))
                got = answers(urls[1])
                if got is None or any(v["answered_by"] != urls[1] for v in got.values()):
                    return None
                return got

            try:
                after = wait_for(taken_over, 120, interval_s=1.0, what="worker 2 answering every key itself")
            except AssertionError:
                last = {
                    f"{r}/{k}": state_get(f"{urls[1]}/state/rules/{r}/groups/{k}", TOKEN)[:2]
                    for r, k in expected
                }
                raise AssertionError(f"{last}\n{log2.read_text(errors='replace')[-3000:]}") from None
            # every state, the regrouped window rule's included, is the backtest's from the first
            # answer on: the handover neither lost an event nor counted one twice
            differ = {k: (strip(v), expected[k]) for k, v in after.items() if strip(v) != expected[k]}
            assert not differ, differ
            assert set(after) == set(expected)
            assert busy and all(r == "2" for r in busy), "503 with Retry-After while it rebalanced"
