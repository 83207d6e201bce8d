"""Ports: ``free_port`` never hands out a port twice nor one an outgoing connection could take,
and a restarted broker keeps its ports (the connections a killed broker leaves in TIME_WAIT on
its own port do not count as the port being taken)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from app.kafka import broker
from app.kafka.broker import PortBook, claim_port, free_port, port_free, port_range
from app.runtime.settings import PROJECT_ROOT


def test_free_port_hands_out_no_port_twice_and_none_from_the_kernels_outgoing_range() -> None:
    # 500 calls: with the kernel's choice, 2 % of sets of 22 held a duplicate
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    low, high = port_range()
    assert 1024 < low <= high
    assert all(low <= p <= high for p in ports)


def test_free_port_passes_over_a_listening_port_and_falls_back_to_the_kernel_when_its_range_is_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        taken = server.getsockname()[1]
        monkeypatch.setattr(broker, "port_range", lambda: (taken, taken + 1))
        picked = free_port() if port_free(taken + 1) else pytest.skip(f"port {taken + 1} is in use")
        assert picked == taken + 1
        fallback = [free_port() for _ in range(3)]  # the range holds nothing left: the kernel's choice
        assert taken not in fallback and picked not in fallback
        assert len(set(fallback)) == 3


def test_a_port_whose_server_closed_its_connections_first_is_still_free() -> None:
    port = free_port()
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        assert not port_free(port)  # listening: taken
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first, as a killed broker's kernel does: TIME_WAIT
        time.sleep(0.05)
        client.close()
    with socket.socket() as plain:  # what the check did before: a bind without SO_REUSEADDR fails
        try:
            plain.bind(("127.0.0.1", port))
            in_time_wait = False
        except OSError:
            in_time_wait = True
    assert in_time_wait, "the test did not leave the port in TIME_WAIT"
    assert port_free(port)


#: a process that picks a port and holds its claim until its stdin closes, or asks for one
CLAIMER = """
import sys
from app.kafka.broker import claim_port, free_port, port_free
if sys.argv[1] == "pick":
    print(free_port(), flush=True)
    sys.stdin.read()
else:
    port = int(sys.argv[2])
    print(claim_port(port), port_free(port), flush=True)
"""


def _claimer(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLAIMER, *args], cwd=PROJECT_ROOT, text=True,
        stdout=subprocess.PIPE, **kwargs,
    )  # fmt: skip


def _ask_in_another_process(port: int) -> tuple[bool, bool]:
    """Whether another process gets the claim to ``port``, and whether the port was free there."""
    with _claimer("claim", str(port)) as proc:
        out, _ = proc.communicate(timeout=60)
    claimed, free = out.split()
    return claimed == "True", free == "True"


def _claims_in_another_process(port: int) -> bool:
    return _ask_in_another_process(port)[0]


def test_a_port_another_process_handed_out_is_not_handed_out_here_until_that_process_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two processes picking at once (two `make run`s, two test processes side by side) never
    hand out one port, though nothing listens on it yet; the claim ends with its process."""
    holder = _claimer("pick", stdin=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        assert port_free(port)  # nothing listens there: only the other process's claim keeps it
        assert not claim_port(port)
        monkeypatch.setattr(broker, "port_range", lambda: (port, port))  # the range is that port
        assert port not in [free_port() for _ in range(3)]  # the kernel's choice instead
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    assert claim_port(port)  # the claim ended with its process; now this one holds it
    assert not _claims_in_another_process(port)


def test_a_port_asked_for_that_is_in_use_is_not_claimed_and_a_forgotten_claim_is_released() -> None:
    for _ in range(5):
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            taken = server.getsockname()[1]
            assert not claim_port(taken)
            assert _claims_in_another_process(taken) is False  # in use, whoever asks
        claimed, free = _ask_in_another_process(taken)
        if claimed:
            break  # a failed ask held no claim
        # the kernel's port, closed, may go at once to another process's outgoing connection:
        # the ask then says nothing of a claim, and the test takes another port
        assert not free, f"port {taken} is free, yet another process cannot claim it"
    else:
        pytest.fail("five ports in a row were taken by other sockets as soon as they closed")
    book = PortBook(remembered=2)
    first = book.free()
    assert not _claims_in_another_process(first)
    book.free(), book.free()  # the third port handed out: the first is forgotten, its claim released
    assert _claims_in_another_process(first)
