"""The fleet on the console's map: the device registry's rows (positions, depots, geofences)
joined with each device's alert state from the store.

The registry is the CSV (or YAML) that ``ingest registry devices`` loads into
``tables.devices``: ``APP_REGISTRY_FILE``, default ``APP_DATA_DIR/fleet-devices.csv`` (what
``make run``'s simulator writes). A device's position is the last ``lat``/``lon`` an alert
of it carried (a vehicle outside its geofence), else its registry ``lat``/``lon`` (a fixed
sensor), else its depot.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: RGBA per state: the worst active severity, or "ok"
COLOURS: dict[str, list[int]] = {
    "critical": [220, 38, 38, 230],
    "error": [234, 88, 12, 230],
    "warning": [245, 158, 11, 230],
    "info": [59, 130, 246, 230],
    "ok": [22, 163, 74, 230],
}


@dataclass(frozen=True)
class DevicePoint:
    device_id: str
    kind: str
    lat: float
    lon: float
    state: str  # a severity, or "ok"
    active: int
    depot: tuple[float, float] | None
    geofence_km: float | None


def registry_path(data_dir: Path, env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env["APP_REGISTRY_FILE"]) if env.get("APP_REGISTRY_FILE") else data_dir / "fleet-devices.csv"


#: problems of the registry file logged per read; the map shows the valid rows meanwhile
MAX_LOGGED_PROBLEMS = 20


def load_registry(path: Path) -> list[dict[str, Any]]:
    """The registry's valid rows, typed by the devices table's schema; [] when the file is
    missing or unreadable. Each bad row is logged (file, line and column, as
    ``ingest registry`` names it) and left out: one bad row emptied the whole map before."""
    from app.tables import table_file_rows

    if not path.exists():
        return []
    try:
        rows, problems = table_file_rows("devices", path)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        logger.warning("registry %s: %s", path, exc)
        return []
    for problem in problems[:MAX_LOGGED_PROBLEMS]:
        logger.warning("registry row left off the map: %s", problem)
    if len(problems) > MAX_LOGGED_PROBLEMS:
        logger.warning("registry %s: %d more problems not shown", path, len(problems) - MAX_LOGGED_PROBLEMS)
    return rows


def _num(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, int | float) else None


def fleet(registry: list[dict[str, Any]], states: Mapping[str, Mapping[str, Any]]) -> list[DevicePoint]:
    """One point per registry device that has a position."""
    points = []
    for row in registry:
        dev = row["device_id"]
        st = states.get(dev, {})
        depot = (_num(row, "depot_lat"), _num(row, "depot_lon"))
        home = depot if None not in depot else None
        lat, lon = st.get("lat"), st.get("lon")
        if lat is None or lon is None:
            lat, lon = _num(row, "lat"), _num(row, "lon")
        if (lat is None or lon is None) and home is not None:
            lat, lon = home
        if lat is None or lon is None:
            continue
        points.append(
            DevicePoint(
                dev, str(row.get("kind", "")), float(lat), float(lon), st.get("severity") or "ok",
                int(st.get("active", 0)), home if home is None else (float(home[0]), float(home[1])),  # type: ignore[arg-type]
                _num(row, "geofence_km"),
            )
        )  # fmt: skip
    return points
