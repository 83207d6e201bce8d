"""A state group's live state served by the Python worker that holds it.

Spark hands a task to the first idle Python worker of its executor, not to the worker that ran
the task's partition last time: with two workers a stream partition changed worker about half
the time, and each change restored the whole partition from the JSON in Spark's state store
(at 100,000 devices about 40 % of the stateful stage's Python time, docs/spark.md). The worker
that ran a state group last, its *owner*, still holds it live, and between its own tasks waits
for Spark on a socket, with the interpreter free. So each owner also listens, on a thread of
its own, on a Unix socket named after the group; the worker that got the group's task sends it
the task's rows and gets back the output rows and the value to store, computed by the live
state, with no restore.

* **The name is the registry.** A group's socket has an abstract name (Linux: no file, gone
  with the process), so an owner that exits, or is killed, leaves nothing: the next task finds
  no one at the name and restores from the stored value, as before, and its worker becomes
  the owner.
* **Only the stored value decides.** The request carries a digest of the value Spark's state
  store gave the task; an owner whose live state left another value (a batch failed and was
  run again elsewhere) answers no, drops it and closes its name; the asker restores.
* **Signed.** Requests and replies are pickles, so each is signed (HMAC-SHA256) with the
  query's own random secret, which only the query's copies of the function hold; a message
  with another signature is dropped unread.
* **Bounded.** A reply that does not come within :data:`REPLY_TIMEOUT_S`, a reset, an owner
  gone: the asker restores and goes on. Off where abstract names do not exist
  (:data:`ENABLED`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import pickle
import selectors
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: abstract socket names exist on Linux only; elsewhere every change of worker restores
ENABLED = sys.platform.startswith("linux")
#: how long a worker waits for an owner's answer before it restores the state itself
REPLY_TIMEOUT_S = 60.0
_PREFIX = b"\0streamalert-live-"
_LENGTH = 8
_MAC = 32

Slot = tuple[str, Any]
#: an owner's answer to a request: (the slot, the digest of the stored value, the request's
#: payload) -> the reply's payload, or None when its live state is not that value
Serve = Callable[[Slot, bytes, Any], Any]


def digest(stored: str | bytes) -> bytes:
    """The digest a request carries of the value Spark's state store gave its task."""
    return hashlib.blake2b(stored.encode() if isinstance(stored, str) else stored, digest_size=16).digest()


def _name(slot: Slot) -> bytes:
    return _PREFIX + hashlib.sha1(repr(slot).encode(), usedforsecurity=False).hexdigest().encode()


def _send(sock: socket.socket, secret: bytes, payload: Any) -> None:
    body = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    mac = hmac.digest(secret, body, "sha256")
    sock.sendall(len(body).to_bytes(_LENGTH, "little") + mac + body)


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            msg = "the peer closed the connection"
            raise ConnectionError(msg)
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(sock: socket.socket, secret: bytes) -> Any:
    head = _exactly(sock, _LENGTH + _MAC)
    body = _exactly(sock, int.from_bytes(head[:_LENGTH], "little"))
    if not hmac.compare_digest(head[_LENGTH:], hmac.digest(secret, body, "sha256")):
        msg = "a message not signed with the query's secret"
        raise ConnectionError(msg)
    return pickle.loads(body)  # noqa: S301  # signed with the query's secret: one of its own processes


class Owner:
    """This process's listening names, one per state group it holds live, and the thread
    that answers them (started with the first)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._listening: dict[Slot, tuple[socket.socket, bytes, Serve]] = {}
        self._thread: threading.Thread | None = None

    def owns(self, slot: Slot) -> bool:
        return slot in self._listening

    def own(self, slot: Slot, secret: bytes, serve: Serve) -> None:
        """Listen at ``slot``'s name, unless another process holds it (its state is then kept
        here for this process's own tasks only)."""
        with self._lock:
            if slot in self._listening:
                self._listening[slot] = (self._listening[slot][0], secret, serve)
                return
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(_name(slot))
                sock.listen(4)
            except OSError:
                sock.close()
                return
            self._listening[slot] = (sock, secret, serve)
            self._selector.register(sock, selectors.EVENT_READ, slot)
            if self._thread is None:
                self._thread = threading.Thread(target=self._answer_forever, name="live-states", daemon=True)
                self._thread.start()

    def release(self, slot: Slot) -> None:
        """Stop listening at ``slot``'s name: this process no longer holds its live state."""
        with self._lock:
            held = self._listening.pop(slot, None)
            if held is not None:
                self._selector.unregister(held[0])
                held[0].close()

    def _answer_forever(self) -> None:
        while True:
            for key, _ in self._selector.select(timeout=1.0):
                try:
                    conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                except OSError:
                    continue  # released meanwhile
                with conn:
                    try:
                        self._answer(conn, key.data)
                    except Exception:  # it must go on: an owner that stops answering stalls its askers
                        logger.exception("live state %r: answering a request failed", key.data)

    def _answer(self, conn: socket.socket, slot: Slot) -> None:
        held = self._listening.get(slot)
        if held is None:
            return
        _, secret, serve = held
        conn.settimeout(REPLY_TIMEOUT_S)
        try:
            stored_digest, payload = _receive(conn, secret)
        except (OSError, ValueError, pickle.UnpicklingError) as exc:
            logger.warning("live state %r: a request refused: %s", slot, exc)
            return
        try:
            reply = serve(slot, stored_digest, payload)
        except Exception:  # the asker restores and runs it itself, where an error fails its task
            logger.exception("live state %r: answering a request failed", slot)
            reply = None
        if reply is None:
            self.release(slot)  # before the answer: the asker takes the name next
        try:
            _send(conn, secret, reply)
        except OSError as exc:
            logger.info("live state %r: the asker left before the answer: %s", slot, exc)


_OWNER: Owner | None = None


def owner() -> Owner:
    """This process's :class:`Owner` (a forked child gets a new one: threads do not survive a fork)."""
    global _OWNER  # one per process
    if _OWNER is None or _OWNER.pid != os.getpid():
        _OWNER = Owner()
    return _OWNER


def ask(slot: Slot, secret: bytes, stored_digest: bytes, payload: Any) -> Any:
    """The reply of the process that holds ``slot`` live, or None: no one does, it holds
    another value than ``stored_digest``'s, it failed, or it did not answer in time."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(REPLY_TIMEOUT_S)
    with sock:
        try:
            sock.connect(_name(slot))
        except OSError:
            return None  # no owner
        try:
            _send(sock, secret, (stored_digest, payload))
            return _receive(sock, secret)
        except (OSError, ValueError, pickle.UnpicklingError) as exc:
            logger.info("live state %r: no answer from its owner (%s); restoring it here", slot, exc)
            return None
