"""Access-log converter on the real 10,000-line log and on crafted lines."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from app.events import LOGS
from ingest.adapters import apache_events
from ingest.adapters.apache import parse_line
from ingest.model import ConvertError, IngestArgError
from tests.conftest import APACHE_LOG, require_dataset

GOOD = (
    '1.2.3.4 - frank [17/May/2015:12:05:03 +0200] "GET /a?b=1 HTTP/1.1" 200 2326 '
    '"http://ref/" "Mozilla/5.0 \\"quoted\\""'
)


def test_real_log_converts_all_but_one_truncated_line() -> None:
    path = require_dataset(APACHE_LOG)
    results = list(apache_events(str(path), host="www"))
    errors = [r for r in results if isinstance(r, ConvertError)]
    events = [r for r in results if not isinstance(r, ConvertError)]

    assert len(results) == 10_000
    assert len(events) == 9_999
    # line 8899 of the real file ends inside the user agent (no closing quote)
    assert [(e.line, e.adapter) for e in errors] == [(8899, "apache")]
    assert errors[0].raw.startswith(b"46.118.127.106 - - [20/May/2015:12:05:17 +0000]")
    assert "user agent" in errors[0].reason
    assert Counter(e["status"] for e in events) == {
        200: 9125, 304: 445, 404: 213, 301: 164, 206: 45, 500: 3, 403: 2, 416: 2
    }  # fmt: skip
    assert sum(e["bytes"] is None for e in events) == 669
    assert sum(e["referrer"] is None for e in events) == 4072
    assert all(isinstance(e["status"], int) for e in events)
    assert all(e["bytes"] is None or isinstance(e["bytes"], int) for e in events)
    assert events[0]["ts"] == "2015-05-17T10:05:03.000Z"


def test_every_real_event_validates_against_the_logs_schema() -> None:
    path = require_dataset(APACHE_LOG)
    for record in apache_events(str(path), host="www"):
        if isinstance(record, ConvertError):
            continue
        assert LOGS.validate(record).fields == record


def test_fields_offsets_and_escapes() -> None:
    record = parse_line(GOOD, host="h")
    assert record == {
        "host": "h",
        "ts": "2015-05-17T10:05:03.000Z",
        "client_ip": "1.2.3.4",
        "method": "GET",
        "path": "/a?b=1",
        "protocol": "HTTP/1.1",
        "status": 200,
        "bytes": 2326,
        "referrer": "http://ref/",
        "user_agent": 'Mozilla/5.0 "quoted"',
    }


def test_dash_bytes_and_referrer_become_null() -> None:
    line = '5.6.7.8 - - [17/May/2015:10:05:03 +0000] "HEAD / HTTP/1.0" 304 - "-" "curl/8"'
    record = parse_line(line, host="h")
    assert not isinstance(record, ConvertError)
    assert (record["status"], record["bytes"], record["referrer"]) == (304, None, None)


def test_bad_line_yields_error_with_its_line_number(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    bad = '9.9.9.9 - - [32/Foo/2015:10:05:03 +0000] "GET / HTTP/1.1" 200 1 "-" "x"'
    log.write_bytes(f"{GOOD}\n{bad}\ngarbage\n".encode() + b"\xff\n")
    results = list(apache_events(str(log), host="h"))
    assert not isinstance(results[0], ConvertError)
    errors = results[1:]
    assert all(isinstance(e, ConvertError) for e in errors)
    assert [e.line for e in errors] == [2, 3, 4]
    assert "month" in errors[0].reason
    assert errors[1].raw == b"garbage"
    assert "UTF-8" in errors[2].reason


def test_host_is_required() -> None:
    with pytest.raises(IngestArgError, match="--host"):
        apache_events("unused.log", host=" ")
