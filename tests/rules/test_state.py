"""Rule state records: every field a kind writes is declared, format-1 states are migrated
on restore to the same alerts as a run that never stopped, and unknown formats are refused."""

from __future__ import annotations

import random
import typing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from app.events import SCHEMAS, Event
from app.rules import state as records
from app.rules.evaluator import DictStore, Engine
from app.rules.loader import RuleSet, load_rules
from app.rules.state import FORMAT, RENAMED_1, StateFormatError, record_kind
from app.rules.statekey import StateKey, is_clock_key
from app.tables import Tables

#: every stateful kind, each window type, event-time order (the conformance suite's rules)
KINDS = Path(__file__).parents[1] / "conformance" / "kinds.yaml"
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")


def events(n: int = 3_000, seed: int = 7) -> list[tuple[str, Event]]:
    """Sensors, access-log lines and bars, some out of order, some devices going silent."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible test input
    out: list[tuple[str, Event]] = []
    for i in range(n):
        minute = i * 0.5 - rng.choice([0, 0, 0, 0.5, 3])
        if i % 3 == 0:
            device = rng.choice(["machine-temp-1", "w-1", "w-2"] if i < n // 2 else ["w-1"])
            raw: dict[str, Any] = {
                "device_id": device,
                "ts": at(minute),
                "temperature": rng.choice([20, 96, 101, 130]),
            }
            raw["status"] = rng.choice(["ok", "ok", "maint"])
            out.append(("sensors", SCHEMAS["sensors"].validate(raw)))
        elif i % 3 == 1:
            raw = {"host": "www-1", "ts": at(minute), "client_ip": rng.choice(["10.0.0.1", "10.0.0.2"])}
            raw |= {
                "path": rng.choice(["/", "/x"]),
                "status": rng.choice([200, 404, 500]),
                "method": rng.choice(["GET", "POST", "PUT"]),
            }
            out.append(("logs", SCHEMAS["logs"].validate(raw)))
        else:
            price = 100 + rng.choice([-9, -1, 0, 1, 9])
            raw = {
                "symbol": "ACME",
                "ts": at(minute),
                "open": price,
                "high": price,
                "low": price,
                "close": price,
            }
            out.append(("finance", SCHEMAS["finance"].validate(raw)))
    return out


def tables() -> Tables:
    t = Tables()
    t.load_rows(
        "devices",
        [
            {"device_id": "machine-temp-1", "site": "a", "max_temp": 95.0},
            {"device_id": "w-1", "site": "b", "max_temp": 99.0},
        ],
    )
    return t


def engine(ruleset: RuleSet, stores: dict[str, DictStore]) -> Engine:
    return Engine(
        ruleset, partitions=2, tables=tables(), stores=lambda name: stores.setdefault(name, DictStore())
    )


def kind_of(ruleset: RuleSet, key: str, ordered: bool = True) -> str:
    """The record kind of the rule whose state ``key`` is (``ordered``: False for the
    kind an ``order: event_time`` rule wraps)."""
    r = next(x.rule for x in ruleset.rules if x.id == StateKey.rule_of(key))
    return record_kind(
        r.kind, None if r.window is None else r.window.type, ordered and r.order == "event_time"
    )


def to_format_1(st: dict[str, Any], kind: str, inner: str) -> dict[str, Any]:
    """What the previous build wrote for ``st``: short names, ``v`` the bare rule version."""

    def back(d: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
        old = {new: short for short, new in {**names, "g": "group", "due": "due", "p": "partition"}.items()}
        out = {old[k]: v for k, v in d.items() if k != "version"}
        if "w" in out:
            out["w"] = {s: {"a": w["accumulators"], "done": w["evaluated"]} for s, w in out["w"].items()}
        return out

    out = back(st, RENAMED_1[kind])
    if kind == "ordered" and out.get("s") is not None:
        out["s"] = back(out["s"], RENAMED_1[inner])
    out["v"] = st["version"].split("/", 1)[1]
    return out


def fields_of(record: type) -> set[str]:
    return set(typing.get_type_hints(record))


RECORDS = {
    "threshold": records.ThresholdState, "absence": records.AbsenceState, "change": records.ChangeState,
    "new_term": records.NewTermState, "sequence": records.SequenceState, "tumbling": records.TumblingState,
    "sliding": records.SlidingState, "session": records.SessionState, "ordered": records.OrderedState,
}  # fmt: skip


def run(ruleset: RuleSet, items: list[tuple[str, Event]], stores: dict[str, DictStore]) -> list[bytes]:
    eng = engine(ruleset, stores)
    return [a.to_json() for source, ev in items for a in eng.process(source, ev).alerts]


def test_every_field_a_kind_writes_is_declared_in_its_record() -> None:
    ruleset = load_rules([KINDS])
    stores: dict[str, DictStore] = {}
    run(ruleset, events(), stores)
    seen: set[str] = set()
    for store in stores.values():
        for key, st in store.items():
            if is_clock_key(key):
                assert set(st) <= fields_of(records.ClockState)
                continue
            kind = kind_of(ruleset, key)
            seen.add(kind)
            assert set(st) <= fields_of(RECORDS[kind]), (key, set(st) - fields_of(RECORDS[kind]))
            assert st["version"].startswith(f"{FORMAT}/")
    assert seen >= {"threshold", "absence", "change", "tumbling", "sequence", "ordered"}


@pytest.mark.parametrize("cut", [700, 1_500, 2_200])
def test_format_1_state_is_migrated_on_restore_to_the_alerts_of_a_run_that_never_stopped(cut: int) -> None:
    ruleset = load_rules([KINDS])
    items = events()
    whole = run(ruleset, items, {})
    before: dict[str, DictStore] = {}
    first = run(ruleset, items[:cut], before)
    old: dict[str, DictStore] = {}
    for name, store in before.items():  # as the previous build left its changelog
        data = {}
        for key, st in store.items():
            if is_clock_key(key):
                data[key] = st
                continue
            data[key] = to_format_1(st, kind_of(ruleset, key), kind_of(ruleset, key, ordered=False))
        old[name] = DictStore(data)
    assert any("v" in st for s in old.values() for _, st in s.items())
    second = engine(ruleset, old)
    for streams in second.streams.values():
        for stream in streams:
            stream.evaluator.restore(stream.evaluator.store.items())  # type: ignore[attr-defined]
    rest = [a.to_json() for source, ev in items[cut:] for a in second.process(source, ev).alerts]
    assert first + rest == whole
    assert all("v" not in st for s in old.values() for k, st in s.items() if not is_clock_key(k))


def test_a_state_of_an_unknown_format_is_refused_with_how_to_delete_it() -> None:
    ruleset = load_rules([KINDS])
    stores: dict[str, DictStore] = {}
    run(ruleset, events(300), stores)
    name, store = next((n, s) for n, s in stores.items() if any(not is_clock_key(k) for k, _ in s.items()))
    st = next(st for k, st in store.items() if not is_clock_key(k))
    st["version"] = "9/" + st["version"].split("/", 1)[1]  # written by a newer build
    again = engine(ruleset, {name: store})
    (evaluator,) = [s.evaluator for streams in again.streams.values() for s in streams if s.name == name]
    with pytest.raises(
        StateFormatError, match="delete this state: the rule worker: stop it, delete its changelog"
    ):
        evaluator.restore(store.items())
