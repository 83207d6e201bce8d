"""The worker's write-behind state store: reads and writes hit the table's memory dict at
once; each commit turns the keys changed since the last one into one changelog record each,
on the partition stamped on the state, with tombstones for deleted and oversized states."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import faust
import orjson
import pytest
from prometheus_client import REGISTRY

from agents.state_store import TableStore
from app.rules.statekey import forwarded_key
from tests.agents.worker_helpers import TOPIC, fake_table


def _too_large(rule: str) -> float:
    return REGISTRY.get_sample_value("worker_state_too_large_total", {"rule": rule}) or 0.0


KA, KB, KG, KBURST = (orjson.dumps(k) for k in ("r\x1fa", "r\x1fb", "gone\x1fx", "burst\x1fip"))


def test_writes_are_read_back_at_once_and_land_in_the_table() -> None:
    data: dict[str, Any] = {"old\x1fa": {"partition": 1, "n": 1}}
    store = TableStore(fake_table(data), 10_000)
    assert store.store.get("old\x1fa") == {"partition": 1, "n": 1}  # state recovered from the changelog
    store.store.put("r\x1fb", {"partition": 2, "n": 5})
    assert store.store.get("r\x1fb") == {"partition": 2, "n": 5}
    assert data["r\x1fb"] == {"partition": 2, "n": 5}  # what a restore after a reload reads
    store.store.delete("old\x1fa")
    assert store.store.get("old\x1fa") is None
    assert "old\x1fa" not in data
    store.store.delete("never\x1fseen")  # nothing to delete: no record
    assert sorted(store.items()) == [("r\x1fb", {"partition": 2, "n": 5})]


def test_each_changed_key_is_one_record_per_commit_with_its_latest_state() -> None:
    store = TableStore(fake_table({"gone\x1fx": {"partition": 0, "n": 9}}), 10_000)
    state = {"partition": 3, "n": 1}
    store.store.put("r\x1fa", state)
    state["n"] = 2  # a state mutated in place, then written again: its latest value goes out
    store.store.put("r\x1fa", state)
    store.store.put("r\x1fb", {"partition": 1, "n": 7})
    store.store.delete("gone\x1fx")
    changes = list(store.changes())
    assert [(t, p, k, None if v is None else orjson.loads(v)) for t, p, k, v in changes] == [
        (TOPIC, 3, KA, {"partition": 3, "n": 2}),
        (TOPIC, 1, KB, {"partition": 1, "n": 7}),
        (TOPIC, 0, KG, None),  # a tombstone on the partition of the deleted state
    ]
    assert list(store.changes()) == []  # nothing changed since
    store.store.put("r\x1fa", {"partition": 3, "n": 3})
    store.store.delete("r\x1fa")  # written and deleted between two commits: only the tombstone
    assert list(store.changes()) == [(TOPIC, 3, KA, None)]


def test_a_state_too_large_for_a_record_stays_in_memory_behind_a_tombstone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = TableStore(fake_table(), 200)
    big = {"partition": 1, "buf": ["x" * 40] * 10}
    before = _too_large("burst")
    store.store.put("burst\x1fip", big)
    assert list(store.changes()) == [(TOPIC, 1, KBURST, None)]
    store.store.put("burst\x1fip", big)
    assert list(store.changes()) == [(TOPIC, 1, KBURST, None)]
    assert store.store.get("burst\x1fip") is big  # evaluation goes on from memory
    assert _too_large("burst") == before + 2
    assert sum("over the 200 a changelog record may have" in r.message for r in caplog.records) == 1
    store.store.put("burst\x1fip", {"partition": 1, "buf": []})
    ((_, _, _, blob),) = list(store.changes())
    assert blob is not None and orjson.loads(blob) == {"partition": 1, "buf": []}
    assert "fits a changelog record again" in caplog.text


def test_only_memory_stores_are_accepted() -> None:
    table = fake_table()
    table.data = SimpleNamespace(data=SimpleNamespace())  # e.g. a RocksDB store
    with pytest.raises(TypeError, match="rule-state-sensors: expected an in-memory store"):
        TableStore(table, 1000)


def test_changelog_keys_read_back_through_the_tables_own_key_codec() -> None:
    """Recovery decodes the changelog with the Faust table's key serializer: a state key
    (rule id, unit separator, group values of any script) comes back as written."""
    app = faust.App("table-store-test", broker="kafka://127.0.0.1:1", store="memory://")
    table = app.Table("rule-state-sensors", default=None, key_type=str, partitions=2)
    store = TableStore(table, 10_000)
    key = 'hot-machine\x1fcapteur-é-东京\x1f"quoted"'
    store.store.put(key, {"partition": 1})
    ((topic, _, raw_key, _),) = list(store.changes())
    assert topic == table.changelog_topic.get_topic_name()
    assert app.serializers.loads_key(str, raw_key, serializer=table.key_serializer) == key


def test_forgetting_partitions_drops_their_states_and_unwritten_changes_without_a_record() -> None:
    """A rebalance: the partitions that left (or are restored again) lose their states in
    memory, and nothing of theirs reaches the changelog afterwards, not even a tombstone."""
    data: dict[str, Any] = {
        "r\x1fa": {"partition": 0, "n": 1},
        "r\x1fb": {"partition": 1, "n": 2},
        "\x00clock\x1fsensors\x1f1": {"partition": 1, "clock": 5},
    }
    store = TableStore(fake_table(data), 10_000)
    store.store.put("r\x1fa", {"partition": 0, "n": 3})
    store.store.put("r\x1fb", {"partition": 1, "n": 4})
    store.store.delete("\x00clock\x1fsensors\x1f1")
    assert store.forget({1}) == 1
    assert data == {"r\x1fa": {"partition": 0, "n": 3}}
    changes = [(t, p, k) for t, p, k, _ in store.changes()]
    assert changes == [(TOPIC, 0, KA)]  # partition 1's write and tombstone are dropped
    assert store.forget(set()) == 0 and store.forget({0}) == 1 and data == {}


def test_the_last_offsets_evaluated_go_after_the_states_that_count_them() -> None:
    """A crash that cuts a commit short leaves a prefix of a partition's records. An offset's
    record ahead of the states would let the restart drop events no state counts."""
    store = TableStore(fake_table(), 10_000)
    mark = forwarded_key("sensors", 1, 1)
    store.store.put("r\x1fa", {"partition": 1, "n": 1})
    store.store.put(mark, {"partition": 1, "offset": 2})  # the first batch
    store.store.put("r\x1fb", {"partition": 1, "n": 1})  # the second batch: first change of b
    store.store.put(mark, {"partition": 1, "offset": 5})
    keys = [orjson.loads(key) for _, _, key, _ in store.changes()]
    assert keys == ["r\x1fa", "r\x1fb", mark]
