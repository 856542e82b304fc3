"""The embedded defaults end to end: SmolLM2 on vLLM, embedded redis, SQLite, local Qdrant."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.support.kb import make_kb
from tests.support.server import ServerProcess
from tests.support.sse import read_stream, text_of

pytestmark = [pytest.mark.engine, pytest.mark.smollm2]


def test_embedded_state_lives_under_the_data_dir(
    default_server: ServerProcess, default_data_dir: Path
) -> None:
    ready = httpx.get(default_server.url + "/readyz").json()
    assert ready["status"] == "ready"
    assert (default_data_dir / "rag-stream.db").is_file()
    assert (default_data_dir / "vectors").is_dir()  # the embedded vector store (qdrant-edge)
    assert (default_data_dir / "redis").is_dir()
    # the embedded Redis is a real redis-server process working in that folder
    redis_dir = str((default_data_dir / "redis").resolve())
    servers = [p for p in psutil.process_iter(["name", "cwd"]) if p.info["name"] == "redis-server"]
    assert any(p.info["cwd"] == redis_dir for p in servers)


def test_smollm2_answers_a_fixed_question(default_server: ServerProcess) -> None:
    body = {"prompt": "What is the capital of France?", "chat": True, "max_tokens": 30}
    with httpx.Client(base_url=default_server.url, timeout=120) as client:
        frames = read_stream(client, "POST", "/v1/generate", json=body)
    answer = text_of(frames)
    assert "Paris" in answer, answer
    assert frames[-1].event == "done"
    assert frames[-1].data["finish_reason"] == "stop"
    # tokens arrive one event at a time, not as one blob
    assert sum(f.event == "token" for f in frames) >= 5


def test_smollm2_answers_from_the_knowledge_base(default_server: ServerProcess) -> None:
    kb = make_kb(
        default_server.url,
        [
            ("Rivers", "The Zorblat river flows through the town of Quimby before the sea."),
            ("Birds", "Herons nest in tall trees near water and eat fish and frogs."),
        ],
    )
    body = {
        "kb": kb,
        "question": "Which town does the Zorblat river flow through?",
        "max_tokens": 40,
    }
    with httpx.Client(base_url=default_server.url, timeout=300) as client:
        frames = read_stream(client, "POST", "/v1/answers", json=body)
    assert frames[1].event == "citation" and frames[1].data["title"] == "Rivers"
    assert "Quimby" in text_of(frames)


def test_chinese_document_and_question_stream_valid_utf8(default_server: ServerProcess) -> None:
    kb = make_kb(
        default_server.url,
        [("长城", "长城是中国古代的军事防御工程，东起山海关，西至嘉峪关，全长超过两万公里。")],
        prefix="zh",
    )
    body = {"kb": kb, "question": "长城有多长？请用中文回答。", "max_tokens": 60}
    with httpx.Client(base_url=default_server.url, timeout=300) as client:
        frames = read_stream(client, "POST", "/v1/answers", json=body)
    tokens = [f.data["text"] for f in frames if f.event == "token"]
    answer = "".join(tokens)
    assert answer.strip()
    assert all("\ufffd" not in t for t in tokens), answer
    assert any(ord(c) > 0x2E80 for c in answer), answer  # the model really wrote CJK text
    citation = next(f.data for f in frames if f.event == "citation")
    assert "长城" in citation["snippet"]


def test_sample_docs_kb_is_ingested_on_first_serve(default_server: ServerProcess) -> None:
    deadline = time.monotonic() + 120
    while True:
        r = httpx.get(f"{default_server.url}/v1/kbs/docs", timeout=30)
        if r.status_code == 200 and r.json()["document_count"] > 0:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(1)
    hits = httpx.post(
        f"{default_server.url}/v1/kbs/docs/search",
        json={"query": "Last-Event-ID resume", "top_k": 3},
        timeout=60,
    ).json()
    assert hits["results"], hits


def test_openai_client_gets_sources_and_annotations_from_smollm2(
    default_server: ServerProcess,
) -> None:
    """The whole chat-completions citation path on a model that really cites: the answer's
    [n] markers come back as url_citation annotations naming the right sources."""
    kb = make_kb(
        default_server.url,
        [
            ("Rivers", "The Zorblat river flows through the town of Quimby before the sea."),
            ("Birds", "Herons nest in tall trees near water and eat fish and frogs."),
        ],
    )
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused", max_retries=0)
    ask = {
        "model": f"kb:{kb}",
        "messages": [{"role": "user", "content": "What do herons eat? Cite your sources."}],
        "max_tokens": 60,
        "temperature": 0,
    }
    whole = client.chat.completions.create(**ask)
    message = whole.choices[0].message
    text = message.content or ""
    assert whole.model_extra is not None
    sources = {s["url"]: s for s in whole.model_extra["search_results"]}
    marks = message.annotations or []
    assert marks, text  # this question makes SmolLM2 cite (greedy: every run the same)
    for mark in marks:
        cite = mark.url_citation
        source = sources[cite.url]
        assert text[cite.start_index : cite.end_index] == f"[{source['n']}]"
        assert cite.title == source["title"]
    assert {m.url_citation.title for m in marks} >= {"Birds"}
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [
        a
        for c in chunks
        if c.choices and c.choices[0].delta.model_extra
        for a in c.choices[0].delta.model_extra.get("annotations") or []
    ]
    assert streamed == [m.model_dump() for m in marks]


def test_ignore_eos_generates_exactly_max_tokens(default_server: ServerProcess) -> None:
    """vLLM's extra parameter (its benchmark client sends it): past end-of-sequence."""
    client = openai.OpenAI(base_url=f"{default_server.url}/v1", api_key="unused", max_retries=0)
    ask = {
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 48,
        "temperature": 0,
    }
    short = client.chat.completions.create(**ask)
    assert short.choices[0].finish_reason == "stop"  # it ends by itself, early
    assert short.usage is not None and short.usage.completion_tokens < 48
    full = client.chat.completions.create(**ask, extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length"
    assert full.usage is not None and full.usage.completion_tokens == 48
    first = short.choices[0].message.content or ""
    assert (full.choices[0].message.content or "").startswith(first)
