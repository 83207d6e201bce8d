"""Log line parsers: the application format, the Apache error log and syslog (both RFCs)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from app.events import LOGS
from ingest.adapters.apache_error import parse_record as apache_error
from ingest.adapters.applog import parse_record as applog
from ingest.adapters.logbase import LineContext, LineParseError, normalise_level
from ingest.adapters.logformats import LOG_FORMATS, parse_log_line, require_host
from ingest.adapters.syslog import parse_received
from ingest.adapters.syslog import parse_record as syslog
from ingest.model import ConvertError, IngestArgError

CTX = LineContext(host="web-1")


def _ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


def test_applog_fields_and_milliseconds() -> None:
    line = "[ERROR] [req-7f3a] [2024/05/01 12:00:03 042] [PaymentService 88] charge failed: card declined"
    assert applog(line, CTX) == {
        "host": "web-1",
        "ts": "2024-05-01T12:00:03.042Z",
        "level": "ERROR",
        "request_id": "req-7f3a",
        "component": "PaymentService",
        "line": 88,
        "message": "charge failed: card declined",
    }


def test_applog_dash_reqid_component_without_line_and_zone() -> None:
    ctx = LineContext(host="h", tz=ZoneInfo("Europe/Berlin"))
    record = applog("[warn] [-] [2024/07/01 12:00:00 5] [Scheduler] late", ctx)
    assert (record["level"], record["request_id"], record["line"]) == ("WARNING", None, None)
    assert record["ts"] == "2024-07-01T10:00:00.005Z"  # CEST is UTC+2


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("junk", "level"),
        ("[INFO] [r1] [2024-05-01 12:00:03 042] [C 1] x", "ts"),
        ("[INFO] [r1] [2024/05/01 12:00:03 042] C 1 x", "component"),
        ("[INFO] [r1] [2024/13/01 12:00:03 042] [C 1] x", "ts"),
    ],
)
def test_applog_errors_name_the_bad_part(line: str, field: str) -> None:
    with pytest.raises(LineParseError) as err:
        applog(line, CTX)
    assert err.value.field == field


def test_apache_error_24_and_22() -> None:
    v24 = (
        "[Sun Mar 07 16:02:00.123456 2004] [core:error] [pid 1234:tid 5678] [client 1.2.3.4:5678] "
        "AH00126: Invalid URI in request"
    )
    assert apache_error(v24, CTX) == {
        "host": "web-1",
        "ts": "2004-03-07T16:02:00.123Z",
        "level": "ERROR",
        "component": "core",
        "pid": 1234,
        "client_ip": "1.2.3.4",
        "message": "AH00126: Invalid URI in request",
    }
    v22 = "[Sun Mar 07 16:02:00 2004] [warn] [client 10.0.0.1] File does not exist: /var/www/favicon.ico"
    record = apache_error(v22, CTX)
    assert (record["level"], record["component"], record["client_ip"]) == ("WARNING", None, "10.0.0.1")
    assert "pid" not in record
    with pytest.raises(LineParseError, match="after the time"):
        apache_error("[Sun Mar 07 16:02:00 2004] oops", CTX)


def test_syslog_rfc5424_with_structured_data_and_bom() -> None:
    line = (
        '<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog 8710 ID47 [exampleSDID@32473 iut="3" '
        'eventSource="App\\]x"] \ufeffAn application event'
    )
    assert syslog(line, CTX) == {
        "host": "mymachine.example.com",
        "ts": "2003-10-11T22:14:15.003Z",
        "facility": "local4",
        "severity": "notice",
        "level": "INFO",
        "program": "evntslog",
        "pid": 8710,
        "message": "An application event",
    }


def test_syslog_received_rfc5424_nil_values_use_sender_and_receive_time() -> None:
    ctx = LineContext(host="10.0.0.7", received_ms=_ms(2024, 1, 2, 3, 4, 5))
    record = parse_received("<11>1 - - - - - - disk failing", ctx)
    assert (record["host"], record["ts"], record["program"], record["pid"]) == (
        "10.0.0.7",
        "2024-01-02T03:04:05.000Z",
        None,
        None,
    )
    assert (record["facility"], record["severity"], record["level"]) == ("user", "err", "ERROR")


def test_syslog_rfc3164_with_and_without_hostname() -> None:
    ctx = LineContext(host="10.0.0.7", received_ms=_ms(2024, 10, 12, 0, 0, 0))
    record = syslog("<34>Oct 11 22:14:15 mymachine su[230]: 'su root' failed", ctx)
    assert record == {
        "host": "mymachine",
        "ts": "2024-10-11T22:14:15.000Z",
        "facility": "auth",
        "severity": "crit",
        "level": "CRITICAL",
        "program": "su",
        "pid": 230,
        "message": "'su root' failed",
    }
    local = syslog("<13>Oct  1 22:14:15 kernel: boot", ctx)
    assert (local["host"], local["program"], local["message"]) == ("10.0.0.7", "kernel", "boot")
    no_pri = syslog("Oct 11 22:14:15 web1 cron[99]: job done", ctx)
    assert (no_pri["host"], no_pri.get("facility"), no_pri["pid"]) == ("web1", None, 99)


@pytest.mark.parametrize(
    ("received", "stamp", "expected"),
    [
        ((2025, 1, 1, 0, 0, 5), "Dec 31 23:59:59", "2024-12-31T23:59:59.000Z"),  # old year
        ((2024, 12, 31, 23, 59, 50), "Jan  1 00:00:01", "2025-01-01T00:00:01.000Z"),  # sender ahead
        ((2024, 11, 21, 0, 0, 0), "Feb  5 17:32:18", "2024-02-05T17:32:18.000Z"),  # old file line
        ((2025, 3, 1, 0, 0, 0), "Feb 29 12:00:00", "2024-02-29T12:00:00.000Z"),  # latest leap year
    ],
)
def test_rfc3164_year_rule(received: tuple[int, ...], stamp: str, expected: str) -> None:
    ctx = LineContext(host="h", received_ms=_ms(*received))
    assert syslog(f"<13>{stamp} host app: x", ctx)["ts"] == expected


def test_syslog_received_without_timestamp_keeps_the_whole_message() -> None:
    ctx = LineContext(host="10.0.0.7", received_ms=_ms(2024, 1, 1))
    record = parse_received("<30>systemd[1]: Started", ctx)
    assert (record["message"], record["ts"]) == ("systemd[1]: Started", "2024-01-01T00:00:00.000Z")
    with pytest.raises(LineParseError, match="out of range"):
        syslog("<200>Oct 11 22:14:15 h a: x", ctx)
    with pytest.raises(LineParseError, match="no HOSTNAME"):
        parse_received("<13>1 - - - - - - x", LineContext(host=None))


def test_levels_are_normalised_across_formats() -> None:
    assert [normalise_level(x) for x in ("warn", "Err", "crit", "trace3", "notice", "fatal")] == [
        "WARNING", "ERROR", "CRITICAL", "DEBUG", "INFO", "CRITICAL"
    ]  # fmt: skip


def test_every_format_yields_schema_valid_records_or_errors() -> None:
    samples = {
        "apache": '1.2.3.4 - - [17/May/2015:10:05:03 +0000] "GET / HTTP/1.1" 200 1 "-" "x"',
        "nginx": '1.2.3.4 - - [17/May/2015:10:05:03 +0000] "GET / HTTP/1.1" 200 1 "-" "x"',
        "apache-error": "[Sun Mar 07 16:02:00 2004] [error] [pid 1] boom",
        "applog": "[INFO] [r] [2024/05/01 12:00:03 042] [C 1] ok",
        "syslog": "<13>1 2024-01-01T00:00:00Z h app - - - hi",
        "jsonl": '{"ts": "2024-01-01T00:00:00Z", "status": 500}',
    }
    assert set(samples) == set(LOG_FORMATS)
    for name, line in samples.items():
        result = parse_log_line(LOG_FORMATS[name], line, CTX, 1, line.encode())
        assert not isinstance(result, ConvertError), (name, result)
        assert LOGS.validate(result).fields == result
    bad = parse_log_line(LOG_FORMATS["jsonl"], '{"ts": "x"}', CTX, 7, b"raw")
    assert isinstance(bad, ConvertError)
    assert (bad.line, bad.field, bad.adapter) == (7, "ts", "jsonl")
    with pytest.raises(IngestArgError, match="--host is required"):
        require_host(LOG_FORMATS["applog"], None)
