"""The console's store queries: matcher filters, detail, silence preview, devices, rates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.console.queries import ConsoleQueries, silence_preview, split_matchers
from app.storage.alert_store import AlertStore
from tests.console_helpers import make_alert, seed


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "alerts.sqlite3"
    seed(path)
    return path


def test_split_matchers_takes_commas_spaces_braces_and_quoted_commas() -> None:
    ms = split_matchers('{severity="critical", device_id=~"pump-.*" team != "a, b"}')
    assert [str(m) for m in ms] == ['severity="critical"', 'device_id=~"pump-.*"', 'team!="a, b"']
    assert split_matchers("  ") == ()
    with pytest.raises(ValueError, match="expected a matcher"):
        split_matchers("severity critical")


def test_filter_by_severity_regex_and_alertname(store: Path) -> None:
    with ConsoleQueries(store) as q:
        page = q.alerts(split_matchers('severity="critical", device_id=~"pump-.*"'))
        assert [a.labels["device_id"] for a in page.rows] == ["pump-7"] and page.total == 1
        page = q.alerts(split_matchers('alertname="vehicle-geofence"'))
        assert [a.labels["device_id"] for a in page.rows] == ["vehicle-01"]
        page = q.alerts(split_matchers('device_id!~"pump-.*"'))
        assert sorted(a.labels["device_id"] for a in page.rows) == ["vehicle-01"]  # fan-1 is resolved
        page = q.alerts(split_matchers('device_id!~"pump-.*"'), ["resolved"])
        assert [a.labels["device_id"] for a in page.rows] == ["fan-1"]
        assert q.alerts(split_matchers('nolabel=""')).total == 3  # absent matches as ""


def test_detail_transitions_notifications_and_acks(store: Path) -> None:
    with ConsoleQueries(store) as q:
        (pump,) = q.alerts(split_matchers('device_id="pump-7"')).rows
        ts = q.transitions(pump.rule_id, pump.fingerprint)
        assert [t.status for t in ts] == ["pending", "firing"]
        (sent,) = q.notifications_for([t.alert_id for t in ts])
        assert (sent["webhook_id"], sent["receiver"], sent["status"]) == ("wh-123", "ops", "dead")
        assert sent["updated_at"] == "2024-05-01T10:00:30.000Z"  # stored as Unix seconds
        assert q.acks_of(pump.fingerprint) == []


def test_silence_preview_lists_the_active_alerts_it_would_mute(store: Path) -> None:
    with ConsoleQueries(store) as q:
        assert silence_preview(q, ()).total == 0
        page = silence_preview(q, split_matchers('team="plant-ops", device_id=~"pump-.*|fan-.*"'))
        assert sorted(a.labels["device_id"] for a in page.rows) == ["pump-7", "pump-9"]


def test_devices_have_their_worst_severity_and_last_position(store: Path) -> None:
    with ConsoleQueries(store) as q:
        dev = q.devices()
    assert dev["pump-7"]["severity"] == "critical" and dev["fan-1"]["severity"] is None
    assert (dev["vehicle-01"]["lat"], dev["vehicle-01"]["lon"]) == (48.2, 11.7)


def test_rate_counts_transitions_recorded_in_the_last_hour(tmp_path: Path) -> None:
    now = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    clock = iter([now - timedelta(minutes=90), now - timedelta(minutes=5)])
    path = tmp_path / "a.sqlite3"
    with AlertStore(path, now=lambda: next(clock)) as store:
        store.apply(make_alert("old", "firing"))
        store.apply(make_alert("new", "firing"))
    with ConsoleQueries(path) as q:
        assert q.rate(now) == [{"minute": "2030-01-01T11:55", "status": "firing", "n": 1}]
        assert q.rule_activity()["machine-overheat"].by_status == {"firing": 2}
