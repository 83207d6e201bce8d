"""The SQLite alert store (idempotency, ordering, readers) and the store-sync role on a real broker."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.alerts import Alert
from app.kafka.broker import KafkaBroker
from app.roles import store_sync
from app.runtime.settings import PROJECT_ROOT, Settings
from app.storage.alert_store import AlertStore
from app.topics import ALERTS
from tests.kafka_helpers import committed, produce


def episode(status: str, start: str, event: str, device: str = "d1", rule_id: str = "hot") -> Alert:
    return Alert.build(
        rule_id=rule_id,
        rule_version="1",
        status=status,  # type: ignore[arg-type]
        severity="warning" if status == "pending" else "critical",
        labels={"device_id": device},
        annotations={"summary": f"{device} is hot"},
        starts_at=start,
        ends_at=event if status == "resolved" else None,
        source="sensors",
        event_ts=event,
        values={"temp": 90},
    )


T0, T1, T2, T3 = (f"2024-05-01T10:0{i}:00Z" for i in range(4))


def test_apply_is_idempotent(tmp_path: Path) -> None:
    with AlertStore(tmp_path / "s" / "alerts.sqlite3") as store:
        alert = episode("firing", T0, T0)
        assert store.apply(alert) is True
        assert store.apply(alert) is False
        assert store.apply_many([alert, alert]) == 0
        assert [a.alert_id for a in store.history()] == [alert.alert_id]
        assert store.history()[0] == alert
        assert store.counts().by_status == {"firing": 1}


def test_newer_transition_wins_and_a_late_older_one_does_not_overwrite(tmp_path: Path) -> None:
    with AlertStore(tmp_path / "a.db") as store:
        store.apply_many([episode("pending", T0, T0), episode("firing", T0, T1)])
        assert store.current()[0].status == "firing"
        store.apply(episode("firing", T2, T2))  # the next episode
        store.apply(episode("resolved", T0, T1))  # the old episode's resolution, late
        (cur,) = store.current()
        assert (cur.status, cur.starts_at) == ("firing", T2)
        assert len(store.history()) == 4
        store.apply(episode("resolved", T2, T3))
        store.apply(episode("pending", T2, T2))  # late and older within the episode
        assert store.current()[0].status == "resolved"
        assert store.current("firing") == []


def test_times_compare_as_instants_not_strings(tmp_path: Path) -> None:
    with AlertStore(tmp_path / "a.db") as store:
        # As strings "…00.500Z" < "…00Z", but it is the later instant.
        store.apply(episode("firing", "2024-05-01T10:00:00.500Z", "2024-05-01T10:00:00.500Z"))
        store.apply(episode("firing", T0, T0))
        assert store.current()[0].starts_at == "2024-05-01T10:00:00.500Z"


def test_current_history_and_counts_queries(tmp_path: Path) -> None:
    with AlertStore(tmp_path / "a.db") as store:
        store.apply_many(
            [episode("firing", T0, T0, "d1"), episode("firing", T1, T1, "d2"),
             episode("pending", T2, T2, "d3"), episode("firing", T0, T0, "d1", rule_id="cold")]
        )  # fmt: skip
        assert [c.labels["device_id"] for c in store.current("firing")] == ["d2", "d1", "d1"]
        assert store.counts().matrix == {"firing": {"critical": 3}, "pending": {"warning": 1}}
        assert store.counts().by_severity == {"critical": 3, "warning": 1}
        assert [a.labels["device_id"] for a in store.history(limit=2)] == ["d3", "d2"]
        assert [a.rule_id for a in store.history(rule_id="cold")] == ["cold"]


def test_a_bad_batch_writes_nothing(tmp_path: Path) -> None:
    with AlertStore(tmp_path / "a.db") as store:
        bad = episode("firing", "yesterday", T0)
        with pytest.raises(ValueError, match=f"alert {bad.alert_id}: starts_at='yesterday'"):
            store.apply_many([episode("firing", T0, T0), bad])
        assert store.history() == []


@pytest.mark.slow
@pytest.mark.integration
def test_readers_in_other_processes_see_committed_writes(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    with pytest.raises(FileNotFoundError):
        AlertStore(path, readonly=True)
    reader = (
        "import sys; from app.storage.alert_store import AlertStore; "
        "s = AlertStore(sys.argv[1], readonly=True); "
        "print(len(s.history()), s.counts().by_status.get('firing', 0))"
    )
    with AlertStore(path) as writer:
        writer.apply_many([episode("firing", T0, T0, f"d{i}") for i in range(5)])
        out = subprocess.run(
            [sys.executable, "-c", reader, str(path)], cwd=PROJECT_ROOT, capture_output=True, text=True,
            timeout=60, check=True,
        )  # fmt: skip
        assert out.stdout.split() == ["5", "5"]
        ro = AlertStore(path, readonly=True)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            ro.apply(episode("firing", T3, T3))
        ro.close()


def sync_until(
    settings: Settings, done: Callable[[AlertStore], bool], *, timeout_s: float, settle_s: float = 0.0,
    interval_s: float = 0.1, **run: Any,
) -> None:  # fmt: skip
    """Run the store-sync role until ``done`` holds on the store it writes (at most
    ``timeout_s``), ``settle_s`` more, then stop it (bounded)."""

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(store_sync.run(settings, stop, **run))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not task.done():
            if settings.store_path.exists():
                with AlertStore(settings.store_path, readonly=True) as ro:
                    if done(ro):
                        break
            await asyncio.sleep(interval_s)
        await asyncio.sleep(settle_s)
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(asyncio.wait_for(main(), timeout_s + settle_s + 30))


@pytest.mark.slow
@pytest.mark.integration
def test_store_sync_role_applies_the_topic_once_and_commits(broker: KafkaBroker, settings: Settings) -> None:
    alerts = [episode("firing", T0, T0, f"d{i}") for i in range(30)]
    alerts += [episode("resolved", T0, T1, f"d{i}") for i in range(10)]
    records = [(a.fingerprint.encode(), a.to_json()) for a in alerts]
    produce(broker.bootstrap, ALERTS, [*records, records[0], (b"x", b"not json")])

    # settle: let the duplicate and the bad record be read too
    sync_until(
        settings, lambda ro: len(ro.history(limit=1000)) >= len(alerts), timeout_s=30, settle_s=1.0,
        interval_s=0.2, max_batch=16,
    )  # fmt: skip
    with AlertStore(settings.store_path, readonly=True) as ro:
        assert len(ro.history(limit=1000)) == len(alerts)
        assert ro.counts().by_status == {"firing": 20, "resolved": 10}
    assert committed(broker.bootstrap, store_sync.GROUP_ID) == len(records) + 2


def test_operator_records_are_applied_once_and_notifications_only_move_forward(tmp_path: Path) -> None:
    ack = {"type": "ack", "cmd_id": "c1", "at": "2024-05-01T10:00:00Z", "fingerprint": "fp1",
           "starts_at": T0, "by": "ann", "comment": "mine"}  # fmt: skip
    sil = {"type": "silence", "cmd_id": "c2", "at": "2024-05-01T10:00:00Z", "silence_id": "s1",
           "matchers": ['device_id="d1"'], "starts_at": T0, "ends_at": T3, "by": "bob"}  # fmt: skip
    uns = {"type": "unsilence", "cmd_id": "c3", "at": T2, "silence_id": "s1", "by": "eve"}
    queued = {"event": "queued", "msg_id": "m1", "receiver": "ops", "group_key": "g", "at": 1.0,
              "alert_ids": ["a1", "a2"]}  # fmt: skip
    dead = {**queued, "event": "dead", "at": 2.0, "attempts": 3, "reason": "answered 400"}
    with AlertStore(tmp_path / "a.db") as store:
        store.apply_batch(commands=[ack, sil], notifications=[queued, dead], offsets={("commands", 0): 2})
        store.apply_batch(commands=[ack, uns], notifications=[queued], offsets={("commands", 0): 4})
        assert [a["by"] for a in store.acks()] == ["ann"]
        (silence,) = store.silences()
        assert (silence["ends_at"], silence["ended_by"]) == (T2, "eve")
        assert store.silences(active_at=T1) != [] and store.silences(active_at=T2) == []
        (note,) = store.notifications(status="dead")
        assert (note["alert_ids"], note["reason"], note["attempts"]) == (["a1", "a2"], "answered 400", 3)
        assert store.notifications(alert_id="a2") == [note]
        assert store.offsets() == {("commands", 0): 4}


@pytest.mark.slow
@pytest.mark.integration
def test_a_lost_store_is_rebuilt_from_the_topics(broker: KafkaBroker, settings: Settings) -> None:
    alerts = [episode("firing", T0, T0, f"d{i}") for i in range(5)] + [episode("resolved", T0, T1, "d0")]
    produce(broker.bootstrap, ALERTS, [(a.fingerprint.encode(), a.to_json()) for a in alerts])

    def sync_once() -> None:
        sync_until(settings, lambda ro: len(ro.history(limit=100)) >= len(alerts), timeout_s=20, poll_ms=100)

    sync_once()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{settings.store_path}{suffix}").unlink(missing_ok=True)
    sync_once()
    with AlertStore(settings.store_path, readonly=True) as ro:
        assert len(ro.history(limit=100)) == len(alerts)
        assert ro.counts().by_status == {"firing": 4, "resolved": 1}
        assert sum(ro.offsets().values()) == len(alerts)


def test_each_transition_keeps_its_engine_and_a_copy_from_the_other_engine_adds_it(tmp_path: Path) -> None:
    faust, spark, both = (
        episode("firing", T0, T0, "d1"),
        episode("firing", T0, T0, "d2"),
        episode("firing", T1, T1, "d3"),
    )
    with AlertStore(tmp_path / "a.db") as store:
        assert store.apply_batch([faust, spark, both], engines=["faust", "spark", "spark"]) == 3
        assert store.apply_batch([both, both], engines=["faust", "spark"]) == 0  # the other engine's copy
        engines = {a.labels["device_id"]: a.engine for a in store.current()}
        assert engines == {"d1": "faust", "d2": "spark", "d3": "faust,spark"}
        assert store.engines_of([both.alert_id, faust.alert_id]) == {both.alert_id: "faust,spark",
                                                                      faust.alert_id: "faust"}  # fmt: skip
        store.apply(episode("resolved", T0, T1, "d1"))  # no engine given: the Faust worker's
        assert next(a for a in store.current() if a.labels["device_id"] == "d1").engine == "faust"
        with pytest.raises(ValueError, match="1 engines for 2 alerts"):
            store.apply_batch([faust, spark], engines=["spark"])


def write_schema_2_store(path: Path, alerts: list[Alert]) -> None:
    """A store file as schema 2 wrote it (no engine column), holding ``alerts``."""
    with AlertStore(path) as store:
        store.apply_many(alerts)
    conn = sqlite3.connect(path)
    try:
        for table in ("transitions", "alerts"):  # SQLite >= 3.35 drops a column
            conn.execute(f"ALTER TABLE {table} DROP COLUMN engine")
        conn.execute("PRAGMA user_version=2")
        conn.commit()
    finally:
        conn.close()


def test_a_schema_2_store_is_read_then_upgraded_in_place_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = episode("firing", T0, T0, "d1")
    write_schema_2_store(path, [old])
    with AlertStore(path, readonly=True) as ro:  # a reader before the writer upgraded it
        assert [(a.fingerprint, a.engine) for a in ro.current()] == [(old.fingerprint, "")]
    with AlertStore(path) as store:  # the writer (store-sync) opens it: the column is added
        store.apply_batch([episode("firing", T1, T1, "d2")], engines=["spark"])
        store.apply_batch([old], engines=["spark"])  # an old row seen again gains the engine
        engines = {a.labels["device_id"]: a.engine for a in store.current()}
    assert engines == {"d1": "spark", "d2": "spark"}
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
        assert conn.execute("SELECT COUNT(*) FROM transitions").fetchone()[0] == 2
    finally:
        conn.close()
    with AlertStore(path) as store:  # opening an upgraded file again changes nothing
        assert len(store.history()) == 2


def test_a_store_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    AlertStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=9")
    conn.commit()
    conn.close()
    with pytest.raises(ValueError, match="schema 9"):
        AlertStore(path)


@pytest.mark.slow
@pytest.mark.integration
def test_store_sync_records_the_engine_header_of_each_alert(broker: KafkaBroker, settings: Settings) -> None:
    faust, spark, both = (
        episode("firing", T0, T0, "d1"),
        episode("firing", T0, T0, "d2"),
        episode("firing", T1, T1, "d3"),
    )
    sent = [faust, spark, both, both, episode("firing", T2, T2, "d4")]
    headers = [None, [("engine", b"spark")], [("engine", b"spark")], None, [("engine", b"<b>x</b>")]]
    produce(broker.bootstrap, ALERTS, [(a.fingerprint.encode(), a.to_json()) for a in sent], headers)

    def shown(ro: AlertStore) -> bool:
        return ro.engines_of([both.alert_id]).get(both.alert_id) == "faust,spark" and len(ro.current()) == 4

    sync_until(settings, shown, timeout_s=30, poll_ms=100)
    with AlertStore(settings.store_path, readonly=True) as ro:
        engines = {a.labels["device_id"]: a.engine for a in ro.current()}
    assert engines == {"d1": "faust", "d2": "spark", "d3": "faust,spark", "d4": "unknown"}
