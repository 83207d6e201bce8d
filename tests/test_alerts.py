"""The alert record: its fingerprint, remembered per label set, and its hand-written constructor."""

from __future__ import annotations

import orjson
import pytest

import app.alerts as alerts
from app.alerts import Alert, fingerprint
from app.backtest import backtest_line

LABELS = {"alertname": "t-9", "severity": "warning", "device_id": "m1"}


def test_fingerprint_is_the_hash_of_the_sorted_labels_whatever_their_order() -> None:
    # the value the function gave before it remembered anything (ids in stores depend on it)
    assert fingerprint(LABELS) == "320244fd9c62d047"
    reordered = dict(reversed(list(LABELS.items())))
    assert fingerprint(reordered) == "320244fd9c62d047"
    assert fingerprint({**LABELS, "device_id": "m2"}) != "320244fd9c62d047"
    assert fingerprint({**LABELS, "device_id": "m1"}) == "320244fd9c62d047"


def test_remembered_fingerprints_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alerts, "MAX_FINGERPRINTS", 10)
    monkeypatch.setattr(alerts, "FINGERPRINTS", {})
    first = [fingerprint({"alertname": "a", "n": str(i)}) for i in range(25)]
    assert 0 < len(alerts.FINGERPRINTS) <= 10
    assert len(set(first)) == 25
    # forgotten or not, each set hashes to the same value again
    assert [fingerprint({"alertname": "a", "n": str(i)}) for i in range(25)] == first


def test_an_alert_round_trips_through_json_with_its_defaults() -> None:
    built = Alert.build(
        rule_id="t-9", rule_version="v1", status="firing", severity="warning", labels=LABELS,
        annotations={"summary": "hot"}, starts_at="2024-01-01T00:00:00.000Z", ends_at=None,
        source="sensors", event_ts="2024-01-01T00:00:00.000Z", values={"temperature": 91.5},
    )  # fmt: skip
    assert built.fingerprint == "320244fd9c62d047"
    assert built.generator_url == "/rules/t-9"
    assert Alert.from_json(built.to_json()) == built
    assert built.to_dict()["values"] == {"temperature": 91.5}
    bare = Alert(
        alert_id="x", rule_id="r", rule_version="v", status="resolved", severity="info", labels={},
        annotations={}, starts_at="s", ends_at="e", fingerprint="f", source="logs", event_ts="t",
    )  # fmt: skip
    assert bare.values == {} and bare.generator_url == ""
    assert bare.values is not Alert.from_dict(bare.to_dict()).values


def test_a_backtest_line_is_the_documented_dict_written_from_the_alerts_own_json() -> None:
    built = Alert.build(
        rule_id="t-9 \u00e9", rule_version="v1", status="resolved", severity="warning", labels=LABELS,
        annotations={"summary": "at 30 \u00b0C"}, starts_at="2024-01-01T00:00:00.000Z",
        ends_at="2024-01-01T00:05:00.000Z", source="sensors", event_ts="2024-01-01T00:05:00.000Z",
        values={"temperature": 91.5, "n": 3, "none": None, "nested": {"a": [1, 2.25]}},
    )  # fmt: skip
    line = backtest_line(built)
    assert line == orjson.dumps({"rule": built.rule_id, **built.to_dict()})  # the documented form
    assert list(orjson.loads(line))[:2] == ["rule", "alert_id"]
