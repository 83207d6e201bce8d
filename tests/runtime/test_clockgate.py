"""The clock gate: a shared clock that starts once every producer on it is ready
(app.runtime.clockgate), on an injected wall clock."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import orjson
import pytest

from app.errors import ConfigError
from app.events import format_ts
from app.eventtime import Clock
from app.runtime.clockgate import ClockGate, GateSpec, leave, read_spec, wait_async, wait_sync, write_gate

T0 = 1_386_676_800_000  # 2013-12-10T12:00:00Z


def _gate(tmp_path: Path, *parties: str) -> Path:
    path = tmp_path / "gate.json"
    write_gate(path, GateSpec(T0, parties, lead_s=0.5, timeout_s=30.0, others={"speedup": 3000.0}))
    return path


def test_the_clock_starts_after_the_last_party_is_ready_the_same_for_each(tmp_path: Path) -> None:
    path = _gate(tmp_path, "replay", "fleet")
    replay, fleet = ClockGate(path, "replay"), ClockGate(path, "fleet")
    replay.arrive(100.0)
    assert replay.poll(110.0) is None  # the fleet's bridge is still coming up
    fleet.arrive(112.0)
    assert replay.poll(112.1) == Clock(112.5, T0)
    assert fleet.poll(112.2) == Clock(112.5, T0)
    # recorded in the file, the writer's own keys kept: a restarted party reads it there
    spec = read_spec(path)
    assert (spec.wall_s, spec.others) == (112.5, {"speedup": 3000.0})
    fleet.arrive(200.0)
    assert fleet.poll(200.0) == Clock(112.5, T0)


def test_a_party_not_ready_in_time_is_not_waited_for_and_cannot_move_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _gate(tmp_path, "replay", "fleet", "ticks")
    replay, fleet, ticks = (ClockGate(path, p) for p in ("replay", "fleet", "ticks"))
    replay.arrive(100.0)
    ticks.arrive(101.0)
    assert replay.poll(129.9) is None
    with caplog.at_level(logging.WARNING):
        assert replay.poll(130.0) == Clock(130.5, T0)
    assert f"{path}: fleet not ready 30 s after the first party" in caplog.text
    # had the others looked before the start was recorded, the late party's time changes nothing
    write_gate_keeping_ready(path)
    fleet.arrive(140.0)
    assert ticks.poll(140.1) == Clock(130.5, T0)


def write_gate_keeping_ready(path: Path) -> None:
    record = orjson.loads(path.read_bytes())
    del record["wall_s"]
    path.write_bytes(orjson.dumps(record))


def test_a_new_gate_forgets_the_last_ones_ready_parties_and_start(tmp_path: Path) -> None:
    path = _gate(tmp_path, "replay", "fleet")
    for party in ("replay", "fleet"):
        ClockGate(path, party).arrive(100.0)
    assert ClockGate(path, "replay").poll(100.0) == Clock(100.5, T0)
    path = _gate(tmp_path, "replay", "fleet")
    assert read_spec(path).wall_s is None
    ClockGate(path, "replay").arrive(500.0)
    assert ClockGate(path, "replay").poll(501.0) is None


def test_a_party_with_nothing_to_publish_is_not_waited_for(tmp_path: Path) -> None:
    path = _gate(tmp_path, "replay", "ticks")
    leave(ClockGate(path, "replay"))  # its replay already reached its limit
    leave(Clock(1.0, T0))  # a fixed clock, or none, has nobody to tell
    leave(None)
    stop = threading.Event()
    clock = wait_sync(ClockGate(path, "ticks"), stop)
    assert clock is not None and clock.event_ms == T0


def test_waiting_ends_with_the_clock_or_at_stop(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _gate(tmp_path, "replay", "fleet")

    async def both() -> tuple[Clock | None, Clock | None]:
        stop = asyncio.Event()
        fleet = asyncio.create_task(wait_async(ClockGate(path, "fleet"), stop))
        await asyncio.sleep(0.1)
        assert not fleet.done()  # it waits for the replay
        replay = await asyncio.wait_for(wait_async(ClockGate(path, "replay"), stop), 5)
        return await asyncio.wait_for(fleet, 5), replay

    with caplog.at_level(logging.INFO, logger="app.runtime.clockgate"):
        fleet, replay = asyncio.run(both())
    assert fleet is not None and fleet == replay
    due = format_ts(int(fleet.wall_s * 1000))
    assert f"{path}: fleet ready; event time 2013-12-10T12:00:00.000Z is due at {due}" in caplog.text
    lonely = _gate(tmp_path, "replay", "fleet")
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    assert wait_sync(ClockGate(lonely, "fleet"), stop) is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such clock gate"),
        (b"{not json", "cannot read the clock gate"),
        (
            b'{"event_ms": 1, "parties": [], "lead_s": 0.5, "timeout_s": 30}',
            "parties (a non-empty list of names)",
        ),
        (b'{"event_ms": "noon", "parties": ["a"], "lead_s": 0.5, "timeout_s": 30}', "expected event_ms"),
        (b"[1, 2]", "expected event_ms"),
    ],
)
def test_a_file_that_is_not_a_gate_is_refused_by_name(
    tmp_path: Path, content: bytes | None, expected: str
) -> None:
    path = tmp_path / "gate.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        ClockGate(path, "a").poll(1.0)
    assert str(err.value).startswith(f"{path}: ")
    assert expected in str(err.value) and "remove it to start the clock afresh" in str(err.value)


def test_a_broken_ready_file_is_refused_by_name(tmp_path: Path) -> None:
    path = _gate(tmp_path, "replay")
    ClockGate(path, "replay").ready_path("replay").write_text('{"ready": 1}')
    with pytest.raises(ConfigError, match=r"gate\.json\.replay\.ready: expected \{\"ready_s\""):
        ClockGate(path, "replay").poll(1.0)
