"""Admission control end to end: generation slots, a bounded queue, 429 with Retry-After.

On the service in the test process (tests/support/inprocess.py) with the paced stub engine
(200 tokens a second: a 3000-token stream runs 15 s on any machine, so the streams are surely
running while the limits are tested) and the real Redis. A stream is started on the ``live``
client, which hands over the headers at once and leaves the stream running.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from tests.conftest import REDIS_URL
from tests.support.inprocess import InProcess
from tests.support.waiting import eventually

PREFIX = "rs-admission"

pytestmark = pytest.mark.in_process(
    delay_s=0.005,
    streaming__key_prefix=PREFIX,
    limits__max_tokens=4000,
    limits__max_active_streams=1,
    limits__max_queued=2,
    limits__retry_after_s=3,
)


async def _rejections(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "rag_stream_rejected_requests_total"
                and sample.labels.get("reason") == "queue_full"
            ):
                return sample.value
    return 0.0


async def _start(service: InProcess, body: dict[str, object]) -> str:
    async with service.live.stream("POST", "/v1/generate", json=body) as r:
        assert r.status_code == 200, await r.aread()
        return r.headers["x-stream-id"]


async def _status(http: httpx.AsyncClient, sid: str) -> dict[str, object]:
    return dict((await http.get(f"/v1/streams/{sid}")).json())


async def test_over_the_limits_a_request_gets_429_and_writes_nothing(
    in_process_module: InProcess,
) -> None:
    service, http = in_process_module, in_process_module.client
    long = {"prompt": "x", "max_tokens": 3000}
    store = Redis.from_url(REDIS_URL)

    async def keys() -> list[bytes]:
        return sorted([key async for key in store.scan_iter(f"{PREFIX}:*")])

    running = await _start(service, long)
    queued = await _start(service, long)
    queued_too = await _start(service, long)
    assert (await _status(http, running))["status"] == "running"
    keys_before = await keys()
    rejected_before = await _rejections(http)
    for path, body in (
        ("/v1/generate", long),
        ("/v1/answers", {"kb": "no-such-kb", "question": "q"}),
        (
            "/v1/chat/completions",
            {"model": "stub", "messages": [{"role": "user", "content": "q"}]},
        ),
    ):
        r = await http.post(path, json=body)
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "3"
        error = r.json()["error"]
        assert error["code"] == "too_many_requests"
        assert error["type"] == "rate_limit_error"
        assert "limits.max_queued" in error["message"]
    # refused before any work: no stream, no key, nothing else in Redis
    assert await keys() == keys_before
    assert await _rejections(http) == rejected_before + 3

    # the queued stream waits for the slot (no tokens yet) while the running one generates,
    # then runs when it frees
    mark = (await _status(http, running))["last_event_id"]

    async def running_went_on() -> bool:
        return (await _status(http, running))["last_event_id"] >= mark + 20

    await eventually(running_went_on, "20 more events of the running stream", timeout_s=30)
    assert (await _status(http, queued))["last_event_id"] == 0
    assert (await http.post(f"/v1/streams/{running}/cancel")).json()["cancelled"]
    deadline = time.monotonic() + 30
    while (await _status(http, queued))["last_event_id"] < 5:  # type: ignore[operator]
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    # a place in the queue is free again: the next request is accepted, and runs once the
    # streams before it end
    third = await _start(service, {"prompt": "x", "max_tokens": 5})
    for sid in (queued, queued_too):
        await http.post(f"/v1/streams/{sid}/cancel")
    deadline = time.monotonic() + 30
    while (await _status(http, third))["status"] == "running":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert (await _status(http, third))["finish_reason"] == "length"
    await store.aclose()


async def test_interactive_requests_overtake_batch_ones_in_the_queue(
    in_process_module: InProcess,
) -> None:
    """One slot, taken: a batch stream queued first starts after an interactive one queued
    later (each then runs about a second)."""
    service, http = in_process_module, in_process_module.client
    running = await _start(service, {"prompt": "x", "max_tokens": 3000})
    batch = await _start(service, {"prompt": "x", "max_tokens": 200, "priority": "batch"})
    interactive = await _start(service, {"prompt": "x", "max_tokens": 200})
    assert (await _status(http, running))["status"] == "running"
    assert (await _status(http, batch))["last_event_id"] == 0  # waiting
    await http.post(f"/v1/streams/{running}/cancel")
    deadline = time.monotonic() + 30
    while True:
        states = {sid: await _status(http, sid) for sid in (batch, interactive)}
        if any(s["status"] != "running" for s in states.values()):
            break
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert states[interactive]["status"] == "done", states
    assert states[batch]["status"] == "running", states
    assert states[batch]["last_event_id"] < 100, states  # type: ignore[operator]
