"""Admission control end to end: generation slots, a bounded queue, 429 with Retry-After.

On the real service with the paced stub engine (200 tokens a second: a 3000-token stream runs
15 s on any machine, so the streams are surely running while the limits are tested) and the
real Redis; the real engine's variant is in test_admission_engine below.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REDIS_URL, ServerFactory
from tests.support.server import ServerProcess


def _rejections(server: ServerProcess) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "rag_stream_rejected_requests_total"
                and sample.labels.get("reason") == "queue_full"
            ):
                return sample.value
    return 0.0


def _start(http: httpx.Client, body: dict[str, object]) -> str:
    with http.stream("POST", "/v1/generate", json=body) as r:
        assert r.status_code == 200, r.read()
        return r.headers["x-stream-id"]


@pytest.fixture(scope="module")
def limited(server_factory: ServerFactory) -> Iterator[ServerProcess]:
    server = server_factory(
        stub_delay_s=0.005,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_STREAMING__KEY_PREFIX="rs-admission",
        RAG_STREAM_LIMITS__MAX_TOKENS="4000",
        RAG_STREAM_LIMITS__MAX_ACTIVE_STREAMS="1",
        RAG_STREAM_LIMITS__MAX_QUEUED="2",
        RAG_STREAM_LIMITS__RETRY_AFTER_S="3",
    )
    yield server
    server.stop()


def test_over_the_limits_a_request_gets_429_and_writes_nothing(limited: ServerProcess) -> None:
    long = {"prompt": "x", "max_tokens": 3000}
    store = redis.Redis.from_url(REDIS_URL)
    with httpx.Client(base_url=limited.url, timeout=60) as http:
        running = _start(http, long)
        queued = _start(http, long)
        queued_too = _start(http, long)
        assert http.get(f"/v1/streams/{running}").json()["status"] == "running"
        keys_before = sorted(store.scan_iter("rs-admission:*"))
        rejected_before = _rejections(limited)
        for path, body in (
            ("/v1/generate", long),
            ("/v1/answers", {"kb": "no-such-kb", "question": "q"}),
            (
                "/v1/chat/completions",
                {"model": "stub", "messages": [{"role": "user", "content": "q"}]},
            ),
        ):
            r = http.post(path, json=body)
            assert r.status_code == 429, r.text
            assert r.headers["retry-after"] == "3"
            error = r.json()["error"]
            assert error["code"] == "too_many_requests"
            assert error["type"] == "rate_limit_error"
            assert "limits.max_queued" in error["message"]
        # refused before any work: no stream, no key, nothing else in Redis
        assert sorted(store.scan_iter("rs-admission:*")) == keys_before
        assert _rejections(limited) == rejected_before + 3

        # the queued stream waits for the slot (no tokens yet), then runs when it frees
        time.sleep(0.5)
        assert http.get(f"/v1/streams/{queued}").json()["last_event_id"] == 0
        assert http.post(f"/v1/streams/{running}/cancel").json()["cancelled"]
        deadline = time.monotonic() + 30
        while http.get(f"/v1/streams/{queued}").json()["last_event_id"] < 5:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # a place in the queue is free again: the next request is accepted, and runs once the
        # streams before it end
        third = _start(http, {"prompt": "x", "max_tokens": 5})
        for sid in (queued, queued_too):
            http.post(f"/v1/streams/{sid}/cancel")
        deadline = time.monotonic() + 30
        while http.get(f"/v1/streams/{third}").json()["status"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert http.get(f"/v1/streams/{third}").json()["finish_reason"] == "length"
    store.close()


def test_interactive_requests_overtake_batch_ones_in_the_queue(limited: ServerProcess) -> None:
    """One slot, taken: a batch stream queued first starts after an interactive one queued
    later (each then runs about a second)."""
    with httpx.Client(base_url=limited.url, timeout=60) as http:
        running = _start(http, {"prompt": "x", "max_tokens": 3000})
        batch = _start(http, {"prompt": "x", "max_tokens": 200, "priority": "batch"})
        interactive = _start(http, {"prompt": "x", "max_tokens": 200})
        assert http.get(f"/v1/streams/{running}").json()["status"] == "running"
        assert http.get(f"/v1/streams/{batch}").json()["last_event_id"] == 0  # waiting
        http.post(f"/v1/streams/{running}/cancel")
        deadline = time.monotonic() + 30
        while True:
            states = {sid: http.get(f"/v1/streams/{sid}").json() for sid in (batch, interactive)}
            if any(s["status"] != "running" for s in states.values()):
                break
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert states[interactive]["status"] == "done", states
        assert states[batch]["status"] == "running", states
        assert states[batch]["last_event_id"] < 100, states  # it had barely started
