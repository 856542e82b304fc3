"""How a chat-completions stream sends its sources, as the client asked
(``X-Rag-Stream-Sources``): ``search_results`` for every client by default, or one Open WebUI
``source`` event chunk per source (numbered chips in its page), all before the first token.
The service in the test process on the stub engine (tests/support/inprocess.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.inprocess import InProcess, make_kb

DOCS = [
    ("Herons", "Grey herons stand motionless in shallow water and spear fish with long beaks."),
    ("Tides", "Spring tides follow the full and new moon, when sun and moon pull together."),
    ("Owls", "Barn owls hunt voles at night, finding them by sound alone."),
]
pytestmark = pytest.mark.in_process(text="Herons eat fish [3] and [1], says [3]. ")


@pytest.fixture(scope="module")
def client(in_process_module: InProcess) -> httpx.AsyncClient:
    return in_process_module.client


@pytest.fixture(scope="module")
async def kb(client: httpx.AsyncClient) -> str:
    return await make_kb(client, DOCS, prefix="chips")


async def _chunks(client: httpx.AsyncClient, kb: str, **headers: str) -> list[dict[str, Any]]:
    body = {
        "model": f"kb:{kb}",
        "messages": [{"role": "user", "content": "What do herons eat?"}],
        "max_tokens": 80,  # twice round the stub text (one character a token)
        "stream": True,
    }
    r = await client.post("/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    datas = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    return [json.loads(d) for d in datas if d != "[DONE]"]


def _first_content(chunks: list[dict[str, Any]]) -> int:
    return next(
        i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content")
    )


async def test_open_webui_gets_a_source_event_per_source_before_the_answer(
    client: httpx.AsyncClient, kb: str
) -> None:
    chunks = await _chunks(client, kb, **{"X-Rag-Stream-Sources": "open-webui"})
    events = [(i, c["event"]) for i, c in enumerate(chunks) if "event" in c]
    assert len(events) == 3 and events[-1][0] < _first_content(chunks)
    names = [e["data"]["source"]["name"] for _, e in events]
    assert [name.split("]")[0] for name in names] == ["[1", "[2", "[3"]
    for _, event in events:  # each chip's window: the snippet, the score, the chunk's URL
        data = event["data"]
        chunk = (await client.get(data["source"]["url"])).json()
        assert data["document"] == [chunk["text"]] and len(data["distances"]) == 1
    # its chips came first: no annotations, no search_results
    assert not any("search_results" in c for c in chunks)
    assert not any(c["choices"] and "annotations" in c["choices"][0]["delta"] for c in chunks)


async def test_other_clients_keep_search_results_and_get_each_cited_source_once(
    client: httpx.AsyncClient, kb: str
) -> None:
    chunks = await _chunks(client, kb)
    assert not any("event" in c for c in chunks)
    with_sources = [i for i, c in enumerate(chunks) if "search_results" in c]
    assert with_sources and with_sources[0] < _first_content(chunks)
    marks = [
        a["url_citation"]
        for c in chunks
        if c["choices"]
        for a in c["choices"][0]["delta"].get("annotations", [])
    ]
    by_url = {s["url"]: s["n"] for s in chunks[with_sources[0]]["search_results"]}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    cited = [by_url[m["url"]] for m in marks]
    assert cited == sorted(set(cited)) and len(cited) >= 2, text  # once each, in n order
    for m in marks:
        assert text[m["start_index"] : m["end_index"]] == f"[{by_url[m['url']]}]"


async def test_an_unknown_source_shape_is_a_400_naming_the_header(
    client: httpx.AsyncClient, kb: str
) -> None:
    body = {"model": f"kb:{kb}", "messages": [{"role": "user", "content": "q"}]}
    r = await client.post(
        "/v1/chat/completions", json=body, headers={"X-Rag-Stream-Sources": "chips"}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "X-Rag-Stream-Sources" in (error["param"] or "") + error["message"], error
