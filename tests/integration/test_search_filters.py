"""Search filters on every metadata type an upload accepts: on the real stores (SQLite and
PostgreSQL; qdrant-edge and qdrant-client's local mode; the real embedder), in each search mode,
then over HTTP, on the service in the test process (tests/support/inprocess.py)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from qdrant_client import AsyncQdrantClient

from rag_stream.errors import VectorStoreUnavailable
from rag_stream.ingest.documents import DocumentDraft
from rag_stream.ingest.parsing import parse_plain
from rag_stream.retrieval.qdrant_store import QdrantVectorStore
from rag_stream.retrieval.vector_store import VectorQuery
from rag_stream.schemas.kbs import SearchMode
from rag_stream.schemas.tenants import LOCAL_TENANT
from tests.support.inprocess import InProcess

# The fixtures come from tests/support/kb_stack.py; test arguments reuse their names.
# ruff: noqa: F811
from tests.support.kb_stack import (  # noqa: F401
    Stack,
    backend,
    db_url,
    embedder,
    stack,
)
from tests.support.server import free_port

BIG = 2**53  # from here on floats no longer hold every integer
# One short document each (one chunk), all about the same thing so every one is a candidate.
DOCS: dict[str, dict[str, Any]] = {
    "A": {"team": "zoo", "score": 1.5, "draft": True, "tags": ["red", "blue"], "big": BIG + 1},
    "B": {"team": "3", "score": 2, "draft": False, "tags": ["green"]},
    "C": {"team": 3, "score": 2.0, "draft": 1, "tags": [3, "red"], "big": BIG},
    "D": {"team": True, "score": 0.1, "draft": 0, "tags": []},
    "E": {"mixed": ["x", 7, 2.5, False], "score": -1.5},
}
QUERY = "the heron in the reeds"


def _text(title: str) -> str:
    return f"Note {title}: the heron waits in the reeds by the river before it strikes."


# Each filter with exactly the documents it must return.
CASES: list[tuple[dict[str, Any], set[str]]] = [
    ({"score": 1.5}, {"A"}),  # a float (was a 503)
    ({"score": 0.1}, {"D"}),
    ({"score": -1.5}, {"E"}),
    ({"score": 2}, {"B", "C"}),  # numbers by value: 2 is 2.0
    ({"score": 2.0}, {"B", "C"}),
    ({"draft": True}, {"A"}),  # true is not 1, false is not 0
    ({"draft": 1}, {"C"}),
    ({"draft": False}, {"B"}),
    ({"draft": 0}, {"D"}),
    ({"team": "3"}, {"B"}),  # "3" is not 3
    ({"team": 3}, {"C"}),
    ({"team": True}, {"D"}),
    ({"team": ["zoo", 3]}, {"A", "C"}),  # a mixed list: any of (was a 503)
    ({"team": [True, "3", 2.5]}, {"B", "D"}),
    ({"tags": "red"}, {"A", "C"}),  # list-valued metadata: any element
    ({"tags": ["green", 3.0]}, {"B", "C"}),
    ({"mixed": 2.5}, {"E"}),
    ({"mixed": False}, {"E"}),
    ({"mixed": [0, "y"]}, set()),
    ({"big": BIG}, {"C"}),  # matched as integers, exactly: as floats both are 2.0**53
    ({"big": BIG + 1}, {"A"}),
    ({"team": ["zoo", 3], "score": 2}, {"C"}),  # every key
    ({"nothing": "here"}, set()),
]


async def _filter_kb(stack: Stack) -> str:
    kb = await stack.new_kb()
    for title, meta in DOCS.items():
        await stack.ingestor.ingest(
            kb, DocumentDraft(title, parse_plain(_text(title)), meta=meta), tenant=LOCAL_TENANT
        )
    return kb


@pytest.mark.parametrize("mode", ["hybrid", "dense", "sparse"])
async def test_each_filter_returns_exactly_its_documents(stack: Stack, mode: SearchMode) -> None:
    kb = await _filter_kb(stack)
    assert {h.title for h in await stack.retriever.search(kb, QUERY, 20, mode=mode)} == set(DOCS)
    for meta_filter, expected in CASES:
        hits = await stack.retriever.search(kb, QUERY, 20, meta_filter=meta_filter, mode=mode)
        assert {h.title for h in hits} == expected, (mode, meta_filter)


async def test_an_empty_list_matches_nothing_below_the_api(stack: Stack) -> None:
    kb = await _filter_kb(stack)
    assert await stack.retriever.search(kb, QUERY, 20, meta_filter={"team": []}) == []


async def test_a_filter_value_of_no_metadata_type_is_a_bug_not_an_outage(stack: Stack) -> None:
    kb = await _filter_kb(stack)
    bad: Any = {"team": {"nested": 1}}  # what the request schema refuses
    with pytest.raises(TypeError, match=r"cannot filter meta\.team on a dict"):
        await stack.retriever.search(kb, QUERY, 5, meta_filter=bad)


# An unreachable Qdrant server is a 503 with a short reason, not the client's exception text.


async def test_an_unreachable_vector_store_is_unavailable_without_details() -> None:
    port = free_port()  # nothing listens there
    store = QdrantVectorStore(
        AsyncQdrantClient(url=f"http://127.0.0.1:{port}", timeout=2, check_compatibility=False)
    )
    try:
        with pytest.raises(VectorStoreUnavailable) as caught:
            await store.search(
                "kb", VectorQuery("dense", [0.1, 0.2]), 3, meta_filter={"score": 1.5}
            )
    finally:
        await store.close()
    assert caught.value.message == "vector store search failed: cannot connect"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


async def test_a_vector_store_that_never_answers_times_out(silent_port: int) -> None:
    store = QdrantVectorStore(
        AsyncQdrantClient(
            url=f"http://127.0.0.1:{silent_port}", timeout=1, check_compatibility=False
        )
    )
    try:
        with pytest.raises(VectorStoreUnavailable) as caught:
            await store.ping()
    finally:
        await store.close()
    assert caught.value.message == "vector store check failed: timed out"


# Over HTTP, on the service in the test process.

LEAKS = ("validation error", "input_value", "type=", "pydantic", "Traceback", "/")


@pytest.fixture(scope="module")
def client(in_process_module: InProcess) -> httpx.AsyncClient:
    return in_process_module.client


@pytest.fixture(scope="module")
async def kb(client: httpx.AsyncClient) -> str:
    name = f"filters-{uuid.uuid4().hex[:8]}"
    (await client.post("/v1/kbs", json={"name": name})).raise_for_status()
    for title, meta in DOCS.items():
        doc = {"title": title, "text": _text(title), "metadata": meta}
        (await client.post(f"/v1/kbs/{name}/documents", json=doc)).raise_for_status()
    return name


async def _titles(client: httpx.AsyncClient, kb: str, meta_filter: dict[str, Any]) -> set[str]:
    body = {"query": QUERY, "top_k": 20, "filter": meta_filter}
    r = await client.post(f"/v1/kbs/{kb}/search", json=body)
    assert r.status_code == 200, r.text
    return {hit["title"] for hit in r.json()["results"]}


async def test_filters_on_floats_and_mixed_lists_return_results(
    client: httpx.AsyncClient, kb: str
) -> None:
    for meta_filter, expected in CASES:
        assert await _titles(client, kb, meta_filter) == expected, meta_filter


async def test_search_takes_a_mode_and_refuses_an_unknown_one(
    client: httpx.AsyncClient, kb: str
) -> None:
    for mode in ("hybrid", "dense", "sparse"):
        body = {"query": QUERY, "top_k": 20, "mode": mode, "filter": {"team": ["zoo", 3]}}
        r = await client.post(f"/v1/kbs/{kb}/search", json=body)
        assert r.status_code == 200, r.text
        assert {hit["title"] for hit in r.json()["results"]} == {"A", "C"}
    r = await client.post(f"/v1/kbs/{kb}/search", json={"query": QUERY, "mode": "fuzzy"})
    assert r.status_code == 422 and "mode" in r.json()["error"]["message"]


async def _refused(client: httpx.AsyncClient, path: str, body: bytes | dict[str, Any]) -> str:
    if isinstance(body, bytes):  # JSON that json.dumps would not write (NaN)
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = await client.post(path, json=body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request"
    message: str = error["message"]
    assert not [leak for leak in LEAKS if leak in message], message
    return message


@pytest.mark.parametrize(
    ("meta_filter", "says"),
    [
        ({"team": []}, "filter.team: an empty list matches nothing; leave the key out instead"),
        ({"team": [["zoo"]]}, "filter.team: a list may only hold strings, numbers, true and false"),
        ({"team": {"a": 1}}, "filter.team: must be a string, a number, true or false, or a list"),
        ({"team": None}, "filter.team: must be a string, a number, true or false, or a list"),
        ({"team": ["zoo", None]}, "filter.team: must be a string, a number, true or false"),
        ({"big": 2**64}, "filter.big: integers must fit in 64 bits (signed)"),
        ({"team": list(range(257))}, "filter.team: at most 256 values a key"),
        ({f"k{i}": 1 for i in range(33)}, "filter: at most 32 keys"),
        ({"a.b": 1}, "filter.a.b.[key]: String should match pattern"),
    ],
)
async def test_bad_filters_are_refused_with_the_reason(
    client: httpx.AsyncClient, kb: str, meta_filter: dict[str, Any], says: str
) -> None:
    body = {"query": QUERY, "filter": meta_filter}
    assert (await _refused(client, f"/v1/kbs/{kb}/search", body)).startswith(says)


async def test_non_finite_numbers_are_refused_in_filters_and_uploads(
    client: httpx.AsyncClient, kb: str
) -> None:
    search = b'{"query": "heron", "filter": {"score": NaN}}'
    message = await _refused(client, f"/v1/kbs/{kb}/search", search)
    assert message == "filter.score: numbers must be finite (no NaN or infinity)"
    threshold = b'{"query": "heron", "score_threshold": NaN}'
    said = await _refused(client, f"/v1/kbs/{kb}/search", threshold)
    assert said.startswith("score_threshold:")
    upload = b'{"title": "t", "text": "heron", "metadata": {"score": Infinity}}'
    message = await _refused(client, f"/v1/kbs/{kb}/documents", upload)
    assert message == "metadata.score: numbers must be finite (no NaN or infinity)"
    assert (await client.get(f"/v1/kbs/{kb}")).json()["document_count"] == len(DOCS)
