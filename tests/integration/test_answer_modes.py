"""`mode` on /v1/answers and on chat completions (`kb:` models) reaches retrieval: each answer
cites exactly what /v1/kbs/{kb}/search returns in the same mode, and the three modes cite
differently. The stub engine (the answer's text is not the point), the real embedder and store,
in the test process (tests/support/inprocess.py).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.inprocess import InProcess, make_kb

# The question's only word found in any document is the rare "qzvrk", in Hinges: BM25 finds that
# document alone. Its meaning is Herons', which dense ranks first. Hybrid fuses both: Hinges first
# (first for BM25, and ranked by dense too), then Herons.
DOCS = [
    ("Herons", "Grey herons stand motionless in shallow water and spear fish with long beaks."),
    ("Hinges", "Stock item qzvrk is a brass hinge kept in aisle four of the warehouse."),
    ("Tides", "Spring tides follow the full and new moon, when sun and moon pull together."),
]
QUESTION = "Which birds wade in rivers to hunt? qzvrk"
TOP_K = 3
MODES = ("hybrid", "dense", "sparse")


@pytest.fixture(scope="module")
def client(in_process_module: InProcess) -> httpx.AsyncClient:
    return in_process_module.client


@pytest.fixture(scope="module")
async def kb(client: httpx.AsyncClient) -> str:
    return await make_kb(client, DOCS, prefix="modes")


def _ranked(items: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    return [(item["title"], item["chunk_id"], round(item["score"], 6)) for item in items]


async def _searched(client: httpx.AsyncClient, kb: str, mode: str) -> list[tuple[str, str, float]]:
    body = {"query": QUESTION, "top_k": TOP_K, "mode": mode}
    r = await client.post(f"/v1/kbs/{kb}/search", json=body)
    assert r.status_code == 200, r.text
    return _ranked(r.json()["results"])


async def _answered(client: httpx.AsyncClient, kb: str, mode: str) -> list[tuple[str, str, float]]:
    body = {"kb": kb, "question": QUESTION, "top_k": TOP_K, "mode": mode}
    r = await client.post("/v1/answers", json={**body, "stream": False, "max_tokens": 4})
    assert r.status_code == 200, r.text
    return _ranked(r.json()["citations"])


async def _chat_sources(
    client: httpx.AsyncClient, kb: str, mode: str
) -> list[tuple[str, str, float]]:
    body = {
        "model": f"kb:{kb}",
        "messages": [{"role": "user", "content": QUESTION}],
        "top_k": TOP_K,
        "mode": mode,
        "max_tokens": 4,
    }
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return _ranked(r.json()["search_results"])


async def test_answers_and_chat_cite_what_search_finds_in_the_same_mode(
    client: httpx.AsyncClient, kb: str
) -> None:
    searched = {mode: await _searched(client, kb, mode) for mode in MODES}
    # The premise: the modes rank differently here, so an answer that ignored its mode would
    # cite another mode's sources.
    assert [t for t, _, _ in searched["sparse"]] == ["Hinges"]
    assert searched["dense"][0][0] == "Herons"
    assert [t for t, _, _ in searched["hybrid"][:2]] == ["Hinges", "Herons"]
    assert len({tuple(found) for found in searched.values()}) == len(MODES)
    for mode in MODES:
        assert await _answered(client, kb, mode) == searched[mode], mode
        assert await _chat_sources(client, kb, mode) == searched[mode], mode


async def test_an_unknown_mode_is_refused_naming_the_field(
    client: httpx.AsyncClient, kb: str
) -> None:
    r = await client.post("/v1/answers", json={"kb": kb, "question": QUESTION, "mode": "fuzzy"})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and "mode" in error["message"]

    chat = {"model": f"kb:{kb}", "messages": [{"role": "user", "content": "x"}], "mode": "fuzzy"}
    r = await client.post("/v1/chat/completions", json=chat)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == "mode"


# Open WebUI offers its built-in tools with every message (tool_choice left to the model).
OFFERED_TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": {}}},
    }
    for name in ("get_current_timestamp", "search_notes", "add_memory")
]


async def test_chat_with_offered_tools_answers_in_text_on_both_models(
    client: httpx.AsyncClient, kb: str
) -> None:
    models = (await client.get("/v1/models")).json()["data"]
    for model in (models[0]["id"], f"kb:{kb}"):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Which birds wade in rivers?"}],
            "max_tokens": 4,
            "tools": OFFERED_TOOLS,
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        }
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert message["content"] and not message.get("tool_calls"), message
        required = await client.post(
            "/v1/chat/completions", json={**body, "tool_choice": "required"}
        )
        assert required.status_code == 400, required.text
        assert required.json()["error"]["param"] == "tool_choice"
