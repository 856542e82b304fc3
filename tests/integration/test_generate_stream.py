"""/v1/generate on a real server process with the real vLLM engine (tiny random-weight model)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.server import ServerProcess
from tests.support.sse import read_stream, text_of

pytestmark = pytest.mark.engine


def test_health_and_readiness_name_every_part(tiny_server: ServerProcess) -> None:
    assert httpx.get(tiny_server.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(tiny_server.url + "/readyz").json()
    assert ready["status"] == "ready"
    assert ready["checks"] == {
        "engine": "ready",
        "redis": "ok",
        "database": "ok",
        "vector_store": "ok",
    }


def test_tokens_stream_then_done_with_contiguous_ids(tiny_server: ServerProcess) -> None:
    with httpx.Client(base_url=tiny_server.url, timeout=60) as client:
        frames = read_stream(
            client, "POST", "/v1/generate", json={"prompt": "Once upon a time", "max_tokens": 24}
        )
    assert [f.id for f in frames] == list(range(len(frames)))
    assert frames[0].event == "stream" and len(frames[0].data["stream_id"]) >= 32
    assert frames[-1].event == "done"
    assert {f.event for f in frames[1:-1]} == {"token"}
    done = frames[-1].data
    assert done["finish_reason"] in ("stop", "length")
    token_ids = [t for f in frames if f.event == "token" for t in f.data["token_ids"]]
    indexes = [f.data["index"] for f in frames if f.event == "token"]
    # each token event starts where the previous one ended
    lengths = [len(f.data["token_ids"]) for f in frames if f.event == "token"]
    assert indexes == [sum(lengths[:i]) for i in range(len(lengths))]
    assert done["usage"]["completion_tokens"] >= len(token_ids) > 0
    assert done["usage"]["prompt_tokens"] > 0
    assert "\ufffd" not in text_of(frames)
    # from acceptance to the producer starting (a Redis round trip at least), never a constant 0
    assert 0 < done["timings"]["queue_ms"] < done["timings"]["ttft_ms"] + 1000


def test_streamed_text_equals_non_streaming_text(tiny_server: ServerProcess) -> None:
    body = {"prompt": "The quick brown fox", "max_tokens": 40, "temperature": 0}
    with httpx.Client(base_url=tiny_server.url, timeout=60) as client:
        frames = read_stream(client, "POST", "/v1/generate", json=body)
        whole = client.post("/v1/generate", json={**body, "stream": False}).json()
    assert whole["text"] == text_of(frames)
    assert whole["token_ids"] == [
        t for f in frames if f.event == "token" for t in f.data["token_ids"]
    ]
    assert whole["usage"]["completion_tokens"] == frames[-1].data["usage"]["completion_tokens"]


def test_seeded_sampling_is_reproducible(tiny_server: ServerProcess) -> None:
    body = {"prompt": "Tell me", "max_tokens": 20, "temperature": 1.0, "seed": 7, "stream": False}
    with httpx.Client(base_url=tiny_server.url, timeout=60) as client:
        a = client.post("/v1/generate", json=body).json()
        b = client.post("/v1/generate", json=body).json()
        c = client.post("/v1/generate", json={**body, "seed": 8}).json()
    assert a["token_ids"] == b["token_ids"]
    assert a["token_ids"] != c["token_ids"]


def test_sse_headers(tiny_server: ServerProcess) -> None:
    with (
        httpx.Client(base_url=tiny_server.url, timeout=60) as client,
        client.stream("POST", "/v1/generate", json={"prompt": "hi", "max_tokens": 2}) as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-store"
        assert response.headers["x-accel-buffering"] == "no"
        response.read()


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"prompt": "", "max_tokens": 5}, 422, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, 422, "max_tokens"),
        ({"prompt": "x", "max_tokens": 100000}, 422, "max_tokens must be between 1 and 512"),
        ({"prompt": "x", "temperature": -1}, 422, "temperature"),
        ({"prompt": "x", "bogus": 1}, 422, "bogus"),
        ({"prompt": "x" * 9000}, 413, "8000"),
    ],
)
def test_bad_input_gets_a_json_error_naming_the_problem(
    tiny_server: ServerProcess, body: dict[str, object], status: int, needle: str
) -> None:
    r = httpx.post(tiny_server.url + "/v1/generate", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert needle in error["message"]
    assert error["code"] in ("invalid_request", "payload_too_large")


def test_prompt_longer_than_the_window_is_refused(tiny_server: ServerProcess) -> None:
    # 7,000 characters of digits tokenize to more than the test profile's 2,048-token window
    r = httpx.post(tiny_server.url + "/v1/generate", json={"prompt": "1 " * 3500}, timeout=30)
    assert r.status_code == 413
    assert "context window is 2048 tokens" in r.json()["error"]["message"]


def test_unknown_route_is_a_json_404(tiny_server: ServerProcess) -> None:
    r = httpx.get(tiny_server.url + "/v1/nothing")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
