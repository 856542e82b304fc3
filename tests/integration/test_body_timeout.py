"""Slow clients get a 408 instead of holding a connection, over a real socket: a body that stalls
(limits.body_read_timeout_s) or trickles past limits.body_deadline_s (api/timeouts.py), request
headers that trickle past limits.header_timeout_s, and a connection that sends nothing past
keep_alive_s (api/http_protocol.py). First against the middleware and the protocol on a minimal
app under uvicorn, then against the service itself (a real server process), as `serve` runs it."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest
import uvicorn
from starlette.types import Message, Receive, Scope, Send

from rag_stream.api.http_protocol import bounded_head_protocol
from rag_stream.api.timeouts import BodyReadTimeout
from tests.conftest import REDIS_URL, ServerFactory
from tests.support.server import ServerProcess, free_port

TIMEOUT_S = 0.5  # for each piece of a body
DEADLINE_S = 1.5  # for a whole body, under /short (60 s elsewhere)
HEAD_TIMEOUT_S = 1.0  # for the request line and headers
KEEP_ALIVE_S = 1  # for a connection that sends nothing
# How much earlier than the client's clock a limit may end: uvloop's timers run on libuv's clock,
# whole milliseconds read once per turn of the loop, so a limit set mid-turn starts a little
# early (a clean-clone CI saw a 3 s deadline end after 2.9997 s of the client's).
CLOCK_SLACK_S = 0.02


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body like Starlette does (a disconnect is an exception); ``/wait`` then
    waits on ``receive`` the way an SSE response listens for the client leaving."""
    assert scope["type"] == "http"
    if scope["path"] == "/early":  # answers without reading the body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"early"})
        return
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


_LONG = BodyReadTimeout(_app, timeout_s=TIMEOUT_S, deadline_s=60)
_SHORT = BodyReadTimeout(_app, timeout_s=TIMEOUT_S, deadline_s=DEADLINE_S)


async def _limited(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "http" and scope["path"].startswith("/short/"):
        await _SHORT(scope, receive, send)
    else:
        await _LONG(scope, receive, send)


@pytest.fixture(scope="module")
def app_url() -> Iterator[tuple[str, int]]:
    port = free_port()
    config = uvicorn.Config(
        _limited,
        host="127.0.0.1",
        port=port,
        lifespan="off",
        log_level="warning",
        http=bounded_head_protocol(HEAD_TIMEOUT_S),
        timeout_keep_alive=KEEP_ALIVE_S,
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
        sock.sendall(_post_head(path, declared))
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(pause_s)
            sock.sendall(piece)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    elapsed = time.monotonic() - began
    return (*_parse(raw), elapsed)


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    header_block, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = header_block.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def _trickle(
    address: tuple[str, int],
    head: bytes,
    tail: bytes,
    every_s: float = 0.1,
    give_up_s: float = 20,
) -> tuple[bytes, float]:
    """Send ``head`` at once, then ``tail`` a byte every ``every_s`` (each in time for any
    per-piece limit) for as long as the connection stays open, keeping what the server sends.
    Returns that and the seconds from the first byte to the close (or to giving up, after
    ``give_up_s``)."""
    began = time.monotonic()
    raw = b""
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(head)
        unsent = iter(tail)
        try:
            while time.monotonic() - began < give_up_s:
                readable, _, _ = select.select([sock], [], [], every_s)
                if readable:
                    if not (chunk := sock.recv(65536)):
                        break  # closed
                    raw += chunk
                elif (byte := next(unsent, None)) is not None:
                    sock.sendall(bytes([byte]))
        except (ConnectionResetError, BrokenPipeError):  # (a byte sent as it closed)
            pass
    return raw, time.monotonic() - began


def _post_head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


SLOW_HEADERS = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 400


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
    assert TIMEOUT_S - CLOCK_SLACK_S <= elapsed < TIMEOUT_S + 3


def test_a_body_that_keeps_coming_is_not_cut(app_url: tuple[str, int]) -> None:
    """The wait limit is on each piece, not the whole upload (which has its deadline, 60 s here)."""
    pieces = [b"x" * 10] * 4
    status, _, body, elapsed = _exchange(app_url, "/echo", 40, pieces, pause_s=TIMEOUT_S * 0.6)
    assert status == 200 and body == b"x" * 40
    assert elapsed > TIMEOUT_S  # longer in total than one wait may last


def test_a_body_trickled_past_its_deadline_gets_a_408_naming_it(
    app_url: tuple[str, int],
) -> None:
    """A byte every 0.1 s never waits TIMEOUT_S for the next piece; the whole body is still
    bounded (before limits.body_deadline_s, the request stayed open as long as bytes came)."""
    raw, elapsed = _trickle(app_url, _post_head("/short/echo", 400), b"x" * 400)
    status, headers, body = _parse(raw)
    assert status == 408, raw
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout"
    assert "limits.body_deadline_s" in error["message"], error
    assert DEADLINE_S - CLOCK_SLACK_S <= elapsed < DEADLINE_S + 3


def test_request_headers_trickled_past_their_limit_get_a_408(app_url: tuple[str, int]) -> None:
    """uvicorn bounds no request's line and headers: they came a byte at a time for good."""
    raw, elapsed = _trickle(app_url, b"", SLOW_HEADERS)
    status, headers, body = _parse(raw)
    assert status == 408, raw
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout"
    assert "limits.header_timeout_s" in error["message"], error
    assert HEAD_TIMEOUT_S - CLOCK_SLACK_S <= elapsed < HEAD_TIMEOUT_S + 3


def test_line_breaks_that_start_no_request_do_not_hold_a_connection(
    app_url: tuple[str, int],
) -> None:
    """Empty lines before a request are allowed and start none: each one cancelled uvicorn's
    keep-alive timer, and no other ran."""
    raw, elapsed = _trickle(app_url, b"", b"\r\n" * 200)
    assert _parse(raw)[0] == 408, raw
    assert HEAD_TIMEOUT_S - CLOCK_SLACK_S <= elapsed < HEAD_TIMEOUT_S + 3


def test_a_connection_that_sends_nothing_is_closed_after_the_keep_alive(
    app_url: tuple[str, int],
) -> None:
    """uvicorn arms its keep-alive timer only after a response: a new silent connection had
    none."""
    began = time.monotonic()
    with socket.create_connection(app_url, timeout=30) as sock:
        assert sock.recv(1) == b""  # closed, without a word
    assert KEEP_ALIVE_S - CLOCK_SLACK_S <= time.monotonic() - began < KEEP_ALIVE_S + 3


def test_the_rest_of_a_body_no_one_waited_for_is_bounded_too(app_url: tuple[str, int]) -> None:
    """An early answer (an unknown KB, a refused key) leaves the body unread on a connection
    kept alive; what comes after it is the next request's head, and bounded as one."""
    head = _post_head("/early", 400).replace(b"Connection: close", b"Connection: keep-alive")
    raw, elapsed = _trickle(app_url, head, b"x" * 400)
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n"), raw
    assert b"early\r\n0\r\n\r\nHTTP/1.1 408 Request Timeout\r\n" in raw, raw
    assert HEAD_TIMEOUT_S - CLOCK_SLACK_S <= elapsed < HEAD_TIMEOUT_S + 3


def test_waiting_after_the_body_is_not_limited(app_url: tuple[str, int]) -> None:
    """An SSE response waits on receive() for the client to leave, for as long as it streams."""
    status, _, body, _ = _exchange(app_url, "/wait", 2, [b"{}"])
    assert (status, body) == (200, b"saw nothing")


def test_the_service_times_out_stalled_bodies_and_keeps_idle_connections(
    server_factory: ServerFactory,
) -> None:
    """Needs the middleware installed in create_app (limits.body_read_timeout_s and
    body_deadline_s), and the protocol (limits.header_timeout_s) and keep_alive_s passed to
    uvicorn by `serve`."""
    server: ServerProcess = server_factory(
        stub_delay_s=0,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_LIMITS__BODY_READ_TIMEOUT_S="1",
        RAG_STREAM_LIMITS__BODY_DEADLINE_S="3",
        RAG_STREAM_LIMITS__HEADER_TIMEOUT_S="2",
    )
    address = ("127.0.0.1", server.port)
    try:
        for path in ("/v1/generate", "/v1/kbs"):
            status, headers, body, elapsed = _exchange(address, path, 100, [b'{"prompt": '])
            assert status == 408, (path, body)
            assert headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "request_timeout"
            assert 1 <= elapsed < 5
        _trickling_clients_are_answered(address, deadline_s=3, head_timeout_s=2)
        _idle_connection_is_kept(address)
    finally:
        server.stop()


def _trickling_clients_are_answered(
    address: tuple[str, int], deadline_s: float, head_timeout_s: float
) -> None:
    """Twelve clients trickling a body to each of two routes, and twelve trickling headers, at
    once: each gets its 408 in time (before, all of them were held as long as they kept on)."""
    bodies = [(_post_head(p, 2000), b" " * 2000) for p in ("/v1/generate", "/v1/kbs")] * 12
    heads = [(b"", SLOW_HEADERS)] * 12
    with ThreadPoolExecutor(len(bodies) + len(heads)) as pool:
        answers = list(pool.map(lambda sent: _trickle(address, *sent), [*bodies, *heads]))
    for i, (raw, elapsed) in enumerate(answers):
        limit_s, setting = (
            (deadline_s, "body_deadline_s") if i < len(bodies) else (head_timeout_s, "header")
        )
        status, _, body = _parse(raw)
        assert status == 408, raw
        assert setting in json.loads(body)["error"]["message"]
        assert limit_s - CLOCK_SLACK_S <= elapsed < limit_s + 4, (i, elapsed)


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
