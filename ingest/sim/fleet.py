"""A seeded, reproducible IoT fleet: fixed sensors and vehicles -> sensors events.

Given the same :class:`FleetConfig` (seed, sizes, start time, interval) the
generator yields exactly the same events, in event-time order. Each device
draws from its own generator seeded with ``"{seed}/{device_id}"``, so adding a
device does not change the others' streams.

Every ``interval_s`` of event time each device reports once, at its own fixed
offset inside the interval (drawn from its own generator), so events come in
``ts`` order (ties in device order).

- **Sensors** (``sensor-001``...; ``kind`` ``thermometer``) at sites
  (``site-1``...; five sensors per site): temperature = base + slow drift
  (random walk) + daily cycle + noise; humidity; a battery that drains and is
  replaced when nearly empty (``status`` ``low_battery`` below 15 %). Faults
  start at random: **stuck** (the same value repeated), **spike** (one reading
  25-50 degrees high), **dropout** (no events at all for a while: a real
  absence), **overheat** (a ramp well above the device's ``max_temp``, then
  recovery). A flat battery also silences the device until it is replaced.
- **Vehicles** (``vehicle-01``...; ``kind`` ``vehicle``) drive between random
  waypoints around their depot at 20-60 km/h with ``lat``, ``lon``,
  ``speed_kmh``, ``heading`` (degrees from north), ``battery`` and ``status``
  (``moving``/``idle``). About one leg in twenty goes 6-12 km out, beyond the
  ``geofence_km`` (5 km) depot geofence, and comes back.

:func:`fleet_registry` gives the matching device-registry rows (site, owner,
location or depot, ``max_temp``, ``geofence_km``) for ``tables.devices``.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from app.events import format_ts
from ingest.model import Record

logger = logging.getLogger(__name__)

BASE_LAT, BASE_LON = 48.1374, 11.5755  # where the demo fleet lives
KM_PER_DEG = 111.32
FAULT_P = 0.003  # per sensor reading
LEAVE_P = 0.05  # per vehicle leg


@dataclass(frozen=True)
class FleetConfig:
    """The whole description of a simulated fleet; equal configs give equal events."""

    seed: int
    start_ms: int
    sensors: int = 20
    vehicles: int = 5
    interval_s: float = 10.0
    geofence_km: float = 5.0


def _rng(seed: int, device: str) -> random.Random:
    return random.Random(f"{seed}/{device}")  # noqa: S311 - simulation, not security


def _offset(lat: float, lon: float, km: float, bearing_deg: float) -> tuple[float, float]:
    b = math.radians(bearing_deg)
    dlat = km * math.cos(b) / KM_PER_DEG
    return lat + dlat, lon + km * math.sin(b) / (KM_PER_DEG * math.cos(math.radians(lat)))


def distance_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle (haversine) distance in km."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * 6371.0088 * math.asin(math.sqrt(a))


def _bearing(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    y = (lon2 - lon1) * math.cos(math.radians(lat1))
    return math.degrees(math.atan2(y, lat2 - lat1)) % 360


class _Sensor:
    def __init__(self, cfg: FleetConfig, index: int) -> None:
        self.id = f"sensor-{index + 1:03d}"
        self.site = f"site-{index // 5 + 1}"
        r = self.rng = _rng(cfg.seed, self.id)
        self.base, self.phase = r.uniform(18.0, 24.0), r.uniform(0, 2 * math.pi)
        self.max_temp = round(self.base + 12.0, 1)
        self.lat, self.lon = _offset(BASE_LAT, BASE_LON, 2.0 + 3.0 * (index // 5), 72.0 * (index // 5))
        self.drift, self.battery, self.drain = 0.0, r.uniform(40.0, 100.0), r.uniform(0.002, 0.01)
        self.fault, self.fault_left, self.last = "", 0, self.base

    def step(self, ts_ms: int) -> Record | None:
        r = self.rng
        self.drift = max(-5.0, min(5.0, self.drift + r.gauss(0, 0.01)))
        self.battery = max(0.0, self.battery - self.drain)
        if self.battery < 5.0 and r.random() < 0.05:
            self.battery = 100.0
        if not self.fault and r.random() < FAULT_P:
            self.fault = r.choices(("stuck", "spike", "dropout", "overheat"), (40, 25, 20, 15))[0]
            self.fault_left = {"stuck": r.randint(10, 60), "spike": 1, "dropout": r.randint(5, 60)}.get(
                self.fault, r.randint(20, 40)
            )
        day = math.sin(2 * math.pi * (ts_ms / 86_400_000) + self.phase)
        temp = self.base + self.drift + 1.5 * day + r.gauss(0, 0.15)
        humidity = max(0.0, min(100.0, 45.0 + 10.0 * day + r.gauss(0, 1.0)))
        fault, ramp = self.fault, 0
        if fault:
            self.fault_left -= 1
            ramp = 40 - self.fault_left if fault == "overheat" else 0
            if self.fault_left <= 0:
                self.fault = ""
        if fault == "dropout" or self.battery <= 0.0:
            return None
        if fault == "stuck":
            temp = self.last
        elif fault == "spike":
            temp += r.uniform(25.0, 50.0)
        elif fault == "overheat":
            temp += 0.8 * ramp
        self.last = temp
        return {
            "device_id": self.id,
            "ts": format_ts(ts_ms),
            "kind": "thermometer",
            "temperature": round(temp, 2),
            "humidity": round(humidity, 1),
            "battery": round(self.battery, 2),
            "status": "low_battery" if self.battery < 15.0 else "ok",
        }


class _Vehicle:
    def __init__(self, cfg: FleetConfig, index: int) -> None:
        self.id = f"vehicle-{index + 1:02d}"
        r = self.rng = _rng(cfg.seed, self.id)
        self.interval_h = cfg.interval_s / 3600.0
        self.depot = _offset(BASE_LAT, BASE_LON, r.uniform(0.0, 10.0), r.uniform(0, 360))
        self.lat, self.lon = self.depot
        self.battery, self.idle, self.speed = r.uniform(60.0, 100.0), r.randint(0, 5), 0.0
        self.target, self.home_next = self.depot, False

    def _new_leg(self) -> None:
        r = self.rng
        if self.home_next:
            self.target, self.home_next = self.depot, False
        else:
            far = r.random() < LEAVE_P
            km = r.uniform(6.0, 12.0) if far else r.uniform(0.2, 4.0)
            self.target = _offset(*self.depot, km, r.uniform(0, 360))
            self.home_next = far or r.random() < 0.3
        self.speed = r.uniform(20.0, 60.0)

    def step(self, ts_ms: int) -> Record:
        r = self.rng
        heading = _bearing(self.lat, self.lon, *self.target)
        if self.idle > 0:
            self.idle -= 1
            speed = 0.0
            if self.idle == 0:
                self._new_leg()
            if distance_km(self.lat, self.lon, *self.depot) < 0.5:
                self.battery = min(100.0, self.battery + 1.0)
        else:
            speed = max(0.0, self.speed + r.gauss(0, 3.0))
            left = distance_km(self.lat, self.lon, *self.target)
            step = min(left, speed * self.interval_h)
            self.lat, self.lon = _offset(self.lat, self.lon, step, heading)
            self.battery = max(0.0, self.battery - 0.02)
            if step >= left:
                self.idle = r.randint(1, 6)
        return {
            "device_id": self.id,
            "ts": format_ts(ts_ms),
            "kind": "vehicle",
            "lat": round(self.lat, 6),
            "lon": round(self.lon, 6),
            "speed_kmh": round(speed, 1),
            "heading": round(heading, 1),
            "battery": round(self.battery, 2),
            "status": "moving" if speed > 0 else "idle",
        }


def fleet_events(cfg: FleetConfig) -> Iterator[Record]:
    """The fleet's events, endless, in ``ts`` order; the caller bounds them."""
    devices: list[_Sensor | _Vehicle] = [_Sensor(cfg, i) for i in range(cfg.sensors)]
    devices += [_Vehicle(cfg, i) for i in range(cfg.vehicles)]
    if not devices:
        return
    interval_ms = max(1, int(cfg.interval_s * 1000))
    schedule = sorted(
        ((_rng(cfg.seed, f"{d.id}/offset").randrange(interval_ms), i, d) for i, d in enumerate(devices)),
        key=lambda item: item[:2],
    )
    tick = 0
    while True:
        base = cfg.start_ms + tick * interval_ms
        for offset, _i, device in schedule:
            record = device.step(base + offset)
            if record is not None:
                yield record
        tick += 1


def fleet_registry(cfg: FleetConfig) -> list[dict[str, object]]:
    """Device-registry rows for every simulated device (``tables.devices`` values)."""
    rows: list[dict[str, object]] = []
    for i in range(cfg.sensors):
        s = _Sensor(cfg, i)
        rows.append({"device_id": s.id, "site": s.site, "owner": "plant-ops", "kind": "thermometer",
                     "lat": round(s.lat, 6), "lon": round(s.lon, 6), "max_temp": s.max_temp})  # fmt: skip
    for i in range(cfg.vehicles):
        v = _Vehicle(cfg, i)
        rows.append({"device_id": v.id, "site": "depot", "owner": "logistics", "kind": "vehicle",
                     "depot_lat": round(v.depot[0], 6), "depot_lon": round(v.depot[1], 6),
                     "geofence_km": cfg.geofence_km, "battery_min": 20.0})  # fmt: skip
    return rows
