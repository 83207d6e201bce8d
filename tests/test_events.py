"""Event schemas: what is accepted, normalised, and rejected with a reason naming the field."""

from __future__ import annotations

import base64

import orjson
import pytest

import app.events as events
from app.errors import IngestDecodeError
from app.events import FINANCE, LOGS, MAX_STRING_LEN, SENSORS, dlq_holds, dlq_record, format_ts, parse_ts


def test_valid_sensor_event_is_normalised_to_utc() -> None:
    ev = SENSORS.decode(b'{"device_id": "m-1", "ts": "2013-12-02T22:15:00+01:00", "temperature": 74}')
    assert ev.key == "m-1"
    assert ev.fields["ts"] == "2013-12-02T21:15:00.000Z"
    assert ev.fields["temperature"] == 74.0 and isinstance(ev.fields["temperature"], float)
    assert ev.ts_ms == parse_ts("2013-12-02T21:15:00Z")


@pytest.mark.parametrize(
    ("raw", "field", "fragment"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b'{"ts": "2020-01-01T00:00:00Z"}', "device_id", "the key"),
        (b'{"device_id": "d", "temperature": 1}', "ts", "'ts'"),
        (b'{"device_id": "d", "ts": "2020-01-01 00:00:00"}', "ts", "no UTC offset"),
        (b'{"device_id": "d", "ts": "yesterday"}', "ts", "not an RFC 3339"),
        (b'{"device_id": "d", "ts": "2020-01-01T00:00:00Z", "temperature": "hot"}', "temperature", "number"),
        (b'{"device_id": "d", "ts": "2020-01-01T00:00:00Z", "temperature": true}', "temperature", "number"),
        (b'{"device_id": "d", "ts": "2020-01-01T00:00:00Z", "colour": "red"}', "colour", "unknown field"),
        (b'{"device_id": "d", "ts": "2020-01-01T00:00:00Z", "lat": {"a": 1}}', "lat", "number"),
    ],
)
def test_invalid_events_name_the_field(raw: bytes, field: str | None, fragment: str) -> None:
    with pytest.raises(IngestDecodeError) as info:
        SENSORS.decode(raw)
    assert info.value.field == field
    assert fragment in info.value.reason


def _position(lat: object, lon: object) -> bytes:
    return orjson.dumps({"device_id": "v1", "ts": "2024-01-01T00:00:00Z", "lat": lat, "lon": lon})


@pytest.mark.parametrize(
    ("lat", "lon", "reason"),
    [
        (999, 10, "field 'lat' must be within -90..90 (degrees), got float 999.0"),
        (90.0001, 10.0, "field 'lat' must be within -90..90 (degrees), got float 90.0001"),
        (-90.0001, 10.0, "field 'lat' must be within -90..90 (degrees), got float -90.0001"),
        (48.1, 180.0001, "field 'lon' must be within -180..180 (degrees), got float 180.0001"),
        (48.1, -181, "field 'lon' must be within -180..180 (degrees), got float -181.0"),
        (1e308, 1e308, "field 'lat' must be within -90..90 (degrees), got float 1e+308"),
    ],
)
def test_a_position_off_the_globe_is_refused_naming_the_field(lat: float, lon: float, reason: str) -> None:
    """A GPS glitch used to pass, and a geofence rule read NULL from it and stayed quiet."""
    with pytest.raises(IngestDecodeError) as info:
        SENSORS.decode(_position(lat, lon))
    assert (info.value.reason, info.value.field) == (reason, reason.split("'")[1])


@pytest.mark.parametrize(
    ("lat", "lon"), [(-90, -180), (90, 180), (-90.0, 180.0), (90.0, -180.0), (0.0, -0.0), (None, None)]
)
def test_positions_on_the_edges_of_the_globe_are_kept(lat: float | None, lon: float | None) -> None:
    fields = SENSORS.decode(_position(lat, lon)).fields
    assert (fields["lat"], fields["lon"]) == (lat, lon)
    assert lat is None or isinstance(fields["lat"], float)


def test_a_position_off_the_globe_is_dead_lettered_with_its_reason_and_field() -> None:
    """As the rule worker does with a record it cannot decode: the letter keeps the payload whole."""
    raw = b'{"device_id":"v1","ts":"2024-01-01T00:00:00Z","lat":999,"lon":10}'
    with pytest.raises(IngestDecodeError) as info:
        SENSORS.decode(raw)
    reason, field = info.value.reason, info.value.field
    letter = orjson.loads(dlq_record("sensors", reason, raw, adapter="test", field=field))
    assert letter["reason"] == "field 'lat' must be within -90..90 (degrees), got float 999.0"
    assert letter["field"] == "lat" and dlq_holds(letter, raw)


def test_only_coordinates_have_bounds() -> None:
    """Odd but possible readings pass: a device's unusual value is data for a rule, not a dead letter."""
    odd = {"temperature": -273.5, "humidity": 140.0, "battery": 104.0, "speed_kmh": -1.0, "heading": 720.0}
    event = SENSORS.validate({"device_id": "v1", "ts": "2024-01-01T00:00:00Z", **odd, "voltage": -12.0})
    assert event.fields["heading"] == 720.0 and event.fields["temperature"] == -273.5
    assert [name for name, _ in SENSORS.bounds] == ["lat", "lon"] and not LOGS.bounds and not FINANCE.bounds


def test_a_record_without_value_is_invalid_not_a_crash() -> None:
    with pytest.raises(IngestDecodeError, match="no value"):
        SENSORS.decode(None)


def test_long_fields_reject_fractions_but_accept_integral_floats() -> None:
    ok = LOGS.validate({"host": "h", "ts": "2015-05-17T10:05:03Z", "status": 403.0})
    assert ok.fields["status"] == 403 and isinstance(ok.fields["status"], int)
    with pytest.raises(IngestDecodeError, match="whole number"):
        LOGS.validate({"host": "h", "ts": "2015-05-17T10:05:03Z", "status": 403.5})


@pytest.mark.parametrize(
    "raw",
    [b"9223372036854775808", b"18446744073709551615", b"123456789012345678901", b"-1e19"],
)
def test_long_fields_refuse_numbers_beyond_64_bits_with_a_reason(raw: bytes) -> None:
    """Beyond 64 bits a whole number cannot be serialised again (orjson) nor held by the rule
    language or Spark: it used to pass, then crash the Spark engine's decoder."""
    record = b'{"host":"h","ts":"2015-05-17T10:05:03Z","bytes":' + raw + b"}"
    with pytest.raises(IngestDecodeError, match="outside the 64-bit range") as found:
        LOGS.decode(record)
    assert found.value.field == "bytes"
    edge = LOGS.decode(b'{"host":"h","ts":"2015-05-17T10:05:03Z","bytes":-9223372036854775808}')
    assert orjson.loads(orjson.dumps(edge.fields))["bytes"] == -(2**63)


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("status", True, "whole number"),
        ("status", "403", "whole number"),
        ("method", 5, "string"),
        ("method", 1.5, "string"),
        ("path", "/" + "a" * MAX_STRING_LEN, "longer than"),
    ],
)
def test_log_fields_of_the_wrong_type_are_rejected(name: str, value: object, fragment: str) -> None:
    with pytest.raises(IngestDecodeError, match=fragment) as info:
        LOGS.validate({"host": "h", "ts": "2015-05-17T10:05:03Z", name: value})
    assert info.value.field == name


def test_values_of_the_right_type_are_kept_as_they_are() -> None:
    row = {"host": "h", "ts": "2015-05-17T10:05:03.000Z", "status": 403, "method": "GET", "bytes": None}
    assert LOGS.validate(row).fields == row
    assert LOGS.validate({**row, "path": "/" + "a" * (MAX_STRING_LEN - 1)}).fields["path"][-1] == "a"


def test_null_measurements_are_allowed() -> None:
    ev = FINANCE.validate({"symbol": "AAPL", "ts": "2000-01-03T00:00:00Z", "close": None})
    assert ev.fields["close"] is None


def test_dlq_record_keeps_non_utf8_payload_whole() -> None:
    raw = b"\xff\xfe garbage"
    rec = orjson.loads(dlq_record("sensors", "bad", raw, adapter="test", field="x"))
    assert rec["raw_encoding"] == "base64"
    import base64

    assert base64.b64decode(rec["raw"]) == raw
    assert rec["reason"] == "bad" and rec["source"] == "sensors" and rec["field"] == "x"


def test_format_ts_round_trips() -> None:
    ms = parse_ts("2014-01-07T02:55:00.123Z")
    assert format_ts(ms) == "2014-01-07T02:55:00.123Z"


def test_format_ts_matches_the_calendar() -> None:
    """Against datetime's own formatting: day and year boundaries, leap days, the range's ends."""
    import random
    from datetime import UTC, datetime

    def reference(ts_ms: int) -> str:
        return (
            datetime.fromtimestamp(ts_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")
            + f"{ts_ms % 1000:03d}Z"
        )

    edges = [
        parse_ts(t) for t in ("1970-01-01T00:00:00Z", "2000-02-29T23:59:59.999Z", "2099-12-31T23:59:59.999Z")
    ]
    rng = random.Random(7)  # noqa: S311 - reproducible test samples, not secrets
    samples = [*edges, *(e + d for e in edges for d in (-1, 1) if 0 <= e + d <= edges[-1])]
    samples += [rng.randrange(0, edges[-1]) for _ in range(20_000)]
    for ts in samples:
        assert format_ts(ts) == reference(ts), ts
        assert parse_ts(format_ts(ts)) == ts


def test_remembered_formatted_times_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "MAX_FORMATTED", 10)
    monkeypatch.setattr(events, "FORMATTED", {})
    monkeypatch.setattr(events, "MAX_DAYS", 3)
    monkeypatch.setattr(events, "DAYS", {})
    days = [1_389_063_300_123 + 86_400_000 * i for i in range(7)]
    assert [format_ts(ts)[:10] for ts in days] == [f"2014-01-{7 + i:02d}" for i in range(7)]
    assert 0 < len(events.DAYS) <= 3
    monkeypatch.setattr(events, "DAY_NUMBERS", {})
    assert [events.canonical_ms(format_ts(ts)) for ts in days] == days
    assert 0 < len(events.DAY_NUMBERS) <= 3
    times = [1_389_063_300_123 + 1_000 * i for i in range(25)]
    first = [format_ts(ts) for ts in times]
    assert 0 < len(events.FORMATTED) <= 10
    assert first[0] == "2014-01-07T02:55:00.123Z" and first[24] == "2014-01-07T02:55:24.123Z"
    assert [format_ts(ts) for ts in times] == first  # forgotten or not, the same text


@pytest.mark.parametrize(
    "ts",
    [
        "2014-01-07T02:05:00.000Z",  # canonical: kept as it is
        "2014-01-07T02:05:00Z",
        "2014-01-07T02:05:00.123456Z",
        "2014-01-07 02:05:00.000Z",
        "2014-01-07T03:05:00.000+01:00",
        "2014-01-07T02:05:00.000+00:00",
    ],
)
def test_event_time_text_is_always_the_canonical_utc_form(ts: str) -> None:
    ev = SENSORS.decode(orjson.dumps({"device_id": "d", "ts": ts}))
    assert ev.fields["ts"] == format_ts(ev.ts_ms)
    assert ev.fields["ts"].endswith("Z") and len(ev.fields["ts"]) == 24


def test_non_ascii_digits_in_event_time_are_rejected_or_normalised() -> None:
    ts = "２０１４-01-07T02:05:00.000Z"  # fullwidth digits: never passed through as they are  # noqa: RUF001
    try:
        ev = SENSORS.decode(orjson.dumps({"device_id": "d", "ts": ts}))
    except IngestDecodeError:
        return
    assert ev.fields["ts"] == format_ts(ev.ts_ms)


def test_canonical_times_decode_as_parse_ts_reads_them() -> None:
    """The decoder's fast path for ``2014-01-07T02:55:00.123Z`` (events.canonical_ms) gives
    parse_ts's milliseconds, and leaves every out-of-range time to parse_ts's error."""
    import random

    rng = random.Random(11)  # noqa: S311 - reproducible test samples, not secrets
    for ms in [0, 1, 86_399_999, 951_782_400_000, 4_102_444_799_999] + [
        rng.randrange(0, 4_102_444_800_000) for _ in range(5_000)
    ]:
        text = format_ts(ms)
        assert events.canonical_ms(text) == parse_ts(text) == ms
        assert SENSORS.validate({"device_id": "d", "ts": text}).ts_ms == ms
    for text, problem in [
        ("2014-13-01T00:00:00.000Z", "not an RFC 3339 timestamp"),
        ("2014-02-30T00:00:00.000Z", "not an RFC 3339 timestamp"),
        ("2014-01-01T24:00:00.000Z", "not an RFC 3339 timestamp"),
        ("2014-01-01T23:60:00.000Z", "not an RFC 3339 timestamp"),
        ("2014-01-01T23:59:60.000Z", "not an RFC 3339 timestamp"),
        ("1969-12-31T23:59:59.999Z", "outside 1970..2100"),
        ("2100-01-01T00:00:00.000Z", "outside 1970..2100"),
    ]:
        assert events.canonical_ms(text) == -1, text
        with pytest.raises(IngestDecodeError, match=problem):
            SENSORS.validate({"device_id": "d", "ts": text})
    # other forms and values are parse_ts's to read or refuse
    for other in [
        "2014-01-07T02:55:00Z",
        "2014-01-07T02:55:00.123+00:00",
        " 2014-01-07T02:55:00.123Z",
        1_389_063_300_000,
        None,
    ]:
        assert events.canonical_ms(other) == -1, other


@pytest.mark.parametrize(
    "raw",
    [
        b'{"device_id":"a","ts":"2024-01-01T00:00:00Z","temperature":1,"temperature":99}',
        b'{"device_id" : "a", "ts": "2024-01-01T00:00:00Z", "temperature" :1, "temperature": 99}',
        '{"device_id":"a","ts":"2024-01-01T00:00:00Z","status":"x\\":","temperature":1,"temperature":2}',
        b'{\n  "device_id": "a",\n  "device_id": "b",\n  "ts": "2024-01-01T00:00:00Z"\n}',
    ],
)
def test_a_repeated_key_is_refused_and_named(raw: bytes | str) -> None:
    with pytest.raises(IngestDecodeError, match="appears more than once") as info:
        SENSORS.decode(raw)
    assert info.value.field in ("temperature", "device_id")


def test_keys_that_only_look_repeated_are_fine() -> None:
    raw = b'{"device_id":"a","ts":"2024-01-01T00:00:00Z","status":"\\"status\\": ok","kind":"a :b"}'
    assert SENSORS.decode(raw).fields["status"] == '"status": ok'
    spaced = b'{"device_id" : "a", "ts" : "2024-01-01T00:00:00Z"}'
    assert SENSORS.decode(spaced).key == "a"


def test_a_dead_letter_record_fits_a_kafka_record_and_says_when_it_was_cut() -> None:
    whole = orjson.loads(dlq_record("sensors", "r", b"a" * 900_000, adapter="t"))
    assert (whole["truncated"], whole["raw_size"], len(whole["raw"])) == (False, 900_000, 900_000)
    for raw in (b"a" * 2_000_000, b"\x01" * 2_000_000, b"\xff" * 2_000_000, "é" * 1_000_000):
        record = dlq_record("sensors", "r", raw, adapter="t")
        assert len(record) <= events.MAX_DLQ_RECORD_BYTES
        body = orjson.loads(record)
        assert body["truncated"] is True and body["raw_size"] == 2_000_000
        kept = base64.b64decode(body["raw"]) if body["raw_encoding"] == "base64" else body["raw"].encode()
        source = raw.encode() if isinstance(raw, str) else raw
        assert len(kept) > 100_000 and source.startswith(kept)


@pytest.mark.parametrize(
    ("raw", "stamped", "expected"),
    [
        (b'{"device_id":"a","ts":"2024-01-01T00:00:00.000Z","temperature":1.0}', 5, 1_704_067_200_000),
        (b'{"device_id":"a","ts":"2024-01-01T01:00:00+01:00","temperature":"hot"}', 5, 1_704_067_200_000),
        (b'{"ts":"2024-01-01T12:00:00"}', 5, 5),  # no offset: the decoder refuses the time
        (b'{"ts":"2024-01-01T12:00:00Z","ts":"2024-01-01T12:00:00Z"}', 5, 5),  # a repeated key
        (b'{"ts":1704067200000}', 5, 5),
        (b"{broken", 5, 5),
        (b"[1]", None, None),
        (None, 7, 7),
    ],
)
def test_a_records_place_in_a_time_range_is_its_readable_ts_else_its_stamp(
    raw: bytes | None, stamped: int | None, expected: int | None
) -> None:
    assert events.record_time_ms(raw, stamped) == expected


def test_dlq_holds_reads_back_the_payload_a_dead_letter_keeps() -> None:
    """The inverse of ``dlq_record``'s payload: text, base64 (not UTF-8) and a cut payload's start."""
    for payload in [b'{"device_id": "d", "ts": 1}', b"\xff\xfe not utf-8", "é \u2028".encode()]:
        letter = orjson.loads(dlq_record("sensors", "bad", payload, adapter="test"))
        assert dlq_holds(letter, payload)
        assert not dlq_holds(letter, payload + b"x") and not dlq_holds(letter, payload[:-1])
    big = b"x" * 5000
    cut = orjson.loads(dlq_record("sensors", "big", big, adapter="test", max_bytes=1000))
    assert cut["truncated"] and dlq_holds(cut, big) and not dlq_holds(cut, b"y" + big)
