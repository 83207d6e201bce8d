"""Syslog TCP framing (RFC 6587): octet counting and newline framing, mixed and split."""

from __future__ import annotations

from ingest.syslogd.framing import FrameDecoder, FramingError


def test_octet_counting_and_newline_frames_mix_on_one_connection() -> None:
    decoder = FrameDecoder()
    frames = decoder.feed(b"11 <13>hello a<13>line one\n<13>line two\r\n")
    assert frames == [b"<13>hello a", b"<13>line one", b"<13>line two"]


def test_frames_split_across_reads_are_reassembled() -> None:
    decoder = FrameDecoder()
    stream = b"30 <13>1 - h app - - - multi\nline<14>newline framed\n"
    got: list[object] = []
    for i in range(len(stream)):
        got += decoder.feed(stream[i : i + 1])
    assert got == [b"<13>1 - h app - - - multi\nline", b"<14>newline framed"]


def test_an_oversized_octet_counted_frame_is_reported_and_skipped() -> None:
    decoder = FrameDecoder(max_bytes=50)
    frames = decoder.feed(b"60 " + b"z" * 30)
    frames += decoder.feed(b"z" * 30 + b"<3>after\n")
    assert isinstance(frames[0], FramingError)
    assert "60 bytes exceeds 50" in frames[0].reason
    assert frames[1:] == [b"<3>after"]


def test_an_oversized_newline_frame_is_reported_and_skipped() -> None:
    decoder = FrameDecoder(max_bytes=50)
    frames = decoder.feed(b"<1>" + b"x" * 80)
    frames += decoder.feed(b"x" * 10 + b"\n<2>ok\n")
    assert isinstance(frames[0], FramingError)
    assert frames[1:] == [b"<2>ok"]
    assert isinstance(decoder.feed(b"<1>" + b"y" * 60 + b"\n")[0], FramingError)


def test_end_of_stream() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"<4>no newline at end") == []
    assert decoder.close() == [b"<4>no newline at end"]
    decoder.feed(b"40 <4>cut")
    (error,) = decoder.close()
    assert isinstance(error, FramingError)
    assert "inside an octet-counted frame" in error.reason
