"""GET /v1/conversations: the caller's conversations, newest first, page by page, and never
another tenant's.

On the service in the test process (tests/support/inprocess.py) with keys required (two
tenants, keys made as `rag-stream keys create` makes them), the real Redis, on SQLite and on
PostgreSQL. The stub engine writes the answers: the list is about what the database kept, and
the text of an answer plays no part.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.conftest import SESSION_PREFIX
from tests.support.inprocess import InProcess, InProcessFactory, keyed_clients


@dataclass
class Tenants:
    service: InProcess
    alpha: httpx.AsyncClient
    beta: httpx.AsyncClient
    kb: str  # alpha's


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
async def tenants(
    request: pytest.FixtureRequest, in_process_factory: InProcessFactory
) -> AsyncIterator[Tenants]:
    async with in_process_factory(
        database=request.param,
        security__require_keys=True,
        streaming__key_prefix=f"{SESSION_PREFIX}-convlist",
    ) as service:
        clients = await keyed_clients(service, "alpha", "beta")
        alpha, beta = clients["alpha"], clients["beta"]
        kb = f"kb-{uuid.uuid4().hex[:6]}"
        (await alpha.post("/v1/kbs", json={"name": kb})).raise_for_status()
        (
            await alpha.post(
                f"/v1/kbs/{kb}/documents",
                json={"title": "Herons", "text": "Herons nest in spring."},
            )
        ).raise_for_status()
        yield Tenants(service, alpha, beta, kb)
        await alpha.aclose()
        await beta.aclose()


async def _ask(
    client: httpx.AsyncClient, kb: str, question: str, conversation: str | None = None
) -> str:
    body: dict[str, Any] = {"kb": kb, "question": question, "max_tokens": 4, "stream": False}
    if conversation:
        body["conversation_id"] = conversation
    r = await client.post("/v1/answers", json=body)
    assert r.status_code == 200, r.text
    return str(r.json()["conversation_id"])


async def _list(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    r = await client.get("/v1/conversations", params=params)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def _all(client: httpx.AsyncClient, limit: int) -> list[dict[str, Any]]:
    """Every conversation, page by page."""
    seen: list[dict[str, Any]] = []
    before = None
    while True:
        page = await _list(client, limit=limit, **({"before": before} if before else {}))
        assert len(page["data"]) <= limit
        seen += page["data"]
        before = page["next_before"]
        if before is None:
            return seen
        assert page["data"][-1]["id"] == before


async def test_conversations_are_listed_newest_first(tenants: Tenants) -> None:
    alpha, kb = tenants.alpha, tenants.kb
    first = await _ask(alpha, kb, "Where do herons nest?")
    second = await _ask(alpha, kb, "When do herons nest?")
    await _ask(alpha, kb, "And in which month exactly?", conversation=first)  # a follow-up
    third = await _ask(alpha, kb, "长城有多长？")

    listed = await _list(alpha, limit=3)
    assert [c["id"] for c in listed["data"]] == [third, second, first]
    by_id = {c["id"]: c for c in listed["data"]}
    assert by_id[first]["title"] == "Where do herons nest?"
    assert by_id[third]["title"] == "长城有多长？"
    assert by_id[first]["turns"] == 2 and by_id[second]["turns"] == 1
    assert all(c["kb"] == kb and c["kb_id"] for c in listed["data"])
    created = datetime.fromisoformat(by_id[first]["created_at"])
    updated = datetime.fromisoformat(by_id[first]["updated_at"])
    assert created.tzinfo is not None and updated > created  # the follow-up came later
    # a new answer does not move a conversation: creation order, so paging stays stable
    assert datetime.fromisoformat(by_id[second]["created_at"]) > created


async def test_pages_cover_every_conversation_once(tenants: Tenants) -> None:
    alpha, kb = tenants.alpha, tenants.kb
    mine = [await _ask(alpha, kb, f"Question number {n}?") for n in range(5)]
    whole = (await _list(alpha, limit=100))["data"]
    paged = await _all(alpha, limit=2)
    assert [c["id"] for c in paged] == [c["id"] for c in whole]
    assert len({c["id"] for c in paged}) == len(paged)
    assert [c["id"] for c in whole[:5]] == mine[::-1]
    stamps = [(c["created_at"], c["id"]) for c in whole]
    assert stamps == sorted(stamps, reverse=True)


async def test_another_tenants_conversations_never_appear(tenants: Tenants) -> None:
    alpha, beta = tenants.alpha, tenants.beta
    theirs = await _ask(alpha, tenants.kb, "A secret question of alpha's?")
    beta_kb = f"beta-{uuid.uuid4().hex[:6]}"
    (await beta.post("/v1/kbs", json={"name": beta_kb})).raise_for_status()
    mine = await _ask(beta, beta_kb, "Beta's own question?")

    alpha_ids = {c["id"] for c in await _all(alpha, limit=50)}
    beta_list = await _all(beta, limit=50)
    assert theirs in alpha_ids and mine not in alpha_ids
    assert [c["id"] for c in beta_list] == [mine]
    assert beta_list[0]["kb"] == beta_kb
    # alpha's id as beta's cursor is refused exactly as an unknown id is
    nobody = uuid.uuid4().hex
    foreign = await beta.get("/v1/conversations", params={"before": theirs})
    unknown = await beta.get("/v1/conversations", params={"before": nobody})
    assert foreign.status_code == unknown.status_code == 422
    assert foreign.json()["error"]["code"] == unknown.json()["error"]["code"] == "invalid_request"
    said = foreign.json()["error"]["message"].replace(theirs, "ID")
    assert said == unknown.json()["error"]["message"].replace(nobody, "ID")
    # and without a key, nothing
    r = await tenants.service.client.get("/v1/conversations")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


async def test_long_first_questions_are_cut_for_the_title(tenants: Tenants) -> None:
    question = "Why do herons nest in the delta? " + "Tell me more. " * 40
    conv = await _ask(tenants.alpha, tenants.kb, question.strip())
    (listed,) = [c for c in (await _list(tenants.alpha, limit=100))["data"] if c["id"] == conv]
    assert listed["title"] == question.strip()[:200]


@pytest.mark.parametrize(
    ("params", "needle"),
    [({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"before": "nope"}, "before")],
)
async def test_bad_list_requests_get_clear_errors(
    tenants: Tenants, params: dict[str, Any], needle: str
) -> None:
    r = await tenants.alpha.get("/v1/conversations", params=params)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_request"
    assert needle in r.json()["error"]["message"]
