"""`mode` on /v1/answers and on chat completions (`kb:` models) reaches retrieval: each answer
cites exactly what /v1/kbs/{kb}/search returns in the same mode, and the three modes cite
differently. The stub engine (the answer's text is not the point), the real embedder and store.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.kb import make_kb
from tests.support.server import ServerProcess

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
def client(stub_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stub_server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def kb(stub_server: ServerProcess) -> str:
    return make_kb(stub_server.url, DOCS, prefix="modes")


def _ranked(items: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    return [(item["title"], item["chunk_id"], round(item["score"], 6)) for item in items]


def _searched(client: httpx.Client, kb: str, mode: str) -> list[tuple[str, str, float]]:
    body = {"query": QUESTION, "top_k": TOP_K, "mode": mode}
    r = client.post(f"/v1/kbs/{kb}/search", json=body)
    assert r.status_code == 200, r.text
    return _ranked(r.json()["results"])


def _answered(client: httpx.Client, kb: str, mode: str) -> list[tuple[str, str, float]]:
    body = {"kb": kb, "question": QUESTION, "top_k": TOP_K, "mode": mode}
    r = client.post("/v1/answers", json={**body, "stream": False, "max_tokens": 4})
    assert r.status_code == 200, r.text
    return _ranked(r.json()["citations"])


def _chat_sources(client: httpx.Client, kb: str, mode: str) -> list[tuple[str, str, float]]:
    body = {
        "model": f"kb:{kb}",
        "messages": [{"role": "user", "content": QUESTION}],
        "top_k": TOP_K,
        "mode": mode,
        "max_tokens": 4,
    }
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return _ranked(r.json()["search_results"])


def test_answers_and_chat_cite_what_search_finds_in_the_same_mode(
    client: httpx.Client, kb: str
) -> None:
    searched = {mode: _searched(client, kb, mode) for mode in MODES}
    # The premise: the modes rank differently here, so an answer that ignored its mode would
    # cite another mode's sources.
    assert [t for t, _, _ in searched["sparse"]] == ["Hinges"]
    assert searched["dense"][0][0] == "Herons"
    assert [t for t, _, _ in searched["hybrid"][:2]] == ["Hinges", "Herons"]
    assert len({tuple(found) for found in searched.values()}) == len(MODES)
    for mode in MODES:
        assert _answered(client, kb, mode) == searched[mode], mode
        assert _chat_sources(client, kb, mode) == searched[mode], mode


def test_an_unknown_mode_is_refused_naming_the_field(client: httpx.Client, kb: str) -> None:
    r = client.post("/v1/answers", json={"kb": kb, "question": QUESTION, "mode": "fuzzy"})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and "mode" in error["message"]

    chat = {"model": f"kb:{kb}", "messages": [{"role": "user", "content": "x"}], "mode": "fuzzy"}
    r = client.post("/v1/chat/completions", json=chat)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["param"] == "mode"
