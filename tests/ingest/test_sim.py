"""The fleet and market simulators: reproducible, ordered, valid, and with the faults rules need;
the fleet over MQTT counts what it publishes."""

from __future__ import annotations

import itertools
import signal
from collections import Counter

import pytest
from prometheus_client import REGISTRY

from app.events import FINANCE, SENSORS, parse_ts
from ingest.sim.fleet import FleetConfig, distance_km, fleet_events, fleet_registry
from ingest.sim.mqtt_out import publish_mqtt
from ingest.sim.ticks import TickConfig, tick_events
from tests.ingest.conftest import Mosquitto

START = 1_700_000_000_000


def _fleet(n: int, **kw: object) -> list[dict[str, object]]:
    cfg = FleetConfig(**{"seed": 42, "start_ms": START, "sensors": 10, "vehicles": 3, **kw})  # type: ignore[arg-type]
    return list(itertools.islice(fleet_events(cfg), n))


def _ticks(n: int, **kw: object) -> list[dict[str, object]]:
    cfg = TickConfig(**{"seed": 7, "symbols": ("AAPL", "MSFT"), "start_ms": START, **kw})  # type: ignore[arg-type]
    return list(itertools.islice(tick_events(cfg), n))


def test_fleet_is_reproducible_ordered_and_valid() -> None:
    events = _fleet(5000)
    assert events == _fleet(5000)
    assert events != _fleet(5000, seed=43)
    stamps = [parse_ts(e["ts"]) for e in events]
    assert stamps == sorted(stamps)
    assert START <= stamps[0] < START + 10_000
    for e in events:
        assert SENSORS.validate(e).fields == e


def test_adding_a_device_leaves_the_others_streams_unchanged() -> None:
    small = [e for e in _fleet(3000, vehicles=0) if e["device_id"] == "sensor-003"]
    big = [e for e in _fleet(6000, vehicles=10) if e["device_id"] == "sensor-003"]
    n = min(len(small), len(big))
    assert n > 100
    assert small[:n] == big[:n]


def test_sensor_faults_and_battery_over_a_long_run() -> None:
    cfg = FleetConfig(seed=42, start_ms=START, sensors=20, vehicles=0)
    events = list(itertools.islice(fleet_events(cfg), 100_000))
    limits = {r["device_id"]: r["max_temp"] for r in fleet_registry(cfg)}
    over = Counter(e["device_id"] for e in events if e["temperature"] > limits[e["device_id"]])  # type: ignore[operator]
    assert len(over) >= 8, "spikes and overheats cross max_temp on many devices"
    by_device: dict[object, list[dict[str, object]]] = {}
    for e in events:
        by_device.setdefault(e["device_id"], []).append(e)
    stuck = gaps = 0
    for readings in by_device.values():
        temps = [r["temperature"] for r in readings]
        stuck += sum(1 for a, b, c in zip(temps, temps[1:], temps[2:], strict=False) if a == b == c)
        stamps = [parse_ts(r["ts"]) for r in readings]
        gaps += sum(1 for a, b in itertools.pairwise(stamps) if b - a > 2 * 10_000)
    assert stuck > 50, "stuck sensors repeat their value"
    assert gaps > 5, "dropouts leave real gaps"
    assert any(e["status"] == "low_battery" for e in events)


def test_vehicles_move_and_sometimes_leave_their_geofence() -> None:
    cfg = FleetConfig(seed=42, start_ms=START, sensors=0, vehicles=5)
    events = list(itertools.islice(fleet_events(cfg), 50_000))
    depots = {r["device_id"]: (r["depot_lat"], r["depot_lon"]) for r in fleet_registry(cfg)}
    outside = {
        e["device_id"] for e in events if distance_km(e["lat"], e["lon"], *depots[e["device_id"]]) > 5.0
    }  # type: ignore[arg-type]
    assert len(outside) >= 3
    assert {e["status"] for e in events} == {"moving", "idle"}
    moving = [e for e in events if e["status"] == "moving"]
    assert all(0 < e["speed_kmh"] < 80 for e in moving)  # type: ignore[operator]


def test_ticks_are_reproducible_with_consistent_trades() -> None:
    trades = _ticks(20_000)
    assert trades == _ticks(20_000)
    assert trades[:50] != _ticks(50, seed=8)
    stamps = [parse_ts(t["ts"]) for t in trades]
    assert stamps == sorted(stamps)
    assert len({t["trade_id"] for t in trades}) == len(trades)
    for t in trades:
        assert FINANCE.validate(t).fields == t
        assert t["amount"] == pytest.approx(t["price"] * t["size"], abs=0.01)  # type: ignore[operator]
    sides = Counter(t["side"] for t in trades)
    assert sides["buy"] > 5000 and sides["sell"] > 5000
    huge = [t for t in trades if t["size"] >= 5000]  # type: ignore[operator]
    assert huge, "occasional major trades"


def test_jumps_make_sudden_moves() -> None:
    calm = _ticks(20_000, jumps_per_day=0.0)
    jumpy = _ticks(20_000, jumps_per_day=100.0, jump_sigma=0.05)

    def biggest_move(trades: list[dict[str, object]]) -> float:
        prices = [t["price"] for t in trades if t["symbol"] == "AAPL"]
        return max(abs(b / a - 1) for a, b in itertools.pairwise(prices))  # type: ignore[operator]

    assert biggest_move(calm) < 0.01
    assert biggest_move(jumpy) > 0.05


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(60)
def test_the_fleet_over_mqtt_counts_what_it_published_and_what_waits_for_an_ack(mosquitto: Mosquitto) -> None:
    before = REGISTRY.get_sample_value("ingest_mqtt_published_total") or 0.0
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:  # publish_mqtt stops on these signals, as its process does
        code = publish_mqtt(_fleet(40), f"{mosquitto.host}:{mosquitto.port}", "fleet", None)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code == 0
    assert REGISTRY.get_sample_value("ingest_mqtt_published_total") == before + 40
    assert REGISTRY.get_sample_value("ingest_mqtt_pending") == 0
