"""The AI SDK's UI chat (``POST /v1/ui/chat``, ``GET /v1/ui/chat/{id}/stream``): the parts and
their order, resume by the chat's id, Stop through the cancel route, and what it refuses. The
service in the test process on the paced stub engine, the real embedder and store
(tests/support/inprocess.py); tests/e2e/test_ai_sdk.py runs the real ``ai`` package against the
real engine.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from tests.support.inprocess import InProcess, make_kb
from tests.support.waiting import eventually

DOCS = [
    ("Herons", "Grey herons stand motionless in shallow water and spear fish with long beaks."),
    ("Tides", "Spring tides follow the full and new moon, when sun and moon pull together."),
]
QUESTION = "What do herons eat?"
pytestmark = pytest.mark.in_process(
    delay_s=0.01,
    text="Herons eat fish [1]. ",  # ASCII: one event a token
    limits__max_tokens=4000,
    streaming__chat_abandon_after_s=1.0,
    streaming__abandon_after_s=30,
)


@pytest.fixture(scope="module")
async def kb(in_process_module: InProcess) -> str:
    return await make_kb(in_process_module.client, DOCS, prefix="ui")


def _body(kb: str, chat_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """What DefaultChatTransport sends, with rag-stream's extras."""
    return {
        "id": chat_id or f"chat-{uuid.uuid4().hex[:8]}",
        "messages": [
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": QUESTION}]},
        ],
        "trigger": "submit-message",
        "messageId": None,
        "model": f"kb:{kb}",
        "max_tokens": 20,
        **extra,
    }


def _parts(raw: str) -> list[Any]:
    """The data of each SSE frame: a part's JSON, or the string [DONE]."""
    out: list[Any] = []
    for block in raw.split("\n\n"):
        data = [line[6:] for line in block.split("\n") if line.startswith("data: ")]
        if data:
            out.append(data[0] if data[0] == "[DONE]" else json.loads(data[0]))
    return out


def _text(parts: list[Any]) -> str:
    return "".join(p["delta"] for p in parts if isinstance(p, dict) and p["type"] == "text-delta")


async def _status(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    r = await client.get(f"/v1/streams/{sid}")
    assert r.status_code == 200, r.text
    status: dict[str, Any] = r.json()
    return status


async def test_sources_come_first_then_the_text_then_finish(
    in_process_module: InProcess, kb: str
) -> None:
    client = in_process_module.client
    r = await client.post("/v1/ui/chat", json=_body(kb, messageId="m-7"))
    assert r.status_code == 200, r.text
    assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
    parts = _parts(r.text)
    types = [p if p == "[DONE]" else p["type"] for p in parts]
    k = types.count("source-url")
    assert k == 2
    assert types[: 2 + k] == ["start", *["source-url"] * k, "text-start"]
    assert types[-4:] == ["text-delta", "text-end", "finish", "[DONE]"]
    start, finish = parts[0], parts[-2]
    sid = r.headers["x-stream-id"]
    assert start["messageId"] == "m-7" and start["messageMetadata"]["streamId"] == sid
    assert finish["finishReason"] == "length"
    meta = finish["messageMetadata"]
    assert meta["streamId"] == sid and meta["usage"]["completionTokens"] == 20
    # the same sources, numbered and ordered as /v1/answers gives them
    native = await client.post(
        "/v1/answers", json={"kb": kb, "question": QUESTION, "max_tokens": 20, "stream": False}
    )
    cited = native.json()["citations"]
    sources = [p for p in parts if isinstance(p, dict) and p["type"] == "source-url"]
    assert [s["sourceId"] for s in sources] == [str(c["n"]) for c in cited]
    assert [s["title"] for s in sources] == [c["title"] for c in cited]
    assert sources[0]["providerMetadata"]["ragStream"]["snippet"] == cited[0]["snippet"]
    chunk = (await client.get(sources[0]["url"])).json()  # the URL is the chunk
    assert chunk["text"] == cited[0]["snippet"]
    assert _text(parts) == native.json()["answer"]


async def test_the_plain_model_streams_text_without_sources(in_process_module: InProcess) -> None:
    client = in_process_module.client
    model = (await client.get("/v1/models")).json()["data"][0]["id"]
    body = {**_body("unused"), "model": model}
    parts = _parts((await client.post("/v1/ui/chat", json=body)).text)
    types = [p if p == "[DONE]" else p["type"] for p in parts]
    assert "source-url" not in types and types[:2] == ["start", "text-start"]
    assert parts[0]["messageId"] == f"msg-{parts[0]['messageMetadata']['streamId']}"
    assert "Herons eat fish" in _text(parts)


async def test_a_reconnect_replays_the_running_answer_and_stop_cancels_it(
    in_process_module: InProcess, kb: str
) -> None:
    client = in_process_module.client
    body = _body(kb, max_tokens=3000)  # 30 s at 10 ms a token
    async with in_process_module.live.stream("POST", "/v1/ui/chat", json=body) as response:
        sid = response.headers["x-stream-id"]
        deltas = 0
        async for line in response.aiter_lines():
            deltas += '"text-delta"' in line
            if deltas >= 5:
                break
    # the reader left; the chat's answer runs on past the chat-completions grace (1 s)
    mark = (await _status(client, sid))["last_event_id"]

    async def went_on() -> bool:
        return (await _status(client, sid))["last_event_id"] >= mark + 200

    await eventually(went_on, "200 more events after the reader left", timeout_s=30)
    async with in_process_module.live.stream("GET", f"/v1/ui/chat/{body['id']}/stream") as again:
        assert again.status_code == 200 and again.headers["x-stream-id"] == sid
        seen: list[Any] = []
        async for line in again.aiter_lines():
            if line.startswith("data: "):
                seen.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                if len(seen) == 10:  # replayed from the start: now Stop, as an app does
                    r = await client.post(f"/v1/streams/{sid}/cancel")
                    assert r.status_code == 200, r.text
    types = [p if p == "[DONE]" else p["type"] for p in seen]
    assert types[:4] == ["start", "source-url", "source-url", "text-start"]
    assert types[-4:] == ["text-end", "abort", "finish", "[DONE]"]
    assert seen[-2]["messageMetadata"]["finishReason"] == "cancelled"
    status = await _status(client, sid)
    assert status["finish_reason"] == "cancelled" and status["last_event_id"] < 3000
    # nothing runs now: a reconnect gets 204, as DefaultChatTransport expects
    assert (await client.get(f"/v1/ui/chat/{body['id']}/stream")).status_code == 204


async def test_nothing_to_resume_is_204(in_process_module: InProcess) -> None:
    r = await in_process_module.client.get("/v1/ui/chat/never-asked/stream")
    assert r.status_code == 204 and r.content == b""


async def test_a_resume_by_event_id_renders_ui_parts_after_it(
    in_process_module: InProcess, kb: str
) -> None:
    client = in_process_module.client
    whole = await client.post("/v1/ui/chat", json=_body(kb))
    sid = whole.headers["x-stream-id"]
    r = await client.get(f"/v1/streams/{sid}/events", headers={"Last-Event-ID": "4"})
    assert r.status_code == 200 and r.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert whole.text.endswith(r.text)  # exactly the frames after event 4
    assert _parts(r.text)[0]["type"] == "text-delta"  # text-start went with event 3


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"messages": [{"role": "user", "parts": [{"type": "file", "url": "x"}]}]}, "file"),
        (
            {
                "messages": [
                    {"role": "user", "parts": [{"type": "text", "text": "q"}]},
                    {"role": "assistant", "parts": [{"type": "text", "text": "a"}]},
                ]
            },
            "last message",
        ),
        ({"temperature": 9}, "temperature"),
        ({"tools": []}, "tools"),
        ({"id": "x" * 201}, "id"),
    ],
)
async def test_bad_requests_name_the_problem(
    in_process_module: InProcess, change: dict[str, Any], named: str
) -> None:
    r = await in_process_module.client.post("/v1/ui/chat", json={**_body("any"), **change})
    assert r.status_code == 422, r.text
    assert named in r.text


async def test_an_unknown_model_is_404(in_process_module: InProcess) -> None:
    r = await in_process_module.client.post("/v1/ui/chat", json=_body("no-such-kb"))
    assert r.status_code == 404 and "no-such-kb" in r.text
