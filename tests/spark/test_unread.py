"""The state groups a restarted rules query will not read (``jobs.unread``): their open alerts
end at the start, with the ids a restore would give, once; a group read again later starts
afresh while its stored value is the swept one. The state read itself runs in
``tests/spark/test_reload.py`` (a stream's last rule removed under the role)."""

from __future__ import annotations

import pickle
from pathlib import Path

import orjson
import pytest

from app.alerts import alert_id
from app.rules.loader import load_rules
from app.rules.retire import RulesRan
from app.rules.state import stamp
from jobs import peers
from jobs.compile import SparkPlan, plan_rules
from jobs.state import GroupRunner, encode_states, evaluate
from jobs.streams import StreamRunner, place, stream_key, stream_keys
from jobs.unread import GROUPS_FILE, Groups, end_open, unread_after
from tests.spark.helpers import SPIKE

PACK = (
    """\
engine: spark
rules:
  - {id: cold, source: sensors, where: "temperature < 0", group_by: [status]}
"""
    + SPIKE
)
LOGS_ONLY = """\
engine: spark
rules:
  - {id: teapot, source: logs, where: "status = 418"}
"""
FIRING = {"group": ["ok"], "last_event": 60_000, "streak": 1, "streak_since": 0, "firing_since": 0}


def plans(tmp_path: Path) -> tuple[SparkPlan, SparkPlan]:
    pack = tmp_path / "r.yaml"
    pack.write_text(PACK)
    before = plan_rules(load_rules([pack]))
    pack.write_text(LOGS_ONLY)
    return before, plan_rules(load_rules([pack]))


def firing_stream_state(plan: SparkPlan, split: int = 1) -> tuple[str, dict]:
    """A stream partition's state in which ``spike`` fires for d1, as its query stored it (with
    a split, d1's part's)."""
    spec = plan.streams[0]
    key = stream_key(spec.name, *place("d1", 1, split), split)
    event = orjson.dumps({"device_id": "d1", "ts": "2026-03-01T00:00:00Z", "temperature": 150.0}).decode()
    runner = StreamRunner(plan.stream_rules, plan.streams, 1, max_skew_ms=-1, split=split)
    out, state = runner.run_key(key, [(event, None, 1_772_323_200_000, 0, 0, "sensors", None, None)], None)
    assert state is not None and any(orjson.loads(r[3])["status"] == "firing" for r in out if r[0] == "alert")
    return key, state


@pytest.mark.parametrize("split", [1, 2])
def test_unread_groups_end_their_open_alerts_once(tmp_path: Path, split: int) -> None:
    """Also a part's group of a split stream partition (``APP_SPARK_STREAM_SPLIT``)."""
    before, _ = plans(tmp_path)
    assert {r.rule.id for r in before.rules} == {"cold"} and [r.id for r in before.stream_rules] == ["spike"]
    ran = RulesRan.of(r.facts for r in [x.rule for x in before.rules] + list(before.stream_rules))
    ran = pickle.loads(pickle.dumps(ran))  # noqa: S301 - as the engine holds it: our own object
    key, state = firing_stream_state(before, split)
    assert key in stream_keys(before.streams[0].name, 1, split)
    cold = {"cold\x1fok": {**FIRING, "version": stamp(before.rules[0].rule.version)}}
    rows = [(key, encode_states({key: state}, "zstd")), ("3", encode_states(cold, "zstd"))]

    alerts, digests = end_open(rows, ran, {})
    assert sorted((a.rule_id, a.status) for a in alerts) == [("cold", "resolved"), ("spike", "resolved")]
    spike = next(a for a in alerts if a.rule_id == "spike")
    assert spike.ends_at == "2026-03-01T00:00:00.000Z"  # the partition's clock as it was stored
    assert spike.values == {"retired": True} and "no longer runs" in spike.annotations["retired"]
    assert spike.alert_id == alert_id("spike", spike.fingerprint, spike.starts_at, "resolved")
    assert set(digests) == {key, "3"}

    again, more = end_open(rows, ran, digests)  # swept at an earlier start: nothing again
    assert again == [] and more == {}


def test_the_state_is_read_only_when_a_group_goes_unread(tmp_path: Path) -> None:
    before, after = plans(tmp_path)
    read_before = Groups(frozenset(s.name for s in before.streams), keyed=True)
    assert not unread_after(read_before, before)
    assert unread_after(read_before, after)  # the sensors stream went, and the keyed rules
    assert unread_after(Groups(), before)  # no record: a checkpoint from before it
    no_keyed = Groups(frozenset(s.name for s in after.streams), keyed=False)
    assert not unread_after(no_keyed, after)
    (tmp_path / GROUPS_FILE).write_text("{not json")
    assert Groups.read(tmp_path / GROUPS_FILE).streams is None


def test_a_group_read_again_starts_afresh_while_its_value_is_the_swept_one(tmp_path: Path) -> None:
    before, _ = plans(tmp_path)
    key, state = firing_stream_state(before)
    stored = encode_states({key: state}, "zstd")
    streams = StreamRunner(before.stream_rules, before.streams, 1, max_skew_ms=-1)
    swept = GroupRunner(before, streams, stale={key: peers.digest(stored)})
    rows, after, _ = evaluate(swept, "zstd", (swept.token, (key,)), stored, None)  # as pyspark gives it
    assert rows == [] and after == encode_states({}, "zstd")  # the swept states are gone
    kept = GroupRunner(before, streams, stale={key: peers.digest(b"another value")})
    rows, after, _ = evaluate(kept, "zstd", (kept.token, (key,)), stored, None)
    assert after == stored  # a value written since the sweep is the group's own
