"""The event log under Redis faults and dead producers (a real redis-server; the service in the
test process on the paced stub engine, tests/support/inprocess.py, and real server processes
where a producer is killed)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse
from redis.asyncio import Redis as AsyncRedis

from rag_stream.generation.engine import Sampling
from rag_stream.streaming.redis_log import RedisEventLog
from tests.conftest import REDIS_URL, STUB_DELAY_S, ServerFactory
from tests.support import inprocess
from tests.support.fakes import start_toy, stub_engine, toy_streams
from tests.support.inprocess import InProcess, InProcessFactory
from tests.support.redis_server import RedisServer
from tests.support.server import ServerProcess
from tests.support.sse import Frame, read_stream
from tests.support.waiting import eventually
from tests.unit.test_streams import check_one_stream


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


def _status(server: ServerProcess, sid: str) -> dict[str, object]:
    return dict(httpx.get(f"{server.url}/v1/streams/{sid}", timeout=30).json())


async def _restart(redis_server: RedisServer) -> None:
    """Kill it and start it again, empty (no persistence), while the app goes on."""
    await asyncio.to_thread(redis_server.kill)
    await asyncio.sleep(0.4)
    await asyncio.to_thread(redis_server.start)


async def _long_generate(
    service: InProcess, on_frame: Callable[[Frame], Awaitable[None]]
) -> list[Frame]:
    """A generate stream of 10 s of tokens, read to its end; ``on_frame`` sees each frame
    (and breaks Redis under it)."""
    return await inprocess.read_stream(
        service.live,
        "POST",
        "/v1/generate",
        json={"prompt": "lose my head", "max_tokens": 2000},
        on_frame=on_frame,
    )


async def test_a_log_lost_by_a_redis_restart_is_never_extended(
    in_process_factory: InProcessFactory, private_redis: RedisServer
) -> None:
    async def restart_redis_at_the_fifth_frame(frame: Frame) -> None:
        if frame.id == 4 and frame.event == "token":
            await _restart(private_redis)

    async with in_process_factory(
        delay_s=STUB_DELAY_S, redis_url=private_redis.url, limits__max_tokens=4000
    ) as service:
        frames = await _long_generate(service, restart_redis_at_the_fifth_frame)
        sid = frames[0].data["stream_id"]
        assert frames[-1].event == "error", frames[-1]
        assert frames[-1].data["code"] == "log_lost"
        assert all(f.event != "done" for f in frames)
        status = (await service.client.get(f"/v1/streams/{sid}")).json()
        assert status["status"] == "error" and status["finish_reason"] == "log_lost"
        assert status["model"] == "stub" and float(str(status["created"])) > 0
        # what is left in the log is the error alone: no token written after the restart
        replay = await inprocess.read_stream(service.client, "GET", f"/v1/streams/{sid}/events")
        assert [f.event for f in replay] == ["error"]
        assert replay[0].data["code"] == "log_lost"
        # the restarted Redis serves new streams
        r = await service.client.post(
            "/v1/generate", json={"prompt": "x", "max_tokens": 3, "stream": False}
        )
        assert r.status_code == 200, r.text


async def test_a_stream_given_up_while_redis_was_away_reads_lost_once_it_is_back_empty(
    in_process_factory: InProcessFactory, private_redis: RedisServer
) -> None:
    """Redis away for longer than the producer's retries: it gives the stream up, to be
    continued from its log. Back empty, there is no log: the stream was nowhere (404 for good,
    "stream expired" to its readers; 12 streams of the chaos campaign at scale), and is now
    marked lost, as the streams still writing when Redis came back are."""

    async def kill_redis_at_the_fifth_frame(frame: Frame) -> None:
        if frame.id == 4 and frame.event == "token":
            await asyncio.to_thread(private_redis.kill)

    async with in_process_factory(
        delay_s=STUB_DELAY_S, redis_url=private_redis.url, limits__max_tokens=4000
    ) as service:
        frames = await _long_generate(service, kill_redis_at_the_fifth_frame)
        sid = frames[0].data["stream_id"]
        # the reader's own error, once the producer gave the stream up (nothing else wakes it)
        assert frames[-1].event == "error" and frames[-1].data["code"] == "event_log_unavailable"
        await asyncio.to_thread(private_redis.start)  # empty: nothing of the stream

        async def marked_lost() -> bool:
            r = await service.client.get(f"/v1/streams/{sid}")
            return r.status_code == 200 and r.json()["finish_reason"] == "log_lost"

        await eventually(marked_lost, "the stream marked lost", timeout_s=30)
        status = (await service.client.get(f"/v1/streams/{sid}")).json()
        assert status["status"] == "error" and status["model"] == "stub"
        replay = await inprocess.read_stream(service.client, "GET", f"/v1/streams/{sid}/events")
        assert [(f.event, f.data["code"]) for f in replay] == [("error", "log_lost")]


async def test_a_chat_stream_whose_log_is_lost_still_resumes_in_the_chat_format(
    in_process_factory: InProcessFactory, private_redis: RedisServer
) -> None:
    """The lost log's meta keeps the stream's creation fields: its tenant, and the format a
    resume renders (it kept the model alone, so a chat stream resumed as our own SSE events,
    which an OpenAI client cannot read, and the chaos campaign judged the stream wrong)."""
    body = {
        "model": "stub",
        "messages": [{"role": "user", "content": "lose my head"}],
        "max_tokens": 2000,
        "stream": True,
    }
    seen: list[str] = []
    async with in_process_factory(
        delay_s=STUB_DELAY_S, redis_url=private_redis.url, limits__max_tokens=4000
    ) as service:
        async with aconnect_sse(service.live, "POST", "/v1/chat/completions", json=body) as source:
            sid = source.response.headers["x-stream-id"]
            async for sse in source.aiter_sse():
                seen.append(sse.data)
                if len(seen) == 5:
                    await _restart(private_redis)
        assert seen[-1] == "[DONE]" and json.loads(seen[-2])["error"]["code"] == "log_lost"
        async with aconnect_sse(service.client, "GET", f"/v1/streams/{sid}/events") as source:
            replay = [sse.data async for sse in source.aiter_sse()]
        assert replay == seen[-2:]  # the error chunk and [DONE], as the client read them


async def test_requests_right_after_a_redis_restart_succeed(
    in_process_factory: InProcessFactory, private_redis: RedisServer
) -> None:
    """Every idle connection of the pool is dead once Redis has restarted; each one gave a
    request a 503 ("Connection closed by server") although Redis was back (the chaos
    campaign's Redis rounds). A command now goes again on a new connection."""

    async def generate(client: httpx.AsyncClient, prompt: str) -> httpx.Response:
        body = {"prompt": prompt, "max_tokens": 40, "stream": False}
        return await client.post("/v1/generate", json=body)

    async with in_process_factory(delay_s=STUB_DELAY_S, redis_url=private_redis.url) as service:
        client = service.client
        # at once: the pool holds several connections now
        warm = await asyncio.gather(*(generate(client, f"warm {i}") for i in range(6)))
        assert all(r.status_code == 200 for r in warm), [r.text for r in warm]
        await asyncio.to_thread(private_redis.kill)
        await asyncio.to_thread(private_redis.start)  # empty: nothing of the earlier streams
        for i in range(8):
            r = await generate(client, f"after {i}")
            assert r.status_code == 200, (i, r.text)
        assert (await client.get("/readyz")).status_code == 200


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
    sid = await start_toy(first, kind, [5, 6, 7], 600)
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
        async for s in engine.generate("ref", [5, 6, 7], Sampling(max_tokens=600))
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
