"""The event log under Redis faults and dead producers (real redis-server, real server processes
on the paced stub engine, where timing is the point)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse
from redis.asyncio import Redis as AsyncRedis

from rag_stream.streaming.redis_log import RedisEventLog
from tests.conftest import REDIS_URL, STUB_DELAY_S, ServerFactory
from tests.support.fakes import stub_engine, toy_streams
from tests.support.redis_server import RedisServer
from tests.support.server import ServerProcess
from tests.support.sse import Frame, read_stream
from tests.unit.test_streams import check_one_stream


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


def _status(server: ServerProcess, sid: str) -> dict[str, object]:
    return dict(httpx.get(f"{server.url}/v1/streams/{sid}", timeout=30).json())


def test_a_log_lost_by_a_redis_restart_is_never_extended(
    server_factory: ServerFactory, private_redis: RedisServer
) -> None:
    server = server_factory(
        stub_delay_s=STUB_DELAY_S,
        RAG_STREAM_REDIS_URL=private_redis.url,
        RAG_STREAM_LIMITS__MAX_TOKENS="4000",
    )

    def restart_redis_at_the_fifth_frame(frame: Frame) -> None:
        if frame.id == 4 and frame.event == "token":
            private_redis.kill()  # no persistence: it comes back empty
            time.sleep(0.4)
            private_redis.start()

    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            frames = read_stream(
                client,
                "POST",
                "/v1/generate",
                json={"prompt": "lose my head", "max_tokens": 2000},  # 10 s of tokens
                on_frame=restart_redis_at_the_fifth_frame,
            )
        sid = frames[0].data["stream_id"]
        assert frames[-1].event == "error", frames[-1]
        assert frames[-1].data["code"] == "log_lost"
        assert all(f.event != "done" for f in frames)
        status = _status(server, sid)
        assert status["status"] == "error" and status["finish_reason"] == "log_lost"
        assert status["model"] == "stub" and float(str(status["created"])) > 0
        # what is left in the log is the error alone: no token written after the restart
        with httpx.Client(base_url=server.url, timeout=60) as client:
            replay = read_stream(client, "GET", f"/v1/streams/{sid}/events")
        assert [f.event for f in replay] == ["error"]
        assert replay[0].data["code"] == "log_lost"
        # the restarted Redis serves new streams
        r = httpx.post(
            server.url + "/v1/generate", json={"prompt": "x", "max_tokens": 3, "stream": False}
        )
        assert r.status_code == 200, r.text
    finally:
        server.stop()


def test_a_chat_stream_whose_log_is_lost_still_resumes_in_the_chat_format(
    server_factory: ServerFactory, private_redis: RedisServer
) -> None:
    """The lost log's meta keeps the stream's creation fields: its tenant, and the format a
    resume renders (it kept the model alone, so a chat stream resumed as our own SSE events,
    which an OpenAI client cannot read, and the chaos campaign judged the stream wrong)."""
    server = server_factory(
        stub_delay_s=STUB_DELAY_S,
        RAG_STREAM_REDIS_URL=private_redis.url,
        RAG_STREAM_LIMITS__MAX_TOKENS="4000",
    )
    body = {
        "model": "stub",
        "messages": [{"role": "user", "content": "lose my head"}],
        "max_tokens": 2000,
        "stream": True,
    }
    seen: list[str] = []
    try:
        with (
            httpx.Client(base_url=server.url, timeout=60) as client,
            connect_sse(client, "POST", "/v1/chat/completions", json=body) as source,
        ):
            sid = source.response.headers["x-stream-id"]
            for sse in source.iter_sse():
                seen.append(sse.data)
                if len(seen) == 5:
                    private_redis.kill()  # no persistence: it comes back empty
                    time.sleep(0.4)
                    private_redis.start()
        assert seen[-1] == "[DONE]" and json.loads(seen[-2])["error"]["code"] == "log_lost"
        with (
            httpx.Client(base_url=server.url, timeout=60) as client,
            connect_sse(client, "GET", f"/v1/streams/{sid}/events") as source,
        ):
            replay = [sse.data for sse in source.iter_sse()]
        assert replay == seen[-2:]  # the error chunk and [DONE], as the client read them
    finally:
        server.stop()


def test_requests_right_after_a_redis_restart_succeed(
    server_factory: ServerFactory, private_redis: RedisServer
) -> None:
    """Every idle connection of the pool is dead once Redis has restarted; each one gave a
    request a 503 ("Connection closed by server") although Redis was back (the chaos
    campaign's Redis rounds). A command now goes again on a new connection."""
    server = server_factory(stub_delay_s=STUB_DELAY_S, RAG_STREAM_REDIS_URL=private_redis.url)

    def generate(client: httpx.Client, prompt: str) -> httpx.Response:
        body = {"prompt": prompt, "max_tokens": 40, "stream": False}
        return client.post("/v1/generate", json=body)

    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with ThreadPoolExecutor(6) as pool:  # the pool holds several connections now
                warm = list(pool.map(lambda i: generate(client, f"warm {i}"), range(6)))
            assert all(r.status_code == 200 for r in warm), [r.text for r in warm]
            private_redis.kill()
            private_redis.start()  # empty: nothing of the earlier streams is needed
            for i in range(8):
                r = generate(client, f"after {i}")
                assert r.status_code == 200, (i, r.text)
            assert client.get("/readyz").status_code == 200
    finally:
        server.stop()


def test_a_killed_producer_is_taken_over_long_before_its_lease_expires(
    server_factory: ServerFactory, stub_server: ServerProcess
) -> None:
    # The session's stub server (same engine, Redis and limits) takes over. A lease lives in
    # Redis with the length its holder gave it: the victim's 60 s is what the takeover must
    # not wait for, whatever the survivor's own setting.
    survivor = stub_server
    victim = server_factory(
        stub_delay_s=STUB_DELAY_S,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_LIMITS__MAX_TOKENS="4000",
        RAG_STREAM_STREAMING__LEASE_MS="60000",  # only presence can explain a fast takeover
    )
    try:
        with httpx.Client(base_url=victim.url, timeout=60) as client:
            first = read_stream(
                client,
                "POST",
                "/v1/generate",
                json={"prompt": "p", "max_tokens": 1000},
                stop_after=5,
            )
        victim.kill()
        killed_at = time.monotonic()
        sid = first[0].data["stream_id"]
        assert _status(survivor, sid)["status"] == "running"
        arrivals: list[float] = []
        with httpx.Client(base_url=survivor.url, timeout=60) as client:
            rest = read_stream(
                client,
                "GET",
                f"/v1/streams/{sid}/events",
                headers={"Last-Event-ID": str(first[-1].id)},
                on_frame=lambda _f: arrivals.append(time.monotonic()),
            )
        frames = first + rest
        assert [f.id for f in frames] == list(range(len(frames)))
        assert frames[-1].event == "done" and frames[-1].data["finish_reason"] == "length"
        assert sum(len(f.data["token_ids"]) for f in frames if f.event == "token") == 1000
        # the first event the dead process had not written arrived well within the lease
        new_events = [t for f, t in zip(rest, arrivals, strict=True) if f.id > first[-1].id]
        assert new_events and new_events[0] - killed_at < 20, new_events[0] - killed_at
        assert _status(survivor, sid)["status"] == "done"
    finally:
        victim.stop()


async def test_a_producer_replaced_while_alive_never_writes_again() -> None:
    """Fencing: if a live producer is (wrongly) thought dead and replaced, its next append is
    refused, it stops, and the log stays one contiguous stream."""
    client = AsyncRedis.from_url(REDIS_URL)
    log = RedisEventLog(client, prefix=f"rs-fence-{uuid.uuid4().hex[:8]}")
    engine = stub_engine(delay_s=0.002)
    first, kind = toy_streams(log, engine, lease_ms=60_000)
    second, _ = toy_streams(log, engine, lease_ms=60_000)
    await first.producers.announce()
    sid = await first.start(kind, kind.accept([5, 6, 7], 600))
    seen = 0
    async for _ in first.follow(sid):
        seen += 1
        if seen == 20:
            break
    assert first.producers.owns(sid)
    # its presence vanishes; the process lives on
    await log.retire(first.producers.owner, linger_ms=60_000)
    assert await second.takeover.take_over(sid)
    events = [e async for e in second.follow(sid)]
    ids = check_one_stream(events, 600)
    reference = [
        t
        async for s in engine.generate("ref", [5, 6, 7], kind.accept([], 600).plan.sampling())
        for t in s.token_ids
    ]
    assert ids == reference
    for _ in range(100):  # the replaced producer stops at its next append
        if not first.producers.owns(sid):
            break
        await asyncio.sleep(0.05)
    assert not first.producers.owns(sid)
    assert (await log.meta(sid)).last_event_id == events[-1].id  # type: ignore[union-attr]
    await first.close()
    await second.close()
    await client.aclose()
