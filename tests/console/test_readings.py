"""The pure half of the input chart's raw readings: what to read for an alert, which records
are its group's readings, and the sentence about the read."""

from __future__ import annotations

import orjson

from app.console.readings import (
    LOOKBACK_MS,
    MAX_RECORDS,
    Collector,
    Reading,
    ReadingsPlan,
    ReadReport,
    describe,
    plan_readings,
)

START = "2024-05-01T10:00:00.000Z"
START_MS = 1_714_557_600_000


def plan(**over: object) -> ReadingsPlan | str:
    args: dict[str, object] = {
        "source": "sensors", "group_by": ("device_id",), "field": "temperature", "window_ms": None,
        "labels": {"alertname": "hot", "device_id": "pump-7", "team": "ops"}, "starts_at": START,
        "ends_at": "2024-05-01T10:30:00.000Z", "now_ms": START_MS + 10**9,
    }  # fmt: skip
    args.update(over)
    return plan_readings(**args)  # type: ignore[arg-type]


def reading(device: str, minute: int, temp: object, kind: str = "pump") -> tuple[bytes, bytes]:
    ts = f"2024-05-01T{8 + minute // 60:02d}:{minute % 60:02d}:00Z"
    body = {"device_id": device, "ts": ts, "temperature": temp, "kind": kind}
    return device.encode(), orjson.dumps(body)


def test_a_rule_grouped_by_the_topic_key_reads_one_key_from_an_hour_before_to_the_end() -> None:
    p = plan()
    assert isinstance(p, ReadingsPlan)
    assert (p.topic, p.key, p.match, p.field) == ("events.sensors", b"pump-7", (("device_id", "pump-7"),),
                                                  "temperature")  # fmt: skip
    assert (p.start_ms, p.end_ms) == (START_MS - LOOKBACK_MS, START_MS + 30 * 60_000)
    windowed = plan(window_ms=600_000, ends_at=None)
    assert isinstance(windowed, ReadingsPlan)
    assert (windowed.start_ms, windowed.end_ms) == (START_MS - 600_000, START_MS + 10**9)  # active: to now


def test_other_groupings_read_every_key_and_unusable_alerts_say_why() -> None:
    by_site = plan(group_by=("site",), labels={"site": "lab"})
    assert isinstance(by_site, ReadingsPlan) and by_site.key is None and by_site.match == (("site", "lab"),)
    assert plan(group_by=("site",)) == "the alert has no label site to find its group's readings by"
    assert plan(field=None) == "the rule names no input field to plot"
    assert "joined from a registry table" in str(plan(field="device.max_temp"))
    assert plan(source="nowhere") == "the source 'nowhere' has no topic"
    assert "cannot be read" in str(plan(starts_at="yesterday"))


def test_the_collector_keeps_the_groups_numeric_readings_inside_the_window() -> None:
    p = plan(group_by=("device_id", "kind"), labels={"device_id": "pump-7", "kind": "pump"})
    assert isinstance(p, ReadingsPlan)
    c = Collector(p)
    offered = [
        reading("pump-7", 50, 80.0),  # before the window (09:00 to 10:30)
        reading("pump-7", 60, 81.5),
        reading("pump-9", 61, 99.0),  # another key
        reading("pump-7", 62, 82, kind="fan"),  # another group
        (b"pump-7", b"{not json"),  # undecodable: skipped
        reading("pump-7", 63, "hot"),  # not a number: the worker dead-letters it, so does this
        reading("pump-7", 90, 90.0),
    ]
    assert all(c.offer(k, v) for k, v in offered)
    assert c.readings == [Reading(START_MS - LOOKBACK_MS, 81.5), Reading(START_MS - 30 * 60_000, 90.0)]
    assert c.offer(*reading("pump-7", 91, 91.0)) is True
    assert c.offer(*reading("pump-7", 151, 95.0)) is False  # past the window's end: stop
    assert [pt["value"] for pt in c.points()] == [81.5, 90.0, 91.0]
    assert c.points()[0]["time"] == "2024-05-01T09:00:00.000Z"


def test_the_sentence_says_what_was_read_and_what_cut_it_short() -> None:
    p = plan()
    assert isinstance(p, ReadingsPlan)
    plain = describe(p, ReadReport(records=40, partitions=(1,)), 12)
    assert plain.startswith("12 reading(s) of temperature for device_id=pump-7 from 40 record(s) of "
                            "events.sensors (partition 1)")  # fmt: skip
    assert "bound" not in plain and "retention" not in plain
    cut = describe(p, ReadReport(records=MAX_RECORDS, bound="records", retained_from_ms=START_MS), 3)
    assert f"stopped at the bound of {MAX_RECORDS} records read" in cut
    assert "readings before 2024-05-01T10:00:00.000Z are no longer there" in cut
    assert "no longer has any record" in describe(p, ReadReport(retained_from_ms=p.end_ms), 0)
    assert "time budget" in describe(p, ReadReport(bound="time"), 0)
    assert describe(p, ReadReport(error="refused"), 0) == "raw readings not available: refused"
