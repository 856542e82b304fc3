"""Resumable streams on real server processes sharing the real Redis, on the real engine."""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REDIS_URL, STUB_DELAY_S, ServerFactory
from tests.support.redis_server import RedisServer
from tests.support.server import ServerProcess
from tests.support.sse import Frame, read_stream, text_of
from tests.support.waiting import eventually_sync

pytestmark = pytest.mark.engine

PROMPTS = [
    "The history of the printing press",
    "Ten facts about octopuses:",
    "def fibonacci(n):",
    "Dear diary, today",
    "北京的天气",
    "A recipe for bread:",
]


def _greedy(server: ServerProcess, prompt: str, max_tokens: int) -> dict[str, object]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": False}
    r = httpx.post(server.url + "/v1/generate", json=body, timeout=120)
    r.raise_for_status()
    return dict(r.json())


def _start(server: ServerProcess, prompt: str, max_tokens: int, stop_after: int) -> list[Frame]:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        return read_stream(
            client,
            "POST",
            "/v1/generate",
            json={"prompt": prompt, "max_tokens": max_tokens},
            stop_after=stop_after,
        )


def _resume(server: ServerProcess, sid: str, last_id: int | None) -> list[Frame]:
    headers = {} if last_id is None else {"Last-Event-ID": str(last_id)}
    with httpx.Client(base_url=server.url, timeout=120) as client:
        return read_stream(client, "GET", f"/v1/streams/{sid}/events", headers=headers)


def _assert_one_stream(frames: list[Frame]) -> None:
    assert [f.id for f in frames] == list(range(len(frames)))
    assert frames[0].event == "stream"
    assert frames[-1].event == "done"
    positions = [f.data["index"] for f in frames if f.event == "token"]
    sizes = [len(f.data["token_ids"]) for f in frames if f.event == "token"]
    assert positions == [sum(sizes[:i]) for i in range(len(sizes))]  # no token twice, none missing


def test_drop_and_resume_at_random_points_rebuilds_the_exact_text(
    tiny_server: ServerProcess,
) -> None:
    rng = random.Random(42)
    for prompt in PROMPTS:
        expected = _greedy(tiny_server, prompt, 60)
        cut = rng.randint(1, 30)
        first = _start(tiny_server, prompt, 60, stop_after=cut)
        sid = first[0].data["stream_id"]
        rest = _resume(tiny_server, sid, first[-1].id)
        frames = first + rest
        _assert_one_stream(frames)
        assert text_of(frames) == expected["text"], (prompt, cut)


def test_resume_without_cursor_replays_everything(tiny_server: ServerProcess) -> None:
    first = _start(tiny_server, "Replay me", 20, stop_after=3)
    replay = _resume(tiny_server, first[0].data["stream_id"], None)
    _assert_one_stream(replay)
    assert [f.data for f in replay[:3]] == [f.data for f in first]


def test_resume_through_a_second_server_process(
    tiny_server: ServerProcess, stub_server: ServerProcess
) -> None:
    server_b = stub_server  # another process on the same Redis (its engine plays no part)
    expected = _greedy(tiny_server, "Across processes", 80)
    first = _start(tiny_server, "Across processes", 80, stop_after=5)
    rest = _resume(server_b, first[0].data["stream_id"], first[-1].id)
    _assert_one_stream(first + rest)
    assert text_of(first + rest) == expected["text"]
    status = httpx.get(f"{server_b.url}/v1/streams/{first[0].data['stream_id']}").json()
    assert status["status"] == "done"
    assert status["last_event_id"] == rest[-1].id


def test_cancel_from_another_process(
    tiny_server: ServerProcess, stub_server: ServerProcess
) -> None:
    server_b = stub_server  # paced: 2000 tokens take 10 s, so the cancel lands mid-stream
    first = _start(server_b, "A very long story", 2000, stop_after=3)
    sid = first[0].data["stream_id"]
    r = httpx.post(f"{tiny_server.url}/v1/streams/{sid}/cancel", timeout=30)
    assert r.status_code == 200
    assert r.json()["cancelled"] is True, r.json()
    rest = _resume(tiny_server, sid, first[-1].id)
    frames = first + rest
    _assert_one_stream(frames)
    done = frames[-1].data
    assert done["finish_reason"] == "cancelled"
    assert done["usage"]["completion_tokens"] < 1900
    # cancelling again is a no-op that says so
    again = httpx.post(f"{server_b.url}/v1/streams/{sid}/cancel", timeout=30).json()
    assert again["cancelled"] is False
    assert "already finished" in again["message"]


def _status(server: ServerProcess, sid: str) -> dict[str, Any]:
    return dict(httpx.get(f"{server.url}/v1/streams/{sid}", timeout=30).json())


def test_a_disconnected_client_does_not_stop_generation(stub_server: ServerProcess) -> None:
    # paced stub engine: 600 tokens take 3 s on any machine
    first = _start(stub_server, "Keep going without me", 600, stop_after=2)
    sid = first[0].data["stream_id"]
    left = _status(stub_server, sid)
    assert left["status"] == "running"  # the client really left a running stream
    assert left["last_event_id"] < 300
    deadline = time.monotonic() + 60
    while _status(stub_server, sid)["status"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    frames = first + _resume(stub_server, sid, first[-1].id)
    _assert_one_stream(frames)
    assert frames[-1].data["finish_reason"] == "length"
    assert frames[-1].data["usage"]["completion_tokens"] == 600


@pytest.mark.parametrize(
    ("headers", "params", "status", "needle"),
    [
        ({"Last-Event-ID": "-3"}, {}, 422, "must be >= 0"),
        ({"Last-Event-ID": "abc"}, {}, 422, "must be an integer"),
        ({}, {"last_event_id": "99999"}, 422, "beyond the stream's last event"),
    ],
)
def test_bad_cursors_get_clear_answers(
    tiny_server: ServerProcess,
    headers: dict[str, str],
    params: dict[str, str],
    status: int,
    needle: str,
) -> None:
    frames = _start(tiny_server, "cursor checks", 5, stop_after=100)
    sid = frames[0].data["stream_id"]
    r = httpx.get(
        f"{tiny_server.url}/v1/streams/{sid}/events", headers=headers, params=params, timeout=30
    )
    assert r.status_code == status
    assert needle in r.json()["error"]["message"]


def test_cursor_at_the_end_replays_nothing(tiny_server: ServerProcess) -> None:
    frames = _start(tiny_server, "at the end", 5, stop_after=100)
    assert frames[-1].event == "done"
    assert _resume(tiny_server, frames[0].data["stream_id"], frames[-1].id) == []


def test_unknown_stream_is_404(tiny_server: ServerProcess) -> None:
    for path in ("/v1/streams/nope", "/v1/streams/nope/events"):
        r = httpx.get(tiny_server.url + path, timeout=30)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "not_found"
    assert httpx.post(tiny_server.url + "/v1/streams/nope/cancel").status_code == 404


def test_abandoned_stream_is_cancelled(server_factory: ServerFactory) -> None:
    server = server_factory(
        stub_delay_s=STUB_DELAY_S,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_STREAMING__ABANDON_AFTER_S="1",
        RAG_STREAM_LIMITS__MAX_TOKENS="4000",
    )
    try:
        first = _start(server, "Nobody is listening", 4000, stop_after=2)  # 20 s of tokens
        sid = first[0].data["stream_id"]
        assert _status(server, sid)["status"] == "running"
        # abandoned after 1 s; left alone it would run 20 s and end with "length"
        eventually_sync(lambda: _status(server, sid)["status"] != "running", "the stream's end", 60)
        status = _status(server, sid)
        assert status["status"] == "done"
        assert status["finish_reason"] == "cancelled"
        frames = first + _resume(server, sid, first[-1].id)
        _assert_one_stream(frames)
        assert frames[-1].data["usage"]["completion_tokens"] < 4000
    finally:
        server.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    redis = RedisServer(tmp_path)
    redis.start()  # answers PING when it returns
    assert redis.proc is not None
    yield redis.url, redis.proc
    redis.kill()


def test_redis_stopped_mid_stream_ends_with_an_error_and_new_requests_get_503(
    server_factory: ServerFactory, private_redis: tuple[str, subprocess.Popen[bytes]]
) -> None:
    url, redis_proc = private_redis
    server = server_factory(stub_delay_s=STUB_DELAY_S, RAG_STREAM_REDIS_URL=url)

    def kill_redis_at_the_third_frame(frame: Frame) -> None:
        if frame.id == 2 and redis_proc.poll() is None:
            assert frame.event == "token"  # the stream is running
            redis_proc.kill()
            redis_proc.wait()

    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            frames = read_stream(
                client,
                "POST",
                "/v1/generate",
                json={"prompt": "Redis goes away", "max_tokens": 512},  # 2.5 s of tokens
                on_frame=kill_redis_at_the_third_frame,
            )
        assert redis_proc.poll() is not None
        assert frames[-1].event == "error"
        assert frames[-1].data["code"] == "event_log_unavailable"
        # the events before the error were contiguous and every one came from the log
        # (the error itself has no id: httpx-sse repeats the previous one)
        logged = frames[:-1]
        assert [f.id for f in logged] == list(range(len(logged)))
        assert all(f.event != "done" for f in logged)
        r = httpx.post(
            server.url + "/v1/generate", json={"prompt": "x", "max_tokens": 3}, timeout=30
        )
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "event_log_unavailable"
        ready = httpx.get(server.url + "/readyz", timeout=30)
        assert ready.status_code == 503 and "redis" in ready.json()["failing"]
    finally:
        server.stop()
