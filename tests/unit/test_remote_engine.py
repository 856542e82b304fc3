"""The remote engine forgets a request once it is over, however its reader stopped.

A request aborted while its response is open is remembered (so that its end reads as
``cancelled`` rather than as a failed replica); before, a caller that stopped reading first,
as the token phase does when a stop string appears, left its id remembered for the life of
the process: one entry per such request, for ever.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx

from rag_stream.generation.engine import Sampling
from rag_stream.generation.remote_engine import RemoteEngine
from rag_stream.generation.replicas import Replica, Router
from tests.support.fakes import ByteTokenizer


def _replica(tokens: int) -> httpx.MockTransport:
    """A vLLM server whose completions stream sends ``tokens`` tokens, one every 10 ms, and
    no finish (the requests here are aborted before)."""

    async def respond(request: httpx.Request) -> httpx.Response:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(tokens):
                choice = {"index": 0, "text": "a", "token_ids": [97 + i % 26]}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n".encode()
                await asyncio.sleep(0.01)

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chunks())

    return httpx.MockTransport(respond)


def _engine(tokens: int = 100) -> RemoteEngine:
    client = httpx.AsyncClient(transport=_replica(tokens))
    router = Router([Replica("http://engine:8000")], 8)
    return RemoteEngine(ByteTokenizer(), "m", 2048, 16, router, client, send_priority=False)


async def test_a_request_aborted_by_a_reader_that_stops_reading_is_forgotten() -> None:
    engine = _engine()
    steps = engine.generate("req-1", [1, 2, 3], Sampling(max_tokens=100))
    seen = 0
    async for _step in steps:
        seen += 1
        if seen == 3:  # a stop string, say: abort, then stop reading
            await engine.abort("req-1")
            break
    await steps.aclose()  # type: ignore[attr-defined]
    assert "req-1" not in engine._aborted
    await engine.close()


async def test_a_request_aborted_and_read_to_its_end_ends_cancelled_and_is_forgotten() -> None:
    engine = _engine(tokens=10)
    reasons = []
    seen = 0
    async for step in engine.generate("req-2", [1, 2, 3], Sampling(max_tokens=100)):
        seen += 1
        reasons.append(step.finish_reason)
        if seen == 3:
            await engine.abort("req-2")
    assert reasons[-1] == "cancelled"
    assert "req-2" not in engine._aborted
    await engine.close()
