"""Syslog lines of a file (`convert log`, `replay`, `tail`) against messages received live: a
line with no time of its own is invalid in a file (its read time is not its time), while the
server stamps such a message with its receive time, as a relay does (RFC 3164 4.3.3)."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import pytest

from ingest.adapters.logbase import LineContext, LineParseError
from ingest.adapters.logfile import log_events
from ingest.adapters.syslog import parse_received, parse_record
from ingest.model import ConvertError

RECEIVED = 1_704_067_200_000  # 2024-01-01T00:00:00Z


def test_a_headerless_line_of_a_file_is_invalid_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "sys.log"
    path.write_text("<34>Oct 11 22:14:15 mymachine su: su root failed\ngarbage\n<13>1 - h app - - - x\n")
    results = list(log_events(str(path), "syslog", host="h1", tz=UTC, now_ms=RECEIVED))
    event, garbage, nil = results  # garbage was an event stamped with the conversion's wall clock
    assert not isinstance(event, ConvertError) and event["ts"] == "2023-10-11T22:14:15.000Z"
    assert isinstance(garbage, ConvertError)
    assert (garbage.line, garbage.field, garbage.raw) == (2, "ts", b"garbage")
    assert garbage.reason.startswith("no syslog header (no timestamp): expected 'Mmm dd hh:mm:ss HOST")
    assert isinstance(nil, ConvertError)
    assert (nil.line, nil.field) == (3, "ts")
    assert nil.reason.startswith("RFC 5424 TIMESTAMP is '-' (nil)")


def test_a_trace_after_a_syslog_line_still_joins_its_message(tmp_path: Path) -> None:
    path = tmp_path / "sys.log"
    path.write_text("<11>1 2024-01-01T00:00:00Z h app - - - boom\nTraceback (most recent call last):\n  x\n")
    (event,) = log_events(str(path), "syslog", host=None, tz=UTC, now_ms=RECEIVED)
    assert not isinstance(event, ConvertError)
    assert event["message"] == "boom\nTraceback (most recent call last):\n  x"


@pytest.mark.parametrize("line", ["garbage", "<30>systemd[1]: Started", "<13>1 - h app - - - x"])
def test_a_file_line_without_a_time_is_refused_but_a_received_message_gets_the_receive_time(
    line: str,
) -> None:
    ctx = LineContext(host="10.0.0.7", received_ms=RECEIVED)
    with pytest.raises(LineParseError) as err:
        parse_record(line, ctx)
    assert err.value.field == "ts"
    assert parse_received(line, ctx)["ts"] == "2024-01-01T00:00:00.000Z"


def test_a_headerless_file_line_without_host_names_the_missing_time_first() -> None:
    with pytest.raises(LineParseError, match=r"^no syslog header"):
        parse_record("garbage", LineContext(host=None, received_ms=RECEIVED))
