"""A local TCP listener that records every connection made to it: the test that a service
never fetches a URL it was given points those URLs here."""

from __future__ import annotations

import socket
import threading
import time


class Listener:
    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections: list[bytes] = []  # the first bytes each connection sent
        threading.Thread(target=self._accept, daemon=True, name="listener").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            with conn:
                conn.settimeout(1)
                try:
                    self.connections.append(conn.recv(4096))
                except OSError:
                    self.connections.append(b"")

    def wait_for(self, count: int, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        while len(self.connections) < count and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self._sock.close()
