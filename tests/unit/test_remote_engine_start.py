"""An API process starts while some of its engine replicas are down, and routes around them.

Before, ``RemoteEngine.start`` asked every replica for its model and refused to start when
one did not answer, so an API container restarted while one vLLM box was rebooting stayed
down (exit 1, restarted, exit 1...) although the other replicas could serve it. Now a replica
down at start is marked unhealthy and joins once it answers with the same model and shape;
only when none answers does the start fail.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx
import pytest

from rag_stream.errors import EngineUnavailable
from rag_stream.generation import remote_engine
from rag_stream.generation.engine import Sampling
from rag_stream.generation.remote_engine import RemoteEngine
from rag_stream.settings import Settings, load_settings
from tests.support.fakes import ByteTokenizer

UP, DOWN = "http://vllm-1:8000", "http://vllm-2:8000"


class Replicas:
    """vLLM servers answering ``/v1/models``, ``/metrics``, ``/health`` and a one-token
    ``/v1/completions``; a server in ``down`` refuses connections."""

    def __init__(self, down: set[str], context: dict[str, int] | None = None) -> None:
        self.down = down
        self.context = context or {}  # a server's max_model_len, 2048 unless named
        self.completions: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if base in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/v1/models":
            length = self.context.get(base, 2048)
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": length}]})
        if path == "/metrics":
            text = 'vllm:cache_config_info{block_size="16"} 1.0\nvllm:num_requests_waiting 0\n'
            return httpx.Response(200, text=text)
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/completions":
            self.completions.append(base)
            body = (
                'data: {"choices": [{"token_ids": [104], "finish_reason": "stop"}], '
                '"usage": {"prompt_tokens": 3}}\n\ndata: [DONE]\n\n'
            )
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=body)
        return httpx.Response(404)


@pytest.fixture
def replicas(monkeypatch: pytest.MonkeyPatch) -> Replicas:
    scripted = Replicas(down={DOWN})
    client = functools.partial(httpx.AsyncClient, transport=httpx.MockTransport(scripted))
    monkeypatch.setattr(httpx, "AsyncClient", client)

    async def tokenizer(_model: str) -> Any:
        return ByteTokenizer()

    monkeypatch.setattr(remote_engine, "_load_tokenizer", tokenizer)
    return scripted


def _settings() -> Settings:
    # a long health interval: the test runs each check itself
    return load_settings(
        profile="test", engine_urls=f"{UP},{DOWN}", model="m", engine={"replica_health_s": 3600}
    )


async def _generate(engine: RemoteEngine, request_id: str) -> list[int]:
    ids: list[int] = []
    async for step in engine.generate(request_id, [1, 2, 3], Sampling(max_tokens=4)):
        ids.extend(step.token_ids)
    return ids


async def test_a_replica_down_at_start_is_routed_around_and_joins_when_it_answers(
    replicas: Replicas,
) -> None:
    engine = await RemoteEngine.start(_settings())
    try:
        assert [r.healthy for r in engine.router.replicas] == [True, False]
        assert engine.reachable()
        for n in range(4):  # whatever replica each key prefers, the live one serves it
            assert await _generate(engine, f"r{n}") == [104]
        assert set(replicas.completions) == {UP}

        replicas.down.clear()
        assert engine._health is not None
        await engine._health.check_all()
        assert [r.healthy for r in engine.router.replicas] == [True, True]
    finally:
        await engine.close()


async def test_a_replica_down_at_start_that_comes_back_with_another_shape_stays_out(
    replicas: Replicas,
) -> None:
    engine = await RemoteEngine.start(_settings())
    try:
        replicas.down.clear()
        replicas.context[DOWN] = 4096  # another context length than the live replica's
        assert engine._health is not None
        await engine._health.check_all()
        assert [r.healthy for r in engine.router.replicas] == [True, False]
    finally:
        await engine.close()


async def test_the_start_fails_only_when_no_replica_answers(replicas: Replicas) -> None:
    replicas.down.add(UP)
    with pytest.raises(EngineUnavailable, match="did not answer"):
        await RemoteEngine.start(_settings())
