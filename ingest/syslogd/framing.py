"""Split a syslog TCP byte stream into messages (RFC 6587).

Each frame is detected on its own, so one connection may mix both methods:

- **octet counting**: ``LEN SP MSG``, where ``LEN`` is the decimal length of
  ``MSG`` in bytes. A frame starts this way when it begins with a digit
  (a message itself always starts with ``<``);
- **non-transparent framing**: the message ends at ``LF``; a trailing ``CR``
  and NUL bytes around it are removed.

A frame longer than ``max_bytes`` is reported as a :class:`FramingError`
and skipped (an octet-counted frame by its declared length, a newline frame up
to its ``LF``), so one bad sender cannot make the receiver buffer without
bound. At the end of the stream an unterminated newline frame is still a
message; an incomplete octet-counted frame is an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_MAX_LEN_DIGITS = 9


@dataclass(frozen=True, slots=True)
class FramingError:
    """A frame that could not be used; ``raw`` holds its first bytes at most."""

    reason: str
    raw: bytes


Frame = bytes | FramingError


class FrameDecoder:
    """Incremental decoder for one TCP connection. Not thread-safe."""

    def __init__(self, max_bytes: int = 64 * 1024) -> None:
        self._max = max_bytes
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized octet-counted frame still to drop
        self._skip_to_lf = False  # dropping an oversized newline frame

    def feed(self, data: bytes) -> list[Frame]:
        """Consume received bytes; return the frames completed by them."""
        self._buf += data
        out: list[Frame] = []
        while self._buf:
            if self._skip:
                n = min(self._skip, len(self._buf))
                del self._buf[:n]
                self._skip -= n
                continue
            if self._skip_to_lf:
                lf = self._buf.find(b"\n")
                if lf < 0:
                    self._buf.clear()
                    break
                del self._buf[: lf + 1]
                self._skip_to_lf = False
                continue
            frame = self._octet_counted() if self._buf[:1].isdigit() else self._newline()
            if frame is None:
                break
            if frame != b"":
                out.append(frame)
        return out

    def close(self) -> list[Frame]:
        """End of stream: the unterminated last frame, if any."""
        rest, self._buf = bytes(self._buf), bytearray()
        if not rest or self._skip or self._skip_to_lf:
            return []
        if rest[:1].isdigit() and b" " in rest[: _MAX_LEN_DIGITS + 1]:
            return [FramingError("connection closed inside an octet-counted frame", rest[:512])]
        message = _clean(rest)
        return [message] if message else []

    def _octet_counted(self) -> Frame | None:
        space = self._buf.find(b" ", 0, _MAX_LEN_DIGITS + 1)
        if space < 0:
            if len(self._buf) > _MAX_LEN_DIGITS:
                return self._newline()  # digits without a length: a newline frame after all
            return None
        digits = bytes(self._buf[:space])
        if not digits.isdigit():
            return self._newline()
        length = int(digits)
        if length > self._max:
            head = bytes(self._buf[: space + 1 + 512])
            del self._buf[: space + 1]
            self._skip = length
            return FramingError(f"octet-counted frame of {length} bytes exceeds {self._max}", head)
        end = space + 1 + length
        if len(self._buf) < end:
            return None
        message = bytes(self._buf[space + 1 : end])
        del self._buf[:end]
        return _clean(message)

    def _newline(self) -> Frame | None:
        lf = self._buf.find(b"\n")
        if lf < 0:
            if len(self._buf) > self._max:
                head = bytes(self._buf[:512])
                self._buf.clear()
                self._skip_to_lf = True
                return FramingError(f"frame without LF longer than {self._max} bytes", head)
            return None
        message = bytes(self._buf[:lf])
        del self._buf[: lf + 1]
        if len(message) > self._max:
            return FramingError(f"frame of {len(message)} bytes exceeds {self._max}", message[:512])
        return _clean(message)


def _clean(message: bytes) -> bytes:
    return message.strip(b"\x00").removesuffix(b"\r").removesuffix(b"\n")
