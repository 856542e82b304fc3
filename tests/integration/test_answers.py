"""POST /v1/answers end to end: real engine, real KB (Qdrant local + MiniLM), real Redis."""

from __future__ import annotations

import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.kb import make_kb
from tests.support.server import ServerProcess
from tests.support.sse import Frame, read_stream, text_of

pytestmark = pytest.mark.engine

DOCS = [
    (
        "Lighthouses",
        "# Lighthouses\n\nThe Skerry lighthouse was built in 1872 on a granite reef. Its lamp "
        "burned whale oil until 1905.\n\n## Keepers\n\nThree keepers lived at Skerry in rotation.",
    ),
    (
        "Rivers",
        "# Rivers\n\nThe Zorblat river flows through the town of Quimby before reaching the sea."
        "\n\nIts delta is home to many herons.",
    ),
]


@pytest.fixture(scope="module")
def kb(tiny_server: ServerProcess) -> str:
    return make_kb(tiny_server.url, DOCS)


def _answer(server: ServerProcess, **body: object) -> list[Frame]:
    with httpx.Client(base_url=server.url, timeout=300) as client:
        return read_stream(client, "POST", "/v1/answers", json=body)


def test_citations_come_first_then_tokens_then_done(tiny_server: ServerProcess, kb: str) -> None:
    frames = _answer(
        tiny_server, kb=kb, question="Where does the Zorblat river flow?", top_k=3, max_tokens=30
    )
    assert [f.id for f in frames] == list(range(len(frames)))
    kinds = [f.event for f in frames]
    assert kinds[0] == "stream"
    n_cit = kinds.count("citation")
    assert n_cit >= 2
    assert kinds[1 : 1 + n_cit] == ["citation"] * n_cit
    assert set(kinds[1 + n_cit : -1]) == {"token"}
    assert kinds[-1] == "done"
    citations = [f.data for f in frames if f.event == "citation"]
    assert [c["n"] for c in citations] == list(range(1, n_cit + 1))
    best = citations[0]
    assert best["title"] == "Rivers" and "Quimby" in best["snippet"]
    assert best["offsets"][1] > best["offsets"][0]
    scores = [c["score"] for c in citations]
    assert scores == sorted(scores, reverse=True)
    done = frames[-1].data
    assert done["finish_reason"] in ("stop", "length")
    assert done["timings"]["retrieval_ms"] > 0
    assert done["usage"]["prompt_tokens"] > 0
    # `cited` lists the [n] markers of the answer that name a source sent
    markers = {int(m) for m in re.findall(r"\[(\d+)\]", text_of(frames))}
    assert done["cited"] == sorted(n for n in markers if 1 <= n <= n_cit)


def test_streamed_answer_equals_the_non_streaming_answer(
    tiny_server: ServerProcess, kb: str
) -> None:
    body = {
        "kb": kb,
        "question": "When was the Skerry lighthouse built?",
        "max_tokens": 40,
        "seed": 3,
    }
    frames = _answer(tiny_server, **body)
    whole = httpx.post(
        f"{tiny_server.url}/v1/answers", json={**body, "stream": False}, timeout=300
    ).json()
    assert whole["answer"] == text_of(frames)
    assert [c["chunk_id"] for c in whole["citations"]] == [
        f.data["chunk_id"] for f in frames if f.event == "citation"
    ]
    assert whole["finish_reason"] == frames[-1].data["finish_reason"]


def test_prefilled_stable_prefix_is_served_from_the_cache(
    tiny_server: ServerProcess, kb: str
) -> None:
    # a long question makes the stable part span more than one 128-token KV block
    question = "Tell me everything about the keepers of lighthouses " + "and their duties " * 40
    frames = _answer(tiny_server, kb=kb, question=question.strip(), max_tokens=5)
    usage = frames[-1].data["usage"]
    assert usage["cached_tokens"] >= 128, usage


def test_conversation_is_persisted_and_used_as_history(tiny_server: ServerProcess, kb: str) -> None:
    first = _answer(tiny_server, kb=kb, question="What did the lamp burn?", max_tokens=10)
    conv = first[0].data["conversation_id"]
    second = _answer(
        tiny_server, kb=kb, question="Until when?", conversation_id=conv, max_tokens=10
    )
    assert second[0].data["conversation_id"] == conv
    # the history (first question and answer) is part of the second prompt
    assert second[-1].data["usage"]["prompt_tokens"] > first[-1].data["usage"]["prompt_tokens"]
    data = httpx.get(f"{tiny_server.url}/v1/conversations/{conv}").json()
    roles = [m["role"] for m in data["messages"]]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert data["messages"][0]["content"] == "What did the lamp burn?"
    assert data["messages"][1]["content"] == text_of(first)
    assert data["messages"][1]["citations"]["sources"][0]["chunk_id"]
    assert data["messages"][3]["usage"]["completion_tokens"] > 0


def test_sources_that_do_not_fit_the_window_are_dropped(tiny_server: ServerProcess) -> None:
    long_doc = "\n\n".join(
        f"## Section {i}\n\n" + f"Paragraph {i} talks about herons and rivers. " * 40
        for i in range(30)
    )
    name = make_kb(tiny_server.url, [("Long", long_doc)], prefix="long")
    frames = _answer(tiny_server, kb=name, question="herons", top_k=20, max_tokens=512)
    done = frames[-1].data
    assert done["finish_reason"] in ("stop", "length")
    assert done["dropped_sources"] > 0
    cited = [f for f in frames if f.event == "citation"]
    assert len(cited) + done["dropped_sources"] == 20
    assert done["usage"]["prompt_tokens"] + 512 <= 2048


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"kb": "no-such-kb", "question": "x"}, 404, "no-such-kb"),
        ({"question": "   "}, 422, "question"),
        ({"question": ""}, 422, "question"),
        ({"question": "x" * 5000}, 413, "4000"),
        ({"question": "x", "max_tokens": 0}, 422, "max_tokens"),
        ({"question": "x", "max_tokens": 9999}, 422, "max_tokens must be between 1 and 512"),
        ({"question": "x", "top_k": 50}, 422, "top_k"),
        ({"question": "x", "conversation_id": "nope"}, 404, "conversation"),
    ],
)
def test_bad_answer_requests_get_clear_errors(
    tiny_server: ServerProcess, kb: str, body: dict[str, object], status: int, needle: str
) -> None:
    r = httpx.post(f"{tiny_server.url}/v1/answers", json={"kb": kb, **body}, timeout=60)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def _samples(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_count_what_an_answer_did(tiny_server: ServerProcess, kb: str) -> None:
    before = _samples(tiny_server)
    frames = _answer(tiny_server, kb=kb, question="herons?", max_tokens=5)
    after = _samples(tiny_server)
    usage, reason = frames[-1].data["usage"], frames[-1].data["finish_reason"]

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("rag_stream_requests_total", route="/v1/answers", method="POST", status="200") == 1
    assert grew("rag_stream_ttft_seconds_count", kind="answer") == 1
    assert grew("rag_stream_streams_finished_total", kind="answer", finish_reason=reason) == 1
    assert grew("rag_stream_retrieval_seconds_count") == 1
    assert grew("rag_stream_queue_seconds_count") == 1
    assert grew("rag_stream_completion_tokens_total") == usage["completion_tokens"] > 0
    assert grew("rag_stream_prompt_tokens_total") == usage["prompt_tokens"]
    assert grew("rag_stream_prefix_cache_hit_tokens_total") == usage["cached_tokens"]
