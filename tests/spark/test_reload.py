"""`python -m app spark` follows the rule files as the worker does: a valid edit to what Spark
runs restarts its query on the same checkpoint with the new rules (new versions; a removed rule
raises nothing more), an invalid one is logged and the last good rules keep running."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import orjson
import pytest

from app.alerts import alert_id
from app.kafka.broker import KafkaBroker
from app.rules.loader import load_rules
from app.rules.retire import RulesRan
from app.rules.state import stamp
from jobs.compile import plan_rules
from jobs.engine import rules_ran, rules_ran_path
from jobs.state import GroupRunner
from jobs.streams import StreamRunner, stream_key
from tests.conftest import child_env
from tests.kafka_helpers import consume_json, produce
from tests.procs import gone, role, wait_for
from tests.spark.helpers import SPIKE

pytestmark = [pytest.mark.slow, pytest.mark.integration]

T = TypeVar("T")

HOT = """\
engine: spark
rules:
  - {id: hot, source: sensors, where: "temperature > %d", group_by: [device_id]}
  - {id: cold, source: sensors, where: "temperature < -40", group_by: [device_id]}
"""


COLD = """\
engine: spark
rules:
  - {id: cold, source: sensors, where: "temperature < -40", group_by: [device_id]}
"""

#: no rule on sensors: its stream's state groups are read no more
TEAPOT = """\
engine: spark
rules:
  - {id: teapot, source: logs, where: "status = 418", group_by: [host]}
"""


def reading(device: str, minute: int, temperature: float) -> tuple[bytes, bytes]:
    event = {"device_id": device, "ts": f"2026-03-01T00:{minute:02d}:00Z", "temperature": temperature}
    return device.encode(), orjson.dumps(event)


def alerts_when(broker: KafkaBroker, n: int) -> list[dict]:
    """The ``alerts`` topic once it holds ``n`` records (at most 90 s)."""

    def enough() -> list[dict] | None:
        got = consume_json(broker.bootstrap, "alerts", timeout_s=1)
        return got if len(got) >= n else None

    return wait_for(enough, timeout_s=90, what=f"{n} alerts")


def by_device(alerts: list[dict]) -> dict[str, list[tuple[str, str, str]]]:
    """Each device's alerts in the topic's order (one fingerprint's are in order): rule, status
    and version."""
    found: dict[str, list[tuple[str, str, str]]] = {}
    for a in alerts:
        found.setdefault(a["labels"]["device_id"], []).append((a["rule_id"], a["status"], a["rule_version"]))
    return found


def test_the_role_follows_rule_edits_and_keeps_the_last_good_rules(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    pack = rules / "hot.yaml"
    pack.write_text(HOT % 100)
    data = tmp_path / "data"
    env = child_env(KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_DATA_DIR=str(data))
    log = tmp_path / "spark.log"

    def text() -> str:
        return log.read_text(errors="replace")

    def alerts(n: int) -> list[dict]:
        return alerts_when(broker, n)

    with role(["app", "spark", "--master", "local[2]", "--rules", str(rules)], env, log) as proc:
        wait_for(lambda: "spark query 'rules' started" in text(), timeout_s=120, what="the query")
        produce(broker.bootstrap, "events.sensors", [reading("d1", 1, 105.0)])
        first = alerts(1)
        assert [(a["rule_id"], a["labels"]["device_id"]) for a in first] == [("hot", "d1")]

        pack.write_text("engine: spark\nrules: [{id: hot, source: sensors, where: temperature >\n")
        wait_for(
            lambda: "rule files rejected, the spark query keeps the last good rules" in text(),
            timeout_s=30,
            what="the rejection",
        )
        produce(broker.bootstrap, "events.sensors", [reading("d2", 2, 105.0)])  # the last good rules
        assert sorted(a["labels"]["device_id"] for a in alerts(2)) == ["d1", "d2"]  # partitions: any order

        pack.write_text(HOT % 110)  # hot@v2: d3 at 105 is no longer hot, d4 at 120 is
        wait_for(lambda: "reloaded the spark query's rules" in text(), timeout_s=60, what="the reload")
        # d3 and d4 come to both stream partitions: restored there, hot@v1's states end their
        # alerts (app.rules.retire) before the new version evaluates
        produce(broker.bootstrap, "events.sensors", [reading("d3", 3, 105.0), reading("d4", 4, 120.0)])
        v1, third = first[0]["rule_version"], alerts(5)
        v2 = by_device(third)["d4"][0][2]
        assert by_device(third) == {
            "d1": [("hot", "firing", v1), ("hot", "resolved", v1)],
            "d2": [("hot", "firing", v1), ("hot", "resolved", v1)],
            "d4": [("hot", "firing", v2)],
        }
        assert v2 != v1

        pack.write_text(TEAPOT)  # hot and cold removed: no rule reads sensors
        wait_for(
            lambda: text().count("reloaded the spark query's rules") == 2,
            timeout_s=60,
            what="the second reload",
        )
        # d4's alert ends as the query restarts, with no event: its state is read no more
        fourth = alerts(6)
        assert by_device(fourth)["d4"] == [("hot", "firing", v2), ("hot", "resolved", v2)]
        (ended,) = [a for a in fourth if a["labels"]["device_id"] == "d4" and a["status"] == "resolved"]
        assert ended["values"] == {"retired": True} and ended["ends_at"] == "2026-03-01T00:04:00.000Z"
        assert "ended 1 open alert(s) held by state groups the rules no longer read: hot" in text()
        produce(broker.bootstrap, "events.sensors", [reading("d5", 5, 130.0), reading("d6", 6, -50.0)])
        teapot = {"host": "h1", "ts": "2026-03-01T00:07:00Z", "status": 418}
        produce(broker.bootstrap, "events.logs", [(b"h1", orjson.dumps(teapot))])
        fifth = alerts(7)  # hot and cold are gone: d5 and d6 raise nothing; the new rule runs
        # the topic's partitions come in no set order: the new alert is the one not read before
        (new,) = [a for a in fifth if a["alert_id"] not in {b["alert_id"] for b in fourth}]
        assert (new["rule_id"], new["status"], new["labels"]["host"]) == ("teapot", "firing", "h1")
        assert len(consume_json(broker.bootstrap, "alerts", timeout_s=2)) == 7
        proc.terminate()
        assert proc.wait(15) == 0, text()[-3000:]
    assert "Traceback" not in text()
    assert gone(str(data)) == []


def test_a_rule_that_an_edit_would_move_to_another_path_keeps_its_state(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    """With the event-time bound off (``APP_MAX_EVENT_SKEW=off``: the keyed path has no partition
    clock, so with the bound on every rule takes the stream path), ``hot`` alone runs on the
    keyed path. An edit adds a window rule of the same source, whose
    topic-key stream a threshold rule grouped by the same key rides (``jobs.compile._riders``):
    hot's state lives on the keyed path, so the reloaded query keeps it there (the checkpoint's
    ``_placement.json``), and d1's firing alert resolves (its fingerprint, its episode's start).
    Before, hot started from fresh state on the stream path, and the alert was never resolved."""
    rules = tmp_path / "rules"
    rules.mkdir()
    pack = rules / "hot.yaml"
    hot = '  - {id: hot, source: sensors, where: "temperature > 100", group_by: [device_id]}\n'
    window = (
        "  - {id: busy, source: sensors, group_by: [device_id], window: {type: tumbling, size: 1h},"
        " aggregate: {n: 'count(*)'}, having: n > 100}\n"
    )
    pack.write_text("engine: spark\nrules:\n" + hot)
    data = tmp_path / "data"
    env = child_env(
        KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_DATA_DIR=str(data), APP_MAX_EVENT_SKEW="off"
    )
    log = tmp_path / "spark.log"

    def text() -> str:
        return log.read_text(errors="replace")

    with role(["app", "spark", "--master", "local[2]", "--rules", str(rules)], env, log) as proc:
        wait_for(lambda: "spark query 'rules' started" in text(), timeout_s=120, what="the query")
        produce(broker.bootstrap, "events.sensors", [reading("d1", 1, 105.0)])
        (fired,) = alerts_when(broker, 1)
        assert (fired["rule_id"], fired["status"]) == ("hot", "firing")
        pack.write_text("engine: spark\nrules:\n" + hot + window)
        wait_for(lambda: "reloaded the spark query's rules" in text(), timeout_s=60, what="the reload")
        produce(broker.bootstrap, "events.sensors", [reading("d1", 2, 50.0)])
        resolved = alerts_when(broker, 2)[1]
        assert (resolved["rule_id"], resolved["status"]) == ("hot", "resolved")
        assert (resolved["fingerprint"], resolved["starts_at"]) == (fired["fingerprint"], fired["starts_at"])
        placed = orjson.loads((data / "spark" / "checkpoints" / "rules" / "_placement.json").read_bytes())
        assert sorted(placed["rules"].values()) == ["keyed", "stream"]
        proc.terminate()
        assert proc.wait(15) == 0, text()[-3000:]
    assert gone(str(data)) == []


def test_the_role_starts_with_the_files_that_load_and_takes_the_others_once_fixed(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    """As the worker: an invalid file at the start is logged, the role runs the valid ones (it
    exited 1, and under ``make run`` the supervisor gave it up after five starts), and the
    fixed file comes in at the next check."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "hot.yaml").write_text((HOT % 100).split("  - {id: cold")[0])
    broken = rules / "cold.yaml"
    broken.write_text("engine: spark\nrules: [{id: cold, source: sensors, where: temperature <\n")
    data = tmp_path / "data"
    env = child_env(KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_DATA_DIR=str(data))
    log = tmp_path / "spark.log"

    def text() -> str:
        return log.read_text(errors="replace")

    def rules_of(n: int) -> list[str]:
        return [a["rule_id"] for a in alerts_when(broker, n)]

    with role(["app", "spark", "--master", "local[2]", "--rules", str(rules)], env, log) as proc:
        wait_for(lambda: "spark query 'rules' started" in text(), timeout_s=120, what="the query")
        assert "rule files rejected at start; the spark query starts with the valid ones" in text()
        assert "cold.yaml" in text()  # the problem names the file
        produce(broker.bootstrap, "events.sensors", [reading("d1", 1, 105.0), reading("d2", 2, -50.0)])
        assert rules_of(1) == ["hot"]
        broken.write_text(COLD)
        wait_for(lambda: "reloaded the spark query's rules" in text(), timeout_s=60, what="the reload")
        produce(broker.bootstrap, "events.sensors", [reading("d3", 3, -60.0)])
        assert rules_of(2) == ["hot", "cold"]
        proc.terminate()
        assert proc.wait(15) == 0, text()[-3000:]
    assert "Traceback" not in text()
    assert gone(str(data)) == []


def test_records_that_came_while_spark_had_no_rule_are_read_past_as_a_worker_reads_past_them(
    broker: KafkaBroker, tmp_path: Path
) -> None:
    """A worker with no rules consumes and commits what comes; rules that come back evaluate
    what arrives from then on. The Spark role did not read while it had no rule, so the rules
    that came back evaluated that backlog: here d2's reading, which no rule ran on, raised an
    alert, late. Both ways to have no rule: an edit that removes the last one (the query stops and
    waits), and a role started with none (a JVM only to end the alerts its checkpoint holds).
    Either way, the alerts open then end, as the worker ends those of a rule it no longer runs."""
    rules = tmp_path / "rules"
    rules.mkdir()
    pack = rules / "hot.yaml"
    hot = (HOT % 100).split("  - {id: cold")[0]
    pack.write_text(hot)
    data = tmp_path / "data"
    env = child_env(KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, APP_DATA_DIR=str(data))
    log = tmp_path / "spark.log"

    def text() -> str:
        return log.read_text(errors="replace")

    def devices(n: int) -> list[str]:  # the alerts topic's partitions, in any order
        return sorted(a["labels"]["device_id"] for a in alerts_when(broker, n))

    args = ["app", "spark", "--master", "local[2]", "--rules", str(rules)]
    with role(args, env, log) as proc:
        wait_for(lambda: "spark query 'rules' started" in text(), timeout_s=120, what="the query")
        produce(broker.bootstrap, "events.sensors", [reading("d1", 1, 105.0)])
        assert devices(1) == ["d1"]
        pack.write_text(hot.replace("engine: spark", "engine: faust"))  # no rule left for Spark
        wait_for(lambda: "the query waits for one" in text(), timeout_s=60, what="the stop")
        # the query reads no group while it waits: d1's alert ends as it stops
        resolved = alerts_when(broker, 2)[-1]
        assert (resolved["labels"]["device_id"], resolved["status"]) == ("d1", "resolved")
        assert "no longer runs on this engine" in resolved["annotations"]["retired"]
        produce(broker.bootstrap, "events.sensors", [reading("d2", 2, 105.0)])
        pack.write_text(hot)
        wait_for(lambda: "reloaded the spark query's rules" in text(), timeout_s=60, what="the reload")
        # d1's swept state is not restored with its rule: a new episode fires, as on the worker
        produce(broker.bootstrap, "events.sensors", [reading("d3", 3, 105.0), reading("d1", 3, 106.0)])
        assert devices(4) == ["d1", "d1", "d1", "d3"]
        assert "read past 1 record(s) that came while the Spark engine had no rule" in text()
        proc.terminate()
        assert proc.wait(15) == 0, text()[-3000:]

    pack.write_text(hot.replace("engine: spark", "engine: faust"))
    log = tmp_path / "spark-again.log"
    with role(args, env, log) as proc:
        wait_for(lambda: "the Spark engine has nothing to do" in text(), timeout_s=120, what="the idle role")
        # started with no rule: the alerts its checkpoint's groups held (d1's second, d3's) end first
        assert "ended 2 open alert(s) held by state groups the rules no longer read: hot" in text()
        produce(broker.bootstrap, "events.sensors", [reading("d4", 4, 105.0), reading("d5", 5, 105.0)])
        pack.write_text(hot)
        wait_for(lambda: "spark query 'rules' started: 1 rule(s)" in text(), timeout_s=120, what="the query")
        produce(broker.bootstrap, "events.sensors", [reading("d6", 6, 105.0)])
        assert devices(7) == ["d1", "d1", "d1", "d1", "d3", "d3", "d6"]
        assert "read past 2 record(s) that came while the Spark engine had no rule" in text()
        assert len(consume_json(broker.bootstrap, "alerts", timeout_s=2)) == 7
        proc.terminate()
        assert proc.wait(15) == 0, text()[-3000:]
    assert "Traceback" not in text()
    assert gone(str(data)) == []


SLIDING = (
    """\
engine: spark
rules:
  - {id: hot, source: sensors, where: "temperature > 100", group_by: [status]}
"""
    + SPIKE
)


def test_a_restarted_query_drops_the_states_of_rules_that_no_longer_run(tmp_path: Path) -> None:
    """After an edit removed a rule, a group's restored states lose that rule's (they were kept,
    encoded and stored again at every micro-batch, for ever), and those of a rule's older
    version: on the keyed path and in a stream partition's evaluator. Quiet ones, and with no
    record of the rule: nothing to end."""
    pack = tmp_path / "r.yaml"
    cold = '  - {id: cold, source: sensors, where: "temperature < 0", group_by: [status]}\n'
    pack.write_text(SLIDING + cold)
    before = plan_rules(load_rules([pack]))
    pack.write_text(SLIDING)
    after = plan_rules(load_rules([pack]))
    assert {r.rule.id for r in before.rules} == {"hot", "cold"}  # the keyed path (grouped by status)
    assert {r.rule.id for r in after.rules} == {"hot"}

    stream = stream_key("sensors", 0)
    hot = stamp(after.rules[0].rule.version)
    keyed: dict[str, dict[str, Any]] = {
        "hot\x1fok": {"version": hot},
        "hot\x1fold": {"version": "2/an-older-version"},
        "cold\x1fok": {"version": "2/y"},
        stream: {"s": {}},
    }
    kept, ended = GroupRunner(after).current(keyed)
    assert set(kept) == {"hot\x1fok", stream} and ended == []

    spec = after.streams[0]
    runner = StreamRunner(after.stream_rules, after.streams, 1, max_skew_ms=-1)
    key = stream_key(spec.name, 0)
    event = orjson.dumps({"device_id": "d1", "ts": "2026-03-01T00:00:00Z", "temperature": 50.0}).decode()
    _, state = runner.run_key(key, [(event, None, 1_772_323_200_000, 0, 0, "sensors", None, None)], None)
    assert state is not None and any(k.startswith("spike") for k in state["s"])
    left_over = {**state["s"], "gone\x1fd1": {"version": "2/z"}}  # a removed rule's, in the stored JSON
    out, again = runner.run_key(key, [], {"c": state["c"], "s": left_over})
    assert again is not None and "gone\x1fd1" not in again["s"] and set(again["s"]) == set(state["s"])
    assert out == []


def shipped(runner: T) -> T:
    """``runner`` as an executor gets it."""
    found: T = pickle.loads(pickle.dumps(runner))  # noqa: S301 - our own object, just pickled
    return found


def test_a_restored_state_of_a_rule_that_no_longer_runs_ends_its_alert(tmp_path: Path) -> None:
    """With the query's record of the rules it ran (``jobs.engine.rules_ran``), a restored
    firing state of a removed or edited rule gets its resolution, ahead of the group's rows,
    with the id the rule would have given it: on the keyed path, and in a stream partition's
    evaluator (there at the partition's clock)."""
    pack = tmp_path / "r.yaml"
    cold = '  - {id: cold, source: sensors, where: "temperature < 0", group_by: [status]}\n'
    pack.write_text(SLIDING + cold)
    before = plan_rules(load_rules([pack]))
    pack.write_text(SLIDING.replace("hi > 100", "hi > 120"))  # cold removed, spike edited
    after = plan_rules(load_rules([pack]))
    # as the engine ships them to the executors: pickled (a compiled RuleFacts does not unpickle)
    ran = RulesRan.of(r.facts for r in [x.rule for x in before.rules] + list(before.stream_rules))

    firing = {"group": ["ok"], "last_event": 60_000, "streak": 1, "streak_since": 0, "firing_since": 0}
    cold_v = stamp(next(r.rule.version for r in before.rules if r.rule.id == "cold"))
    kept, rows = shipped(GroupRunner(after, ran=ran)).current({"cold\x1fok": {**firing, "version": cold_v}})
    assert kept == {}
    ((kind, topic, fp, body, *_),) = rows
    alert = orjson.loads(body)
    assert (kind, topic, alert["status"], alert["rule_id"], alert["labels"]["status"]) == (
        "alert", "alerts", "resolved", "cold", "ok",
    )  # fmt: skip
    assert alert["alert_id"] == alert_id("cold", fp, "1970-01-01T00:00:00.000Z", "resolved")
    assert alert["ends_at"] == "1970-01-01T00:01:00.000Z"  # no clock on the keyed path: its last event

    spec = before.streams[0]
    old = StreamRunner(before.stream_rules, before.streams, 1, max_skew_ms=-1)
    key = stream_key(spec.name, 0)
    event = orjson.dumps({"device_id": "d1", "ts": "2026-03-01T00:00:00Z", "temperature": 150.0}).decode()
    out, state = old.run_key(key, [(event, None, 1_772_323_200_000, 0, 0, "sensors", None, None)], None)
    (fired,) = [
        orjson.loads(r[3]) for r in out if r[0] == "alert" and orjson.loads(r[3])["status"] == "firing"
    ]
    new = shipped(StreamRunner(after.stream_rules, after.streams, 1, max_skew_ms=-1, ran=ran))
    cooler = orjson.dumps({"device_id": "d1", "ts": "2026-03-01T00:10:00Z", "temperature": 50.0}).decode()
    out, again = new.run_key(key, [(cooler, None, 1_772_323_800_000, 0, 1, "sensors", None, None)], state)
    ended = orjson.loads(out[0][3])
    assert (ended["status"], ended["rule_id"], ended["fingerprint"]) == (
        "resolved",
        "spike",
        fired["fingerprint"],
    )
    assert ended["rule_version"] == fired["rule_version"] and "edited" in ended["annotations"]["retired"]
    assert ended["alert_id"] == alert_id("spike", fired["fingerprint"], fired["starts_at"], "resolved")
    assert ended["ends_at"] == "2026-03-01T00:00:00.000Z"  # the partition's clock as it was stored
    assert again is not None and all(v.get("version") != fired["rule_version"] for v in again["s"].values())


def test_the_checkpoint_keeps_the_rules_its_query_ran(tmp_path: Path) -> None:
    """Each start adds its rules to ``_rules.json``, an edit's new version beside the old one,
    a plan of no rule (the query that reads past) writes nothing, and a record that does not
    read is started anew."""
    settings = SimpleNamespace(data_dir=tmp_path / "data")
    pack = tmp_path / "r.yaml"
    pack.write_text(SLIDING)
    first = plan_rules(load_rules([pack]))
    assert sorted(rid for rid, _ in rules_ran(settings, "rules", first)) == ["hot", "spike"]  # type: ignore[arg-type]
    pack.write_text(SLIDING.replace("hi > 100", "hi > 120"))
    again = rules_ran(settings, "rules", plan_rules(load_rules([pack])))  # type: ignore[arg-type]
    assert sorted(rid for rid, _ in again) == ["hot", "spike", "spike"]
    old = again[("spike", stamp(first.stream_rules[0].version))]
    assert (old.rule_id, old.version) == ("spike", first.stream_rules[0].version)
    assert len(rules_ran(settings, "rules", plan_rules(load_rules([])))) == 3  # type: ignore[arg-type]
    rules_ran_path(settings, "rules").write_text("{not json")  # type: ignore[arg-type]
    assert len(rules_ran(settings, "rules", first)) == 2  # type: ignore[arg-type]
