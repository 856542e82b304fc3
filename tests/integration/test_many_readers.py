"""Hundreds of readers of one stream, on the process that produces it and on another one:
everyone gets the identical stream, and Redis connections do not grow with the readers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.conftest import REDIS_URL, ServerFactory
from tests.support.server import ServerProcess

# CI runs 2 x 100; `MANY_READERS=250 pytest tests/integration/test_many_readers.py` is the
# 500-reader run reported in docs/reliability.md.
READERS_PER_SERVER = int(os.environ.get("MANY_READERS", "100"))
TOKENS = 400
# 400 tokens in 8 s: the 200 readers must all attach while the stream runs, and on a loaded
# machine that took more than the 2 s the suite's usual pace (5 ms a token) gives
PACE_S = 0.02


POOL = 8  # Redis connections each process may open: far fewer than its readers


@pytest.fixture(scope="module")
def servers(server_factory: ServerFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    env = {"RAG_STREAM_REDIS_URL": REDIS_URL, "RAG_STREAM_STREAMING__REDIS_POOL_SIZE": str(POOL)}
    pair = (
        server_factory(wait=False, stub_delay_s=PACE_S, **env),
        server_factory(wait=False, stub_delay_s=PACE_S, **env),
    )
    for server in pair:  # started together: each start is mostly one busy core
        server.wait_ready()
    yield pair
    for server in pair:
        server.stop()


def _frames(body: str) -> str:
    """The events of an SSE body without keep-alive comments (they depend on timing)."""
    blocks = [b for b in body.replace("\r\n", "\n").split("\n\n") if b.strip()]
    kept = ["\n".join(x for x in b.split("\n") if not x.startswith(":")) for b in blocks]
    return "\n\n".join(k for k in kept if k)


def _redis_clients(names: dict[str, str]) -> dict[str, int]:
    clients = redis.Redis.from_url(REDIS_URL).client_list()
    return {label: sum(c.get("name") == name for c in clients) for label, name in names.items()}


async def test_hundreds_of_readers_get_the_identical_stream_on_few_redis_connections(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    producer, other = servers
    host = socket.gethostname()
    names = {
        "producer": f"rag-stream:{host}:{producer.proc.pid}",
        "other": f"rag-stream:{host}:{other.proc.pid}",
    }
    limits = httpx.Limits(max_connections=2 * READERS_PER_SERVER + 10)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        body = {"prompt": "many readers", "max_tokens": TOKENS}
        async with client.stream("POST", f"{producer.url}/v1/generate", json=body) as resp:
            head = ""
            async for chunk in resp.aiter_text():
                head += chunk
                if "\n\n" in head.replace("\r\n", "\n"):
                    break
        sid = head.split('"stream_id":"')[1].split('"')[0]
        started = asyncio.Event()
        first_seen = 0
        peak = dict.fromkeys(names, 0)

        async def read(base: str) -> str:
            nonlocal first_seen
            chunks: list[str] = []
            async with client.stream("GET", f"{base}/v1/streams/{sid}/events") as resp:
                assert resp.status_code == 200
                async for chunk in resp.aiter_text():
                    if not chunks:
                        first_seen += 1
                        if first_seen == 2 * READERS_PER_SERVER:
                            started.set()
                    chunks.append(chunk)
            return _frames("".join(chunks))

        async def sample() -> None:
            while True:
                counts = await asyncio.to_thread(_redis_clients, names)
                for label, n in counts.items():
                    peak[label] = max(peak[label], n)
                await asyncio.sleep(0.3)

        sampler = asyncio.create_task(sample())
        readers = [
            asyncio.create_task(read(server.url))
            for server in (producer, other)
            for _ in range(READERS_PER_SERVER)
        ]
        await asyncio.wait_for(started.wait(), 120)
        status = (await client.get(f"{producer.url}/v1/streams/{sid}")).json()
        assert status["status"] == "running"  # every reader attached to a live stream
        bodies = await asyncio.gather(*readers)
        sampler.cancel()
    assert len(bodies) == 2 * READERS_PER_SERVER
    digests = {hashlib.sha256(b.encode()).hexdigest() for b in bodies}
    assert len(digests) == 1  # every reader, on either process, got the same events
    events = [
        (block.split("event: ")[1].split("\n")[0], json.loads(block.split("data: ", 1)[1]))
        for block in bodies[0].split("\n\n")
    ]
    assert events[0][0] == "stream" and events[-1][0] == "done"
    assert sum(len(data["token_ids"]) for kind, data in events if kind == "token") == TOKENS
    # connections are per process, bounded by its pool, not by its readers
    print(f"readers: {2 * READERS_PER_SERVER}, peak Redis connections per process: {peak}")
    assert 0 < peak["producer"] <= POOL < READERS_PER_SERVER, peak
    assert 0 < peak["other"] <= POOL, peak
