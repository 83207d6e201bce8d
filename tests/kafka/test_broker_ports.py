"""Ports: ``free_port`` never hands out a port twice nor one an outgoing connection could take,
and a restarted broker keeps its ports (the connections a killed broker leaves in TIME_WAIT on
its own port do not count as the port being taken)."""

from __future__ import annotations

import socket
import time

import pytest

from app.kafka import broker
from app.kafka.broker import free_port, port_free, port_range


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
