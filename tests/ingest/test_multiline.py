"""Stack traces are joined into the event they follow; other lines never are."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

from app.events import LOGS, MAX_STRING_LEN
from ingest.adapters.logbase import LineContext
from ingest.adapters.logfile import log_events
from ingest.adapters.logformats import LOG_FORMATS
from ingest.adapters.multiline import Joiner
from ingest.model import ConvertError

HEAD = "[ERROR] [r2] [2024/05/01 12:00:01 002] [Api 20] boom"
PY_TRACE = [
    "Traceback (most recent call last):",
    '  File "x.py", line 1, in <module>',
    "KeyError: 'a'",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    '  File "x.py", line 3, in <module>',
    "ValueError: bad",
]
JAVA_TRACE = [
    "java.lang.IllegalStateException: x",
    "\tat a.b.C.d(C.java:10)",
    "Caused by: java.io.IOException: y",
    "\t... 3 more",
]


def _app(i: int, message: str = "ok") -> str:
    return f"[INFO] [r{i}] [2024/05/01 12:00:0{i} 000] [Api {i}] {message}"


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_python_and_java_traces_join_their_events(tmp_path: Path) -> None:
    lines = [_app(0), HEAD, *PY_TRACE, "", _app(1, "java"), *JAVA_TRACE, _app(2)]
    results = list(log_events(_write(tmp_path / "a.log", lines), "applog", host="h", tz=UTC))
    assert [r["message"].split("\n")[0] for r in results] == ["ok", "boom", "java", "ok"]  # type: ignore[index]
    assert results[1]["message"] == "\n".join(["boom", *PY_TRACE])  # type: ignore[index]
    assert results[2]["message"] == "\n".join(["java", *JAVA_TRACE])  # type: ignore[index]
    for r in results:
        assert LOGS.validate(r).fields == r


def test_a_malformed_line_is_an_error_not_part_of_a_trace(tmp_path: Path) -> None:
    lines = [HEAD, "Traceback (most recent call last):", "garbage line", _app(3)]
    results = list(log_events(_write(tmp_path / "b.log", lines), "applog", host="h", tz=UTC))
    assert len(results) == 3
    assert results[0]["message"] == "boom\nTraceback (most recent call last):"  # type: ignore[index]
    assert isinstance(results[1], ConvertError)
    assert (results[1].line, results[1].raw) == (3, b"garbage line")


def test_a_trace_at_the_start_of_input_is_dead_lettered_line_by_line(tmp_path: Path) -> None:
    results = list(
        log_events(_write(tmp_path / "c.log", ["\tat a.b(C.java:1)", _app(1)]), "applog", host="h", tz=UTC)
    )
    assert isinstance(results[0], ConvertError)
    assert not isinstance(results[1], ConvertError)


def test_formats_without_messages_do_not_join(tmp_path: Path) -> None:
    access = '1.2.3.4 - - [17/May/2015:10:05:03 +0000] "GET / HTTP/1.1" 200 1 "-" "x"'
    results = list(log_events(_write(tmp_path / "d.log", [access, "  indented"]), "apache", host="h", tz=UTC))
    assert not isinstance(results[0], ConvertError)
    assert isinstance(results[1], ConvertError)


def test_a_huge_trace_is_capped_with_a_marker() -> None:
    joiner = Joiner[int](LOG_FORMATS["applog"], LineContext(host="h"))
    assert joiner.feed(1, HEAD.encode(), 1) == []
    frame = "\tat " + "x" * 996
    for n in range(2, 200):
        assert joiner.feed(n, frame.encode(), n) == []
    (joined,) = joiner.flush()
    message = joined.result["message"]  # type: ignore[index]
    assert joined.pos == 199
    assert len(message) <= MAX_STRING_LEN
    assert message.endswith("more lines truncated]")
    assert LOGS.validate(joined.result).fields["message"] == message


def test_positions_follow_the_last_consumed_line() -> None:
    joiner = Joiner[int](LOG_FORMATS["applog"], LineContext(host="h"))
    assert joiner.feed(1, HEAD.encode(), 10) == []
    assert joiner.feed(2, b"  trace", 20) == []
    assert joiner.pending
    out = joiner.feed(3, _app(1).encode(), 30)
    assert [p.pos for p in out] == [20]
    assert [p.pos for p in joiner.flush()] == [30]
    assert not joiner.pending
