"""A TCP proxy between a client and a server that a test can tell to cut every connection.

``drop()`` closes both sides of every open connection at once, as a network failure would: the
client's response ends mid-body (``reset=True``: with a TCP reset instead of a clean close).
``refuse_next(n)`` closes the next ``n`` connections as soon as they are accepted (a server
that is unreachable for a while). ``lose_next_answer()`` lets the next request through and cuts
its connection when the answer's first bytes come back, keeping them (``lost``): the server did
the work, the client never hears of it. Threads, so it works under sync and async clients alike.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType


class TcpProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self._upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._open: list[tuple[socket.socket, socket.socket]] = []
        self._refuse = 0
        self._lose = 0
        self.lost: list[bytes] = []  # the first bytes of each answer lost
        self.accepted = 0  # connections accepted so far (refused ones included)
        self._closed = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def drop(self, reset: bool = False) -> int:
        """Cut every open connection; return how many there were."""
        with self._lock:
            pairs, self._open = self._open, []
        for client, upstream in pairs:
            _cut(client, reset)
            _cut(upstream, reset)
        return len(pairs)

    def refuse_next(self, n: int) -> None:
        with self._lock:
            self._refuse = n

    def lose_next_answer(self) -> None:
        with self._lock:
            self._lose = 1

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.drop()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self.accepted += 1
                refuse = self._refuse > 0
                self._refuse -= refuse
                lose = not refuse and self._lose > 0
                self._lose -= lose
            if refuse:
                _cut(client, reset=False)
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=10)
                upstream.settimeout(None)
            except OSError:
                _cut(client, reset=False)
                continue
            with self._lock:
                self._open.append((client, upstream))
            for src, dst, losing in ((client, upstream, False), (upstream, client, lose)):
                args = (src, dst, losing)
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, lose: bool = False) -> None:
        try:
            while data := src.recv(65536):
                if lose:
                    self.lost.append(data)
                    break  # (both ends are cut below)
                dst.sendall(data)
        except OSError:
            pass  # cut by drop(), or the other side went away
        finally:
            with self._lock:
                self._open = [p for p in self._open if src not in p]
            _cut(src, reset=False)
            _cut(dst, reset=False)


def _cut(sock: socket.socket, reset: bool) -> None:
    # shutdown() also wakes a pump thread blocked in recv() on the socket (close() alone does
    # not, and the socket would live on until that recv returned)
    with contextlib.suppress(OSError):
        if reset:  # SO_LINGER 0: the close sends RST, not FIN; SHUT_RD sends nothing
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RD)
        else:
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
