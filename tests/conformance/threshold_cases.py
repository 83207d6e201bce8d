"""The input of the threshold conformance suite (``test_threshold``), shared with the other
conformance and Spark tests: the rule file, the real and crafted events, and the alert ids of
each fingerprint."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

from app.alerts import Alert
from app.events import format_ts
from ingest.adapters.apache import apache_events
from ingest.adapters.nab import nab_events
from ingest.adapters.ohlc import ohlc_events
from tests.conftest import APACHE_LOG, NAB_MACHINE_TEMP, require_dataset

RULES = Path(__file__).with_name("rules.yaml")

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def at(minutes: float) -> str:
    """RFC 3339 as the converters and the alerts write it."""
    return format_ts(int((T0 + timedelta(minutes=minutes)).timestamp() * 1000))


def crafted() -> Iterator[dict[str, Any]]:
    """Sensor events that stress ordering: every case is commented with what it tests."""
    hot = [{"device_id": "crafted-1", "ts": at(m), "temperature": 101.0 + m} for m in range(9)]
    yield from hot[:8]
    yield {"device_id": "crafted-1", "ts": at(3), "temperature": 50.0}  # late: must not end the streak
    yield hot[8]
    yield hot[8]  # exact duplicate
    yield {"device_id": "crafted-1", "ts": at(12), "temperature": 105.0}  # fires (12 minutes held)
    yield {"device_id": "crafted-1", "ts": at(12), "temperature": 95.0}  # same time: resolves
    yield {"device_id": "crafted-1", "ts": at(13), "temperature": 120.0, "status": "maintenance"}
    yield {"device_id": "crafted-1", "ts": at(14), "temperature": None}  # NULL is not TRUE
    for m in (30, 29, 31, 28, 40, 35, 41):  # out of order: older ones are late
        yield {"device_id": "crafted-2", "ts": at(m), "temperature": 5.0 if m % 2 else 95.0}
    for i, (lat, lon, speed, kind) in enumerate(
        [
            (52.52, 13.405, 12.4, "van"),
            (52.53, 13.41, 9.5, "van"),  # round(9.5) = 10: half up
            (52.50, 13.40, 10.0, None),
            (None, 13.40, 30.0, "van"),
            (48.137, 11.575, 80.0, "van"),
            (52.0, 12.0, 80.0, "truck"),
            (48.137, 11.575, 80.0, "truck"),
        ]
    ):
        yield {"device_id": "v-1", "ts": at(50 + i), "lat": lat, "lon": lon, "speed_kmh": speed, "kind": kind}


INVALID = [
    b"{not json at all",
    b'{"device_id": "crafted-1", "ts": "2024-01-01T00:00:00Z", "colour": "red"}',
    b'{"device_id": "crafted-1", "ts": "2024-01-01T00:00:00", "temperature": 1}',
    b'{"host": "www-1", "ts": "2024-01-01T00:00:00Z", "status": "five hundred"}',
    b'{"nobody": 1}',
]


def input_lines() -> list[bytes]:
    nab = nab_events(str(require_dataset(NAB_MACHINE_TEMP)), device="machine-temp-1", field="temperature")
    apache = apache_events(str(require_dataset(APACHE_LOG)), host="www-1")
    # the first 12,000 NAB rows hold overheat and cold episodes and the real 55-minute jump back (row 10151)
    lines = [orjson.dumps(r) for r in islice(nab, 12_000) if isinstance(r, dict)]
    for r in apache:  # the real log's truncated line goes in as it is: both engines must skip it
        lines.append(orjson.dumps(r) if isinstance(r, dict) else r.raw)
    for symbol in ("AAPL", "IBM"):
        lines += [orjson.dumps(r) for r in ohlc_events(symbol) if isinstance(r, dict)]
    lines += [orjson.dumps(e) for e in crafted()]
    return lines[:5000] + INVALID[:2] + lines[5000:20000] + INVALID[2:] + lines[20000:]


def by_fingerprint(alerts: list[Alert]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for a in alerts:
        out.setdefault(a.fingerprint, []).append(a.alert_id)
    return out
