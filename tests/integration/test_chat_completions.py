"""POST /v1/chat/completions and /v1/models with the official ``openai`` client, sync and async,
on the real engine (the tiny random model: the tests compare texts, they do not read them),
real Redis, SQLite and Qdrant local."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import openai
import pytest
from httpx_sse import connect_sse

from tests.conftest import REDIS_URL, ServerFactory
from tests.support.kb import make_kb
from tests.support.server import ServerProcess

pytestmark = pytest.mark.engine

DOCS = [
    (
        "Rivers",
        "# Rivers\n\nThe Zorblat river flows through the town of Quimby before reaching the sea."
        "\n\nIts delta is home to many herons.",
    ),
    (
        "Lighthouses",
        "# Lighthouses\n\nThe Skerry lighthouse was built in 1872 on a granite reef.",
    ),
]


@pytest.fixture(scope="module")
def kb(tiny_server: ServerProcess) -> str:
    return make_kb(tiny_server.url, DOCS, prefix="chat")


@pytest.fixture(scope="module")
def client(tiny_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def engine_model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _fresh(question: str) -> list[dict[str, str]]:
    """Chat messages whose prompt no other test sent (nothing is served from its cache)."""
    return [
        {"role": "system", "content": f"Session {uuid.uuid4().hex[:8]}."},
        {"role": "user", "content": question},
    ]


def _content(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_models_lists_the_engine_model_and_one_per_kb(client: openai.OpenAI, kb: str) -> None:
    models = client.models.list().data
    ids = [m.id for m in models]
    assert ids[0] == "tiny-llama-test"
    assert f"kb:{kb}" in ids
    card = client.models.retrieve(f"kb:{kb}")
    assert card.id == f"kb:{kb}" and card.model_extra is not None
    assert card.model_extra["kb"] == kb
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("kb:no-such-kb")
    assert caught.value.code == "model_not_found"


def test_streaming_and_not_give_the_same_text_and_usage(
    client: openai.OpenAI, engine_model: str
) -> None:
    messages = _fresh("Write a short poem about rivers.")
    whole = client.chat.completions.create(
        model=engine_model, messages=messages, max_tokens=24, temperature=0
    )
    stream = client.chat.completions.create(
        model=engine_model,
        messages=messages,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = _content(chunks)
    assert text and text == whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert {c.id for c in chunks} == {chunks[0].id}  # one completion id for the whole stream
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == whole.choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.completion_tokens == whole.usage.completion_tokens == 24
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.total_tokens == usage.prompt_tokens + 24
    details = usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None
    assert 0 <= details.cached_tokens <= usage.prompt_tokens


def test_prefix_cache_shows_in_cached_tokens(client: openai.OpenAI, engine_model: str) -> None:
    long_system = "You answer briefly. " * 40  # well over one 128-token block
    messages = [
        {"role": "system", "content": f"{uuid.uuid4().hex} {long_system}"},
        {"role": "user", "content": "Say something."},
    ]
    first = client.chat.completions.create(
        model=engine_model, messages=messages, max_tokens=4, temperature=0
    )
    second = client.chat.completions.create(
        model=engine_model, messages=messages, max_tokens=4, temperature=0
    )
    details = [r.usage.prompt_tokens_details for r in (first, second)]
    assert details[0] is not None and details[1] is not None
    assert details[0].cached_tokens == 0
    assert second.usage.prompt_tokens > 128
    assert details[1].cached_tokens == second.usage.prompt_tokens // 128 * 128


def test_kb_stream_sends_sources_before_content_and_annotations_match_markers(
    client: openai.OpenAI, tiny_server: ServerProcess, kb: str
) -> None:
    async def run() -> tuple[list[Any], Any]:
        aclient = openai.AsyncOpenAI(
            base_url=f"{tiny_server.url}/v1", api_key="unused", max_retries=0
        )
        messages = _fresh("Where does the Zorblat river flow?")
        stream = await aclient.chat.completions.create(
            model=f"kb:{kb}", messages=messages, max_tokens=30, temperature=0, stream=True
        )
        chunks = [c async for c in stream]
        whole = await aclient.chat.completions.create(
            model=f"kb:{kb}", messages=messages, max_tokens=30, temperature=0
        )
        await aclient.close()
        return chunks, whole

    chunks, whole = asyncio.run(run())
    with_sources = [i for i, c in enumerate(chunks) if (c.model_extra or {}).get("search_results")]
    first_content = next(i for i, c in enumerate(chunks) if c.choices[0].delta.content)
    assert with_sources and with_sources[0] < first_content
    sources = chunks[with_sources[0]].model_extra["search_results"]
    assert sources[0]["title"] == "Rivers" and "Quimby" in sources[0]["snippet"]
    assert [s["n"] for s in sources] == list(range(1, len(sources) + 1))
    assert chunks[with_sources[0]].model_extra["citations"] == [s["url"] for s in sources]
    # the URL is the chunk, with its document
    chunk = httpx.get(sources[0]["url"], timeout=30).json()
    assert chunk["text"] == sources[0]["snippet"] and chunk["document"]["title"] == "Rivers"

    text = _content(chunks)
    assert text == whole.choices[0].message.content
    assert whole.model_extra is not None
    assert [s["url"] for s in whole.model_extra["search_results"]] == whole.model_extra["citations"]
    streamed = [
        a
        for c in chunks
        if c.choices and c.choices[0].delta.model_extra
        for a in c.choices[0].delta.model_extra.get("annotations") or []
    ]
    stored = [a.model_dump() for a in whole.choices[0].message.annotations or []]
    assert streamed == stored
    by_url = {s["url"]: s["n"] for s in sources}
    for a in stored:  # each one names its marker exactly (none is made up)
        cite = a["url_citation"]
        assert text[cite["start_index"] : cite["end_index"]] == f"[{by_url[cite['url']]}]"


def test_stop_sequence_ends_the_answer_before_it(client: openai.OpenAI, engine_model: str) -> None:
    messages = _fresh("Tell me a long story.")
    free = client.chat.completions.create(
        model=engine_model, messages=messages, max_tokens=40, temperature=0
    )
    text = free.choices[0].message.content or ""
    stop = text[12:15]
    assert len(stop) == 3, text
    expected = text[: text.find(stop)]
    stopped = client.chat.completions.create(
        model=engine_model, messages=messages, max_tokens=40, temperature=0, stop=[stop]
    )
    assert stopped.choices[0].message.content == expected
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model=engine_model,
        messages=messages,
        max_tokens=40,
        temperature=0,
        stop=stop,
        stream=True,
    )
    assert _content(list(streamed)) == expected


@pytest.mark.parametrize(
    ("extra", "status", "param"),
    [
        ({"n": 2}, 400, "n"),
        ({"extra_body": {"frobnicate": 1}}, 400, "frobnicate"),
        ({"frequency_penalty": 0.5}, 400, "frequency_penalty"),
        ({"temperature": "hot"}, 400, "temperature"),
        ({"model": "gpt-4o"}, 404, "model"),
        ({"model": "kb:no-such-kb"}, 404, "model"),
    ],
)
def test_bad_requests_get_openai_errors(
    client: openai.OpenAI, engine_model: str, extra: dict[str, Any], status: int, param: str
) -> None:
    args: dict[str, Any] = {
        "model": engine_model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        **extra,
    }
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(**args)
    err = caught.value
    assert err.status_code == status
    assert isinstance(err.body, dict)
    assert set(err.body) >= {"message", "type", "param", "code"}
    assert err.body["param"] == param
    assert err.body["type"] == "invalid_request_error"
    if status == 404:
        assert err.code == "model_not_found"


def test_neutral_values_of_unsupported_fields_are_accepted(
    client: openai.OpenAI, engine_model: str
) -> None:
    done = client.chat.completions.create(
        model=engine_model,
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=2,
        frequency_penalty=0,
        presence_penalty=0,
        logprobs=False,
        user="someone",
        seed=7,
    )
    assert done.usage is not None and done.usage.completion_tokens == 2


def test_a_dropped_stream_resumes_in_the_chat_format(
    tiny_server: ServerProcess, engine_model: str
) -> None:
    body = {
        "model": engine_model,
        "messages": _fresh("Count slowly to one hundred."),
        "max_tokens": 200,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(base_url=tiny_server.url, timeout=120) as http:
        whole = http.post(
            "/v1/chat/completions", json={**body, "stream": False, "max_tokens": 200}
        ).json()
        seen: list[dict[str, Any]] = []
        last_id = ""
        with connect_sse(http, "POST", "/v1/chat/completions", json=body) as source:
            stream_id = source.response.headers["x-stream-id"]
            for sse in source.iter_sse():
                assert sse.data != "[DONE]", "the stream ended before the client left"
                seen.append(json.loads(sse.data))
                last_id = sse.id
                if len(seen) == 6:
                    break  # leave in the middle
        status = http.get(f"/v1/streams/{stream_id}").json()
        assert status["last_event_id"] >= int(last_id)
        rest: list[str] = []
        with connect_sse(
            http,
            "GET",
            f"/v1/streams/{stream_id}/events",
            headers={"Last-Event-ID": last_id},
        ) as source:
            assert source.response.headers["x-stream-id"] == stream_id
            for sse in source.iter_sse():
                if sse.data:
                    rest.append(sse.data)
    assert rest[-1] == "[DONE]"
    chunks = [json.loads(d) for d in rest[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert {c["id"] for c in seen + chunks} == {f"chatcmpl-{stream_id}"}
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in seen + chunks if c["choices"]
    )
    assert text == whole["choices"][0]["message"]["content"]
    # as the uninterrupted answer ended: "length" mostly; the random tiny model, on this run's
    # fresh prompt, can also reach its end-of-sequence token first ("stop")
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert whole["choices"][0]["finish_reason"] in ("length", "stop")


def test_cancel_ends_a_chat_stream_with_stop_reason_cancelled(stub_server: ServerProcess) -> None:
    """The paced stub engine (200 tokens a second): the stream is surely running when the
    cancel comes, on any machine."""
    with httpx.Client(base_url=stub_server.url, timeout=60) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "go"}],
            "max_tokens": 3000,
            "stream": True,
        }
        chunks: list[dict[str, Any]] = []
        with connect_sse(http, "POST", "/v1/chat/completions", json=body) as source:
            stream_id = source.response.headers["x-stream-id"]
            for sse in source.iter_sse():
                if not sse.data:
                    continue
                if sse.data == "[DONE]":
                    break
                chunks.append(json.loads(sse.data))
                if len(chunks) == 5:
                    assert http.get(f"/v1/streams/{stream_id}").json()["status"] == "running"
                    assert http.post(f"/v1/streams/{stream_id}/cancel").json()["cancelled"]
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert final[-1]["choices"][0]["finish_reason"] == "stop"
    assert final[-1]["choices"][0]["stop_reason"] == "cancelled"
    generated = sum(bool(c["choices"] and c["choices"][0]["delta"].get("content")) for c in chunks)
    assert 3 <= generated < 3000


def test_keep_alives_on_a_quiet_stream_do_not_break_the_openai_client(
    server_factory: ServerFactory,
) -> None:
    """1.5 s between tokens and a keep-alive every second: the SDK (which parses every event's
    data as JSON) must see only chunks. A whole comment block would reach it as an empty
    event, because the last id carries over."""
    server = server_factory(
        stub_delay_s=1.5, RAG_STREAM_REDIS_URL=REDIS_URL, RAG_STREAM_STREAMING__KEEPALIVE_S="1"
    )
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            raw = http.post(
                "/v1/chat/completions",
                json={
                    "model": "stub",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                    "stream": True,
                },
            ).text
        assert ": keep-alive" in raw  # the quiet gaps really had keep-alives in them
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="stub",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                stream=True,
            )
        )
        assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) == 3
    finally:
        server.stop()
