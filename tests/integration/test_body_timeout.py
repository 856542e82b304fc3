"""A client that promises a body and stalls gets a 408 after limits.body_read_timeout_s, over a
real socket: first against the middleware on a minimal app under uvicorn, then against the
service itself (a real server process)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import anyio
import pytest
import uvicorn
from starlette.types import Message, Receive, Scope, Send

from rag_stream.api.timeouts import BodyReadTimeout
from tests.conftest import REDIS_URL, ServerFactory
from tests.support.server import ServerProcess, free_port

TIMEOUT_S = 0.5


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body like Starlette does (a disconnect is an exception); ``/wait`` then
    waits on ``receive`` the way an SSE response listens for the client leaving."""
    assert scope["type"] == "http"
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RuntimeError("client disconnected")
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    if scope["path"] == "/wait":
        seen: Message | None = None
        with anyio.move_on_after(TIMEOUT_S * 3):
            seen = await receive()
        body = b"saw " + (seen["type"].encode() if seen else b"nothing")
    length = str(len(body)).encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]}
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def app_url() -> Iterator[tuple[str, int]]:
    port = free_port()
    config = uvicorn.Config(
        BodyReadTimeout(_app, timeout_s=TIMEOUT_S),
        host="127.0.0.1",
        port=port,
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield "127.0.0.1", port
    server.should_exit = True
    thread.join(timeout=10)


def _exchange(
    address: tuple[str, int],
    path: str,
    declared: int,
    pieces: list[bytes],
    pause_s: float = 0.0,
) -> tuple[int, dict[str, str], bytes, float]:
    """Send headers promising ``declared`` bytes, then ``pieces`` with ``pause_s`` between
    them; read the answer until the server closes. Returns status, headers, body, seconds."""
    began = time.monotonic()
    with socket.create_connection(address, timeout=15) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
        )
        sock.sendall(head.encode())
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(pause_s)
            sock.sendall(piece)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    elapsed = time.monotonic() - began
    header_block, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = header_block.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body, elapsed


def test_a_stalled_body_gets_a_408_json_error_and_the_connection_closes(
    app_url: tuple[str, int],
) -> None:
    status, headers, body, elapsed = _exchange(app_url, "/echo", 100, [b"0123456789"])
    assert status == 408
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout"
    assert "request body" in error["message"]
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 3


def test_a_body_that_keeps_coming_is_not_cut(app_url: tuple[str, int]) -> None:
    """The limit is on each wait for more of the body, not on the whole upload."""
    pieces = [b"x" * 10] * 4
    status, _, body, elapsed = _exchange(app_url, "/echo", 40, pieces, pause_s=TIMEOUT_S * 0.6)
    assert status == 200 and body == b"x" * 40
    assert elapsed > TIMEOUT_S  # longer in total than one wait may last


def test_waiting_after_the_body_is_not_limited(app_url: tuple[str, int]) -> None:
    """An SSE response waits on receive() for the client to leave, for as long as it streams."""
    status, _, body, _ = _exchange(app_url, "/wait", 2, [b"{}"])
    assert (status, body) == (200, b"saw nothing")


def test_the_service_times_out_stalled_bodies_and_keeps_idle_connections(
    server_factory: ServerFactory,
) -> None:
    """Needs the middleware installed in create_app (limits.body_read_timeout_s), and
    keep_alive_s passed to uvicorn by `serve`."""
    server: ServerProcess = server_factory(
        stub_delay_s=0,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_LIMITS__BODY_READ_TIMEOUT_S="1",
    )
    address = ("127.0.0.1", server.port)
    try:
        for path in ("/v1/generate", "/v1/kbs"):
            status, headers, body, elapsed = _exchange(address, path, 100, [b'{"prompt": '])
            assert status == 408, (path, body)
            assert headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "request_timeout"
            assert 1 <= elapsed < 5
        _idle_connection_is_kept(address)
    finally:
        server.stop()


def _idle_connection_is_kept(address: tuple[str, int]) -> None:
    """keep_alive_s (75 s): a connection idle longer than uvicorn's own 5 s still takes the
    next request, so a client or proxy reusing it is not met by a close."""
    with socket.create_connection(address, timeout=15) as sock:
        reader = sock.makefile("rb")
        for i in range(2):
            if i:
                time.sleep(6.5)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            status = reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            assert reader.read(length).startswith(b"{")
