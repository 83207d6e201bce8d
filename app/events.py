"""Event schemas per source, validation at the boundary, and dead-letter records.

An event is a flat JSON object with an RFC 3339 ``ts`` (event time) and a key
field per source. ``Schema.decode`` turns raw bytes into an :class:`Event` or
raises :class:`IngestDecodeError` whose reason names the field; callers route
that to ``dlq.events`` with :func:`dlq_record`. Nothing is ever dropped silently.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NamedTuple

import orjson

from app.errors import IngestDecodeError

logger = logging.getLogger(__name__)

FieldType = Literal["string", "double", "long", "boolean", "timestamp"]

MAX_KEY_LEN = 256
MAX_STRING_LEN = 65_536
_MIN_TS_MS = 0  # 1970-01-01
_MAX_TS_MS = 4_102_444_800_000  # 2100-01-01
#: the whole numbers a ``long`` field holds: the rule language's (and Spark's) 64-bit integers
LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1
#: the event times accepted, [first, end) in epoch ms
TS_RANGE_MS: Final = (_MIN_TS_MS, _MAX_TS_MS)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
#: What :func:`format_ts` writes; a string already in this form (and valid) is kept as it is.
_CANONICAL_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", re.ASCII)


class Event(NamedTuple):
    """A validated event: its entity key, event time in epoch ms, and all its fields.

    ``fields`` still holds ``ts`` as the normalised RFC 3339 UTC string.
    """

    key: str
    ts_ms: int
    fields: dict[str, Any]


def parse_ts(value: object, field: str = "ts") -> int:
    """Parse an RFC 3339 timestamp with an offset into epoch milliseconds (UTC)."""
    if not isinstance(value, str):
        msg = f"field '{field}' must be an RFC 3339 string, got {type(value).__name__}"
        raise IngestDecodeError(msg, field)
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        msg = f"field '{field}' is not an RFC 3339 timestamp: {value[:64]!r}"
        raise IngestDecodeError(msg, field) from None
    if dt.tzinfo is None:
        msg = f"field '{field}' has no UTC offset (use 'Z' or '+00:00'): {value[:64]!r}"
        raise IngestDecodeError(msg, field)
    ms = (dt - _EPOCH) // _MS
    if not _MIN_TS_MS <= ms < _MAX_TS_MS:
        msg = f"field '{field}' is outside 1970..2100: {value[:64]!r}"
        raise IngestDecodeError(msg, field)
    return ms


#: the text of each day since the epoch seen (at most 36,500 days: a century)
DAYS: dict[int, str] = {}
MAX_DAYS = 36_500
#: "00" to "99" and "000" to "999": the time of day's digits, looked up (an f-string's
#: ``:02d`` is a call of ``str.format``, which was half of a formatting's cost)
_TWO = [f"{i:02d}" for i in range(100)]
_THREE = [f"{i:03d}" for i in range(1000)]

#: formatted times by epoch ms: alert transitions format the same few times over and over
FORMATTED: dict[int, str] = {}
MAX_FORMATTED = 16_384


def format_ts(ts_ms: int) -> str:
    """Epoch milliseconds -> RFC 3339 UTC with millisecond precision and 'Z'.

    The date comes from a dict of days, the time of day from integer arithmetic and
    tables of digits: compiled, ~1/10 of ``strftime``'s cost (each alert transition
    formats two or three times). The results are remembered in a plain dict (up to
    ``MAX_FORMATTED``, then it starts again): from compiled code, a call through
    ``functools.lru_cache`` cost more than the formatting it saved."""
    found = FORMATTED.get(ts_ms)
    if found is not None:
        return found
    day = ts_ms // 86_400_000
    ms = ts_ms - day * 86_400_000
    seconds = ms // 1000
    ms -= seconds * 1000
    hours = seconds // 3600
    seconds -= hours * 3600
    minutes = seconds // 60
    seconds -= minutes * 60
    date = DAYS.get(day)
    if date is None:
        date = (_EPOCH + timedelta(days=day)).date().isoformat()
        if len(DAYS) >= MAX_DAYS:
            DAYS.clear()
        DAYS[day] = date
    text = f"{date}T{_TWO[hours]}:{_TWO[minutes]}:{_TWO[seconds]}.{_THREE[ms]}Z"
    if len(FORMATTED) >= MAX_FORMATTED:
        FORMATTED.clear()
    FORMATTED[ts_ms] = text
    return text


#: the day number of each canonical date text seen (at most MAX_DAYS)
DAY_NUMBERS: dict[str, int] = {}


def _digits(text: str, begin: int, end: int) -> int:
    """The number ``text[begin:end]`` writes in ASCII digits (compiled, cheaper than ``int``
    of a slice)."""
    n = 0
    for i in range(begin, end):
        n = n * 10 + ord(text[i]) - 48
    return n


def canonical_ms(ts: object) -> int:
    """The epoch milliseconds of ``ts`` when it is a text in the canonical form
    ``_CANONICAL_TS`` (``2014-01-07T02:55:00.123Z``); -1 for any other value or form, or when
    a field is out of range or the time is outside 1970..2100: :func:`parse_ts` then reads it
    or names the problem. The digits are read in place and the date's day remembered, so the
    common form skips ``parse_ts``'s general path on every event decoded."""
    if type(ts) is not str or not _CANONICAL_TS.fullmatch(ts):
        return -1
    text: str = ts
    day = DAY_NUMBERS.get(text[:10])
    if day is None:
        try:
            day = (datetime.fromisoformat(text[:10] + "T00:00:00+00:00") - _EPOCH).days
        except ValueError:
            return -1
        if len(DAY_NUMBERS) >= MAX_DAYS:
            DAY_NUMBERS.clear()
        DAY_NUMBERS[text[:10]] = day
    hours, minutes, seconds = _digits(text, 11, 13), _digits(text, 14, 16), _digits(text, 17, 19)
    if hours > 23 or minutes > 59 or seconds > 59:
        return -1
    ms = ((day * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000 + _digits(text, 20, 23)
    return ms if _MIN_TS_MS <= ms < _MAX_TS_MS else -1


def check_value(name: str, ftype: FieldType, value: object, noun: str = "field") -> object:
    """``value`` of field (or ``noun``, ``column`` for a table's row) ``name`` as ``ftype`` holds
    it (an integral float as a long, an int as a double); IngestDecodeError naming it otherwise:
    ``field 'lat' must be a number, got str "x"``."""
    if value is None:
        return None
    if ftype == "double":
        if isinstance(value, bool) or not isinstance(value, int | float):
            msg = f"{noun} '{name}' must be a number, got {_show(value)}"
            raise IngestDecodeError(msg, name)
        return float(value)
    if ftype == "long":
        number = int(value) if isinstance(value, float) and value.is_integer() else value
        if isinstance(number, bool) or not isinstance(number, int):
            msg = f"{noun} '{name}' must be a whole number, got {_show(value)}"
            raise IngestDecodeError(msg, name)
        if not LONG_MIN <= number <= LONG_MAX:  # the rule language's integers are 64-bit
            msg = f"{noun} '{name}' is outside the 64-bit range, got {_show(value)}"
            raise IngestDecodeError(msg, name)
        return number
    if ftype == "boolean":
        if not isinstance(value, bool):
            msg = f"{noun} '{name}' must be true or false, got {_show(value)}"
            raise IngestDecodeError(msg, name)
        return value
    if not isinstance(value, str):
        msg = f"{noun} '{name}' must be a string, got {_show(value)}"
        raise IngestDecodeError(msg, name)
    if len(value) > MAX_STRING_LEN:
        msg = f"{noun} '{name}' is longer than {MAX_STRING_LEN} characters"
        raise IngestDecodeError(msg, name)
    return value


@dataclass(frozen=True)
class Bound:
    """The closed range ``low..high`` (in ``unit``) outside which a double field's value cannot
    be real, whatever the device: a latitude of 999 degrees is a glitch, not a reading.

    Only such impossibilities get a bound. An odd but possible value (a temperature of -60, a
    battery at 104 %, a heading of -1 or 720) is data a rule may want to see, never a reason to
    dead-letter an event. NaN lies outside every bound."""

    low: float
    high: float
    unit: str

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies within the bound (False for NaN)."""
        return self.low <= value <= self.high

    def refusal(self, name: str, value: float, noun: str = "field") -> str:
        """The reason ``value`` of field (or ``noun``) ``name`` is refused when it lies outside:
        ``field 'lat' must be within -90..90 (degrees), got float 999.0``."""
        span = f"{self.low:g}..{self.high:g} ({self.unit})"
        return f"{noun} '{name}' must be within {span}, got float {value!r}"


#: WGS 84 latitude and longitude: no point on Earth lies outside them
LATITUDE: Final = Bound(-90.0, 90.0, "degrees")
LONGITUDE: Final = Bound(-180.0, 180.0, "degrees")


def _show(value: object) -> str:
    try:
        text = orjson.dumps(value, default=str).decode()
    except TypeError:  # an integer beyond 64 bits
        text = str(value)
    return f"{type(value).__name__} {text[:40]}"


@dataclass(frozen=True)
class Schema:
    """The documented shape of one source's events, or of one registry table's rows.

    ``fields`` excludes ``ts`` and the key, which every event has. Unknown
    fields are rejected so that a rule can only name fields that exist. A table's
    rows (``timed=False``, ``source`` the table's name) are checked the same way but
    have no ``ts`` (their :class:`Event` has ``ts_ms`` 0 and no ``ts`` in its fields)
    and no limit on the key's length. ``bounds`` pairs the double fields whose values
    outside a :class:`Bound` are impossible (coordinates) with their bound: such a value is
    refused too. Pairs, not a dict: compiled, :meth:`validate` walks a tuple natively, and a
    dict's iterator cost it 340 more instructions per event (1.4 % of a decode).
    """

    source: str
    key: str
    fields: Mapping[str, FieldType]
    doc: str = ""
    timed: bool = True
    bounds: tuple[tuple[str, Bound], ...] = ()

    def all_fields(self) -> dict[str, FieldType]:
        """Every field a rule may name, with its type."""
        return {self.key: "string", "ts": "timestamp", **self.fields}

    def validate(self, obj: object) -> Event:
        """Check a decoded JSON value; return the normalised event (or row). IngestDecodeError
        naming the field for anything else: not an object, a missing or bad key or ``ts``, an
        unknown field, a value of the wrong type, a double outside its field's bound."""
        timed = self.timed
        if not isinstance(obj, dict):
            msg = (
                f"{self.source} {'event' if timed else 'row'} must be a JSON object, got {type(obj).__name__}"
            )
            raise IngestDecodeError(msg)
        key = obj.get(self.key)
        if not isinstance(key, str) or not key:
            msg = f"{'field' if timed else 'column'} '{self.key}' (the key) must be a non-empty string"
            raise IngestDecodeError(msg, self.key)
        if len(key) > MAX_KEY_LEN and timed:
            msg = f"field '{self.key}' (the key) is longer than {MAX_KEY_LEN} characters"
            raise IngestDecodeError(msg, self.key)
        ts_ms = 0
        if timed:
            if "ts" not in obj:
                msg = "field 'ts' (event time, RFC 3339 UTC) is missing"
                raise IngestDecodeError(msg, "ts")
            ts = obj["ts"]
            ts_ms = canonical_ms(ts)
            if ts_ms < 0:  # another form (or out of range: parse_ts names the problem)
                ts_ms = parse_ts(ts)
                ts = format_ts(ts_ms)
            out: dict[str, Any] = {self.key: key, "ts": ts}
        else:
            out = {self.key: key}
        key_field, fields = self.key, self.fields
        for name, value in obj.items():
            if name == key_field or (name == "ts" and timed):
                continue
            ftype = fields.get(name)
            if ftype is None:
                msg = (
                    f"unknown field '{name}' for source {self.source}"
                    if timed
                    else f"unknown column '{name}' for table {self.source}"
                )
                raise IngestDecodeError(msg, name)
            kind = type(value)
            # the values check_value passes through unchanged, without its call and type chain
            if (
                value is None
                or (kind is float and ftype == "double")
                or (kind is int and ftype == "long" and LONG_MIN <= value <= LONG_MAX)
                or (kind is str and ftype == "string" and len(value) <= MAX_STRING_LEN)
            ):
                out[name] = value
            else:
                out[name] = check_value(name, ftype, value, "field" if timed else "column")
        if self.bounds:  # after the loop: a bounded field is a double (or None) by now
            for name, bound in self.bounds:
                value = out.get(name)
                if value is None:
                    continue
                number: float = value  # compiled: unboxed once, compared as a C double
                if not bound.low <= number <= bound.high:
                    msg = bound.refusal(name, number, "field" if timed else "column")
                    raise IngestDecodeError(msg, name)
        return Event(key, ts_ms, out)

    def decode(self, raw: bytes | str | None) -> Event:
        """Parse JSON bytes and validate them. A record with no value is invalid too, and so
        is one that repeats a key (see :func:`loads`)."""
        if raw is None:
            msg = "record has no value"
            raise IngestDecodeError(msg)
        return self.validate(loads(raw))


#: a colon after JSON whitespace, found by scanning for colons only (the literal first: a
#: class-first pattern cost 4x as much on log lines full of spaces)
_SPACED_COLON = re.compile(rb":(?<=[ \t\r\n]:)")
_SPACED_COLON_TEXT = re.compile(r":(?<=[ \t\r\n]:)")


def loads(raw: bytes | str) -> Any:
    """``raw`` parsed as JSON; IngestDecodeError when it is not JSON or an object in it
    repeats a key (orjson keeps the last value silently: a device could hide a value
    from one reader and show it to another).

    orjson cannot report repeated keys, so cheap tests decide when to look. An input that
    is the object's own compact serialisation (what the publisher writes: nearly every
    record the rule worker reads) repeats none, and is recognised without a second parse.
    Otherwise every key of a JSON
    object ends with ``":`` (when no space precedes the colon), so an input with exactly
    as many ``":`` as the object has keys, and no space before any colon, repeats none.
    Only other inputs (nested objects, a ``":`` inside a string, spaced JSON) are parsed
    again with the standard library to find the key.
    """
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        msg = f"not valid JSON: {exc}"
        raise IngestDecodeError(msg) from None
    check_unique_keys(raw, obj)
    return obj


def record_time_ms(raw: bytes | str | None, stamped_ms: int | None) -> int | None:
    """Where a time range places a record (a backtest's ``--from``/``--to``, the archive's date
    partitions): its ``ts`` as the decoder reads it, when the record is a JSON object whose
    ``ts`` the decoder takes (a valid event's is its event time); else ``stamped_ms``, the time
    Kafka stamped the record; None when it has neither (an invalid line of a file). One
    function for every reader, so that a range selects the same records from a topic, a
    file and the archive."""
    if raw is not None:
        try:
            obj = loads(raw)
        except IngestDecodeError:
            obj = None
        if isinstance(obj, dict) and "ts" in obj:
            try:
                return event_ts_ms(obj["ts"])
            except IngestDecodeError:
                pass
    return stamped_ms


def event_ts_ms(ts: object) -> int:
    """An event's ``ts`` as :meth:`Schema.validate` reads it, in epoch milliseconds
    (IngestDecodeError when it does not)."""
    ts_ms = canonical_ms(ts)
    return ts_ms if ts_ms >= 0 else parse_ts(ts)


def check_unique_keys(raw: bytes | str, obj: object) -> None:
    """IngestDecodeError naming a key that an object of ``raw`` repeats, when ``obj`` (what
    ``raw`` parsed to) is an object; see :func:`loads` for how it stays cheap."""
    if type(obj) is not dict:
        return
    if type(raw) is bytes:
        data = raw
        if orjson.dumps(obj) == data:  # a dict's own serialisation names each key once
            return
        plain = data.count(b'":') == len(obj) and _SPACED_COLON.search(data) is None
    else:
        text = str(raw)
        plain = text.count('":') == len(obj) and _SPACED_COLON_TEXT.search(text) is None
    if not plain:
        _refuse_repeated_keys(raw)


def _refuse_repeated_keys(raw: bytes | str) -> None:
    """IngestDecodeError naming the first key an object of ``raw`` (valid JSON) repeats."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in items:
            if name in out:
                msg = f"key '{name[:64]}' appears more than once in an object"
                raise IngestDecodeError(msg, name[:64])
            out[name] = value
        return out

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except ValueError:  # valid for orjson (it read it), not for json: nothing more to say
        return


SENSORS = Schema(
    source="sensors",
    key="device_id",
    fields={
        "temperature": "double",
        "humidity": "double",
        "pressure": "double",
        "battery": "double",
        "voltage": "double",
        "value": "double",
        "lat": "double",
        "lon": "double",
        "speed_kmh": "double",
        "heading": "double",
        "status": "string",
        "kind": "string",
    },
    doc="IoT sensor readings and vehicle positions; battery in percent, speed in km/h.",
    bounds=(("lat", LATITUDE), ("lon", LONGITUDE)),
)

LOGS = Schema(
    source="logs",
    key="host",
    fields={
        "client_ip": "string",
        "method": "string",
        "path": "string",
        "protocol": "string",
        "status": "long",
        "bytes": "long",
        "referrer": "string",
        "user_agent": "string",
        "level": "string",
        "request_id": "string",
        "component": "string",
        "line": "long",
        "message": "string",
        "program": "string",
        "pid": "long",
        "facility": "string",
        "severity": "string",
        "duration_ms": "double",
    },
    doc="Web access logs, application logs and syslog; one event per request or message.",
)

FINANCE = Schema(
    source="finance",
    key="symbol",
    fields={
        "open": "double",
        "high": "double",
        "low": "double",
        "close": "double",
        "adj_close": "double",
        "volume": "long",
        "price": "double",
        "size": "double",
        "amount": "double",
        "side": "string",
        "trade_id": "string",
        "tweet_count": "long",
    },
    doc="Daily OHLC bars, intraday ticks and trades (amount = price x size), tweet volume.",
)

SCHEMAS: dict[str, Schema] = {s.source: s for s in (SENSORS, LOGS, FINANCE)}


def schema_for(source: str) -> Schema:
    try:
        return SCHEMAS[source]
    except KeyError:
        msg = f"unknown source {source!r}; expected one of {', '.join(SCHEMAS)}"
        raise IngestDecodeError(msg) from None


def encode(fields: Mapping[str, Any]) -> bytes:
    return orjson.dumps(fields)


#: The largest dead-letter record value: the producers' request size (1,000,000 bytes, below the
#: broker's default ``max.message.bytes`` of 1 MiB) less 1 KiB for the key and the record's overhead.
MAX_DLQ_RECORD_BYTES = 1_000_000 - 1024


def dlq_record(
    source: str,
    reason: str,
    raw: bytes | str,
    *,
    adapter: str,
    field: str | None = None,
    now: datetime | None = None,
    max_bytes: int = MAX_DLQ_RECORD_BYTES,
) -> bytes:
    """The JSON body of a dead-letter record, at most ``max_bytes`` long.

    The raw payload is kept whole, as text when it is UTF-8, otherwise base64
    (``raw_encoding`` says which), unless the record would then be larger than a Kafka
    record may be: then ``raw`` holds the payload's first bytes that fit, ``truncated``
    is true and ``raw_size`` is always the payload's whole size in bytes.
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    received = (now or datetime.now(tz=UTC)).isoformat().replace("+00:00", "Z")
    body: dict[str, Any] = {
        "source": source,
        "adapter": adapter,
        "reason": reason,
        "field": field,
        "raw": "",
        "raw_encoding": "utf-8",
        "raw_size": len(data),
        "truncated": False,
        "received_at": received,
    }
    base = len(orjson.dumps(body)) + 8  # the record without the payload (and a truncation's "true")
    keep = len(data)
    while True:
        body["raw"], body["raw_encoding"] = _raw_text(data[:keep], cut=keep < len(data))
        record = orjson.dumps(body)
        if len(record) <= max_bytes or keep == 0:
            return record
        # JSON escapes and base64 make the payload longer in the record: cut in proportion
        keep = min(keep - 1, keep * max(0, max_bytes - base) // (len(record) - base + 1))
        body["truncated"] = True


def dlq_holds(letter: Mapping[str, Any], payload: bytes) -> bool:
    """Whether the dead-letter record ``letter`` (:func:`dlq_record`, parsed) keeps
    ``payload``: whole, or its first bytes when ``truncated``."""
    raw = str(letter.get("raw", ""))
    try:
        kept = (
            base64.b64decode(raw)
            if letter.get("raw_encoding") == "base64"
            else raw.encode("utf-8", "surrogatepass")
        )
    except ValueError:
        return False
    return payload.startswith(kept) if letter.get("truncated") else payload == kept


def _raw_text(data: bytes, *, cut: bool) -> tuple[str, str]:
    """``data`` as UTF-8 text, or base64 when it is not UTF-8; when ``data`` was ``cut`` from a
    longer payload, a character the cut split is dropped rather than making it base64."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError as exc:
        if cut and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
            return data[: exc.start].decode("utf-8"), "utf-8"
        return base64.b64encode(data).decode("ascii"), "base64"


def span(ms: int) -> str:
    """A length of time for people, to the second: ``26953d 4h``, ``2h 5m``, ``42s``, ``350ms``."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n]
    return " ".join(shown[:2])
