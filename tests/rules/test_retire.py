"""The alerts of rules that no longer run end (:mod:`app.rules.retire`): each open episode of a
removed or edited rule gets the transition that ends it, with the id the evaluator gives that
transition, and its state goes. On the evaluator's own stores: no broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.alerts import Alert, alert_id
from app.events import LOGS, Event
from app.rules.evaluator import DictStore, Engine
from app.rules.loader import RuleSet
from app.rules.retire import ANNOTATION, is_record_key, record_key, sweep
from app.rules.state import stamp
from tests.rules.helpers import HOT, rules, sensor


def log(minute: int, ip: str = "1.2.3.4", **fields: object) -> tuple[str, Event]:
    """A logs event of ``ip`` at ``minute`` minutes after 2024-01-01."""
    ts = f"2024-01-01T{minute // 60:02d}:{minute % 60:02d}:00Z"
    return "logs", LOGS.validate({"ts": ts, "host": "www", "client_ip": ip, **fields})


def engine(rs: RuleSet, store: DictStore) -> Engine:
    """An engine whose streams all keep their states in ``store``."""
    return Engine(rs, stores=lambda _name: store)


def open_episodes(alerts: list[Alert]) -> dict[str, Alert]:
    """The last transition per alert, of those still open (firing, pending, no_data)."""
    last: dict[str, Alert] = {}
    for a in alerts:
        last[a.fingerprint] = a
    return {fp: a for fp, a in last.items() if a.status in ("firing", "pending", "no_data")}


def known(rs: RuleSet) -> dict[tuple[str, str], object]:
    return {(r.id, stamp(r.version)): r.facts for r in rs.rules}


KINDS = {
    "threshold firing": (HOT, [sensor(0, 101.0), sensor(1, 102.0, "d2"), sensor(2, 50.0, "d3")]),
    "threshold pending": (
        HOT + "    consecutive: 3\n",
        [sensor(0, 101.0), sensor(1, 101.0), sensor(2, 101.0, "d2")],
    ),
    "tumbling window": (
        """  - id: hourly
    source: sensors
    group_by: [device_id]
    window: {type: tumbling, size: 1h}
    aggregate: {avg_t: avg(temperature)}
    having: avg_t > 90
    severity: info
""",
        [sensor(m, 95.0) for m in (0, 20, 40, 70)],
    ),
    "change": (
        """  - id: flips
    source: logs
    where: status >= 400
    change: status
    group_by: [host]
    resolve_after: 2h
    severity: warning
""",
        [log(0, status=500), log(1, status=503)],
    ),
    "absence": (
        """  - id: silent
    source: sensors
    group_by: [device_id]
    absent_for: 30m
    severity: critical
""",
        [sensor(0, 1.0, "d1"), *[sensor(m, 1.0, "d2") for m in range(10, 71, 10)]],
    ),
    "ordered threshold with no_data": (
        """  - id: quiet-ip
    source: logs
    where: status >= 400
    group_by: [client_ip]
    for: 20s
    no_data: {after: 5m, state: no_data}
    allowed_lateness: 10m
    order: event_time
    severity: warning
""",
        [log(0, status=500), log(1, "5.6.7.8", status=500), log(30, "5.6.7.8", status=200)],
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_open_episode_of_a_removed_rule_ends_with_the_evaluators_id(tmp_path: Path, kind: str) -> None:
    """Whatever the kind, each open alert gets one ending transition (firing: resolved;
    pending, no_data: inactive) with its labels, ``starts_at`` and the id ``alert_id`` gives
    that transition; a quiet state goes with nothing said; nothing of the rule stays."""
    body, events = KINDS[kind]
    rs = rules(tmp_path, body)
    store = DictStore()
    out = engine(rs, store).process_batch(events).alerts
    opened = open_episodes(out)
    assert opened, "the events leave an alert open"
    done = sweep(store, 0, [], known(rs))  # type: ignore[arg-type]
    ended = {a.fingerprint: a for a in done.alerts}
    assert len(done.alerts) == len(ended) == len(opened)
    for fp, was in opened.items():
        end = ended[fp]
        status = "resolved" if was.status == "firing" else "inactive"
        assert (end.status, end.starts_at, end.labels, end.severity) == (
            status,
            was.starts_at,
            was.labels,
            was.severity,
        )
        assert end.alert_id == alert_id(was.rule_id, fp, was.starts_at, status)
        assert end.ends_at is not None and end.ends_at >= end.starts_at
        assert "no longer runs" in end.annotations[ANNOTATION]
    assert not [k for k in store.data if not k.startswith("\x00")]  # every state of the rule went
    assert not [k for k in store.data if is_record_key(k)]
    assert done.unended == []


def test_the_resolution_is_the_one_the_rule_would_have_given(tmp_path: Path) -> None:
    """The same id, fingerprint and starts_at as the resolution a cooler reading would have
    brought, the annotations rendered from the group (no event at hand), ``ends_at`` the
    partition's clock."""
    rs = rules(tmp_path, HOT)
    would = DictStore()
    (fired,) = engine(rs, would).process_batch([sensor(0, 101.0), sensor(3, 102.0)]).alerts
    (resolved,) = engine(rs, would).process_batch([sensor(5, 50.0)]).alerts
    store = DictStore()
    engine(rs, store).process_batch([sensor(0, 101.0), sensor(3, 102.0)])
    (end,) = sweep(store, 0, [], known(rs)).alerts  # type: ignore[arg-type]
    assert (end.alert_id, end.fingerprint, end.starts_at) == (
        resolved.alert_id,
        fired.fingerprint,
        fired.starts_at,
    )
    assert end.ends_at == end.event_ts == "2024-01-01T00:03:00.000Z"  # the last event's time
    assert end.annotations["summary"] == "d1 at null" and end.values == {"retired": True}


def test_after_a_restart_the_rule_record_stands_in_for_the_rule(tmp_path: Path) -> None:
    """A worker started after the rule file changed has no old rule in memory: the sweep of
    the rules that ran wrote their record beside the states, and the next sweep, with the
    edited rule, ends the old version's alert from it (annotated as an edit), keeps the
    record of the rule as it runs now, and leaves the edited rule's new states alone."""
    old = rules(tmp_path, HOT)
    store = DictStore()
    assert sweep(store, 0, old.rules).alerts == []  # the worker's start: records written
    (record,) = [v for k, v in store.data.items() if is_record_key(k)]
    assert record["rule_id"] == "hot" and record["version"] == stamp(old.rules[0].version)
    (fired,) = engine(old, store).process_batch([sensor(0, 101.0)]).alerts
    assert sweep(store, 0, old.rules).alerts == []  # the rule still runs: nothing ends

    edited = rules(tmp_path, HOT.replace("> 100", "> 200"))
    done = sweep(store, 0, edited.rules)  # a new process: nothing known but the store
    (end,) = done.alerts
    assert (end.status, end.alert_id) == (
        "resolved",
        alert_id("hot", fired.fingerprint, fired.starts_at, "resolved"),
    )
    assert "edited" in end.annotations[ANNOTATION]
    assert store.data[record_key("hot", 0)]["version"] == stamp(edited.rules[0].version)
    (new,) = engine(edited, store).process_batch([sensor(9, 250.0)]).alerts
    assert new.status == "firing" and new.rule_version == edited.rules[0].version
    assert sweep(store, 0, edited.rules).alerts == []


def test_a_state_with_no_record_is_deleted_and_named(tmp_path: Path) -> None:
    """States written before rule records existed, of a rule gone after a restart: their
    alert cannot be built (no labels to hash), so they are named for a resolve by hand."""
    rs = rules(tmp_path, HOT)
    store = DictStore()
    engine(rs, store).process_batch([sensor(0, 101.0), sensor(0, 101.0, "d2"), sensor(1, 50.0, "d2")])
    done = sweep(store, 0, [])
    assert done.alerts == [] and done.deleted == 2 and done.unended == ["hot\x1fd1"]
    assert store.data == {}


def test_only_the_partition_swept_is_touched(tmp_path: Path) -> None:
    rs = rules(tmp_path, HOT)
    store = DictStore()
    eng = Engine(rs, stores=lambda _name: store, partitions=4)
    events: list[tuple[str, Event]] = [sensor(0, 101.0, f"d{i}") for i in range(8)]
    out = eng.process_batch(events).alerts
    parts = {k: v["partition"] for k, v in store.data.items()}
    one = parts["hot\x1fd0"]
    done = sweep(store, one, [], known(rs))  # type: ignore[arg-type]
    mine = [k for k, p in parts.items() if p == one]
    assert sorted(f"hot\x1f{a.labels['device_id']}" for a in done.alerts) == sorted(mine)
    assert sorted(store.data) == sorted(k for k, p in parts.items() if p != one)
    assert len(out) == 8 and 0 < len(mine) < 8
