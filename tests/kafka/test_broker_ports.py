"""A restarted broker keeps its ports: the connections a killed broker leaves in TIME_WAIT on
its own port do not count as the port being taken."""

from __future__ import annotations

import socket
import time

from app.kafka.broker import free_port, port_free


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
