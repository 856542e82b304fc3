"""A start sent with an ``Idempotency-Key`` starts at most one stream: sent again (its answer
was lost), it reads the stream the first one began, from its first event; the same key with
another request is refused; another tenant's key is another key. The bundled client sends a
key with each start and sends the start again when its answer is lost.

On the service in the test process (tests/support/inprocess.py) with keys required (two
tenants), the real Redis, the stub engine keeping its requests (one engine request per stream
started)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from rag_stream.client import AsyncClient, RetryPolicy
from rag_stream.schemas.events import Done, Token
from tests.conftest import SESSION_PREFIX
from tests.support.inprocess import (
    BASE_URL,
    InProcess,
    InProcessFactory,
    LiveASGITransport,
    keyed_clients,
)

KEY = "Idempotency-Key"


@dataclass
class Tenants:
    service: InProcess
    keys: dict[str, str]  # API keys by tenant
    alpha: httpx.AsyncClient
    beta: httpx.AsyncClient
    kb: str  # alpha's


@pytest.fixture(scope="module")
async def tenants(in_process_factory: InProcessFactory) -> AsyncIterator[Tenants]:
    async with in_process_factory(
        ledger=True,
        security__require_keys=True,
        streaming__key_prefix=f"{SESSION_PREFIX}-startkeys",
    ) as service:
        clients = await keyed_clients(service, "alpha", "beta")
        alpha, beta = clients["alpha"], clients["beta"]
        kb = f"kb-{uuid.uuid4().hex[:6]}"
        (await alpha.post("/v1/kbs", json={"name": kb})).raise_for_status()
        document = {"title": "Herons", "text": "Herons nest in the reeds in spring."}
        (await alpha.post(f"/v1/kbs/{kb}/documents", json=document)).raise_for_status()
        keys = {t: c.headers["authorization"].removeprefix("Bearer ") for t, c in clients.items()}
        yield Tenants(service, keys, alpha, beta, kb)
        await alpha.aclose()
        await beta.aclose()


def _key() -> dict[str, str]:
    return {KEY: f"start-{uuid.uuid4()}"}


def _data(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


async def test_a_start_sent_again_reads_the_stream_the_first_began(tenants: Tenants) -> None:
    key = _key()
    body = {"prompt": "Tell me about herons.", "max_tokens": 40}
    first = await tenants.alpha.post("/v1/generate", json=body, headers=key)
    again = await tenants.alpha.post("/v1/generate", json=body, headers=key)
    assert first.status_code == again.status_code == 200, again.text
    sid = first.headers["x-stream-id"]
    assert again.headers["x-stream-id"] == sid
    assert again.text == first.text  # every event again, from the first
    assert len(tenants.service.ledger.of_stream(sid)) == 1  # generated once
    other = await tenants.alpha.post("/v1/generate", json=body, headers=_key())
    assert other.headers["x-stream-id"] != sid  # a new key: a new start


async def test_every_start_route_takes_the_key(tenants: Tenants) -> None:
    alpha, kb = tenants.alpha, tenants.kb
    starts: list[tuple[str, dict[str, Any]]] = [
        ("/v1/answers", {"kb": kb, "question": "Where do herons nest?", "max_tokens": 20}),
        (
            "/v1/chat/completions",
            {
                "model": f"kb:{kb}",
                "messages": [{"role": "user", "content": "Where do herons nest?"}],
                "max_tokens": 20,
                "stream": True,
            },
        ),
        (
            "/v1/ui/chat",
            {
                "id": f"chat-{uuid.uuid4().hex[:6]}",
                "model": f"kb:{kb}",
                "messages": [
                    {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Herons?"}]}
                ],
                "max_tokens": 20,
            },
        ),
    ]
    for path, body in starts:
        key = _key()
        first = await alpha.post(path, json=body, headers=key)
        again = await alpha.post(path, json=body, headers=key)
        assert first.status_code == again.status_code == 200, (path, again.text)
        assert again.headers["x-stream-id"] == first.headers["x-stream-id"], path
        assert _data(again.text) == _data(first.text), path


async def test_a_job_started_again_is_the_same_job(tenants: Tenants) -> None:
    key = _key()
    body = {"kb": tenants.kb, "title": "Herons", "outline": ["Nests"], "section_tokens": 16}
    first = await tenants.alpha.post("/v1/jobs", json=body, headers=key)
    again = await tenants.alpha.post("/v1/jobs", json=body, headers=key)
    assert first.status_code == again.status_code == 202, again.text
    assert again.json()["id"] == first.json()["id"]
    jobs = (await tenants.alpha.get("/v1/jobs", params={"limit": 100})).json()["data"]
    assert sum(j["id"] == first.json()["id"] for j in jobs) == 1


async def test_the_same_key_with_another_request_is_refused(tenants: Tenants) -> None:
    key = _key()
    body = {"prompt": "Tell me about herons.", "max_tokens": 10}
    sid = (await tenants.alpha.post("/v1/generate", json=body, headers=key)).headers["x-stream-id"]
    r = await tenants.alpha.post("/v1/generate", json={**body, "max_tokens": 11}, headers=key)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "idempotency_key_reused" and error["param"] == KEY
    assert sid in error["message"]
    model = (await tenants.alpha.get("/v1/models")).json()["data"][0]["id"]
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    r = await tenants.alpha.post("/v1/chat/completions", json=chat, headers=key)
    assert r.status_code == 400 and r.json()["error"]["code"] == "idempotency_key_reused"


async def test_another_tenants_key_is_another_key(tenants: Tenants) -> None:
    key = _key()
    body = {"prompt": "Tell me about herons.", "max_tokens": 10}
    mine = await tenants.alpha.post("/v1/generate", json=body, headers=key)
    theirs = await tenants.beta.post("/v1/generate", json=body, headers=key)
    assert mine.status_code == theirs.status_code == 200
    assert theirs.headers["x-stream-id"] != mine.headers["x-stream-id"]
    status = await tenants.beta.get(f"/v1/streams/{mine.headers['x-stream-id']}")
    assert status.status_code == 404  # and nothing of alpha's is found through it


@pytest.mark.parametrize("bad", ["", "has space", "x" * 256, "naïve"])
async def test_a_malformed_key_is_refused_naming_the_header(tenants: Tenants, bad: str) -> None:
    body = {"prompt": "Tell me about herons.", "max_tokens": 10}
    headers = {KEY: bad.encode()}  # (UTF-8 bytes, as a client may send them)
    r = await tenants.alpha.post("/v1/generate", json=body, headers=headers)
    assert r.status_code == 422, r.text
    assert KEY in json.dumps(r.json()["error"])


class _AnswerLost(httpx.AsyncBaseTransport):
    """Hands the first start to the service, then loses its answer (a reset), as when the
    server dies or a proxy cuts the connection after the request went out."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.lost: list[str] = []  # the stream ids of the answers lost

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if request.method == "POST" and not self.lost:
            await response.aread()
            assert response.status_code == 200, response.text
            self.lost.append(response.headers["x-stream-id"])
            await response.aclose()
            raise httpx.ReadError("connection reset before the answer", request=request)
        return response


async def test_the_client_sends_a_start_again_when_its_answer_is_lost(tenants: Tenants) -> None:
    transport = _AnswerLost(LiveASGITransport(tenants.service.app))
    fast = RetryPolicy(max_retries=3, backoff_s=0.01, max_backoff_s=0.05)
    async with AsyncClient(
        BASE_URL, api_key=tenants.keys["alpha"], retry=fast, transport=transport
    ) as client:
        stream = client.generate("Tell me about herons.", max_tokens=30)
        events = [e async for e in stream]
    assert transport.lost, "the first answer was not lost"
    assert stream.stream_id == transport.lost[0]  # the stream the lost start began
    assert [e.id for e in events] == list(range(len(events)))
    assert isinstance(events[-1], Done) and events[-1].finish_reason == "length"
    assert sum(isinstance(e, Token) for e in events) > 0
    assert len(tenants.service.ledger.of_stream(stream.stream_id)) == 1


async def test_the_openai_sdks_own_retry_carries_the_key_to_the_same_stream(
    tenants: Tenants,
) -> None:
    from openai import AsyncOpenAI

    transport = _AnswerLost(LiveASGITransport(tenants.service.app))
    model = (await tenants.alpha.get("/v1/models")).json()["data"][0]["id"]
    async with httpx.AsyncClient(transport=transport) as http:
        client = AsyncOpenAI(
            base_url=f"{BASE_URL}/v1", api_key=tenants.keys["alpha"], http_client=http
        )
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Tell me about herons."}],
            max_tokens=30,
            stream=True,
            extra_headers=_key(),  # docs/clients.md
        )
        chunks = [chunk async for chunk in stream]
    assert transport.lost, "the first answer was not lost"
    # the SDK sent the request again by itself, and read the stream the first one began
    assert {c.id for c in chunks} == {f"chatcmpl-{transport.lost[0]}"}
    assert chunks[-1].choices[0].finish_reason == "length"
    assert len(tenants.service.ledger.of_stream(transport.lost[0])) == 1
