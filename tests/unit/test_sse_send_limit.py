"""The limit on each SSE send (``streaming/sse.py``): a client that stops reading is let go after
it, whichever task's send waits (the stream's or a keep-alive's); sends that each return at
once never reach it, however long the stream lasts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from sse_starlette.sse import SendTimeoutError
from starlette.types import Message

from rag_stream.streaming.sse import sse_response

LIMIT_S = 0.3
GUARD_S = 20.0  # a test that reaches it failed: the limit did not end the response
SCOPE = {"type": "http", "method": "GET", "path": "/", "headers": []}


async def never_disconnects() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


class Client:
    """An ASGI ``send`` that takes ``reads`` body chunks, each in ``read_s``, then stops
    reading (waits for good)."""

    def __init__(self, reads: int, read_s: float = 0.0) -> None:
        self.reads = reads
        self.read_s = read_s
        self.bodies: list[bytes] = []
        self.stalled = asyncio.Event()

    async def send(self, message: Message) -> None:
        if message["type"] != "http.response.body":
            return
        if len(self.bodies) >= self.reads:
            self.stalled.set()
            await asyncio.Event().wait()
        await asyncio.sleep(self.read_s)
        self.bodies.append(message["body"])


async def let_go(chunks: AsyncIterator[bytes], client: Client, keepalive_s: float) -> float:
    """Serve ``chunks`` to ``client`` until the send limit ends the response (it must, before
    the guard): how long that took."""
    response = sse_response(chunks, keepalive_s=keepalive_s, send_timeout_s=LIMIT_S)
    started = time.monotonic()
    with pytest.raises(SendTimeoutError):
        async with asyncio.timeout(GUARD_S):
            await response(SCOPE, never_disconnects, client.send)
    assert client.stalled.is_set()  # (the limit came after the client stopped reading)
    return time.monotonic() - started  # the limit's time, unless the guard's (a failure)


async def test_a_client_that_stops_reading_is_let_go_after_the_limit() -> None:
    cleaned = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        try:
            for i in range(1_000):
                yield f"data: {i}\n\n".encode()
        finally:
            cleaned.set()

    client = Client(reads=3)
    assert LIMIT_S <= await let_go(chunks(), client, keepalive_s=60) < GUARD_S / 2
    assert client.bodies == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    assert cleaned.is_set()  # the stream's iterator was closed (its reader lets go of its feed)


async def test_a_keep_alive_that_cannot_be_sent_is_let_go_too() -> None:
    async def quiet() -> AsyncIterator[bytes]:
        await asyncio.Event().wait()  # nothing to send: only keep-alives go out
        yield b""

    client = Client(reads=0)
    assert await let_go(quiet(), client, keepalive_s=1) < GUARD_S / 2


async def test_sends_within_the_limit_never_reach_it_however_long_the_stream() -> None:
    """Each send takes a third of the limit and the stream several limits, so sends are in
    flight whenever the timer looks: all of it arrives, and it ends."""
    steps = 12

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(steps):
            yield f"data: {i}\n\n".encode()

    client = Client(reads=steps + 1, read_s=LIMIT_S / 3)
    response = sse_response(chunks(), keepalive_s=60, send_timeout_s=LIMIT_S)
    started = time.monotonic()
    async with asyncio.timeout(GUARD_S):
        await response(SCOPE, never_disconnects, client.send)
    assert time.monotonic() - started > 2 * LIMIT_S
    assert client.bodies[:steps] == [f"data: {i}\n\n".encode() for i in range(steps)]
