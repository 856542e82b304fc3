"""What the service answers matches what /openapi.json says, on the service in the test process
(tests/support/inprocess.py, stub engine): query parameters read as strictly as the bodies, an
empty user message refused as OpenAI refuses it, and every frame of each wire's event stream
valid against the event schema its route documents."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema_rs
import pytest
from httpx_sse import aconnect_sse

from tests.support.inprocess import InProcess, make_kb

pytestmark = pytest.mark.in_process()

HERONS = [("Herons", "# Herons\n\nThe heron waits in shallow water [for fish].")]


@pytest.fixture(scope="module")
def client(in_process_module: InProcess) -> httpx.AsyncClient:
    return in_process_module.client


def _refused(response: httpx.Response, status: int, param: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    message: str = error["message"]
    return message


# 1. Query parameters


@pytest.mark.parametrize("moment", ["0.5", "1700000000", "1e9", "-1"])
@pytest.mark.parametrize("name", ["to", "from"])
async def test_a_usage_moment_that_is_a_number_is_a_422_naming_it(
    client: httpx.AsyncClient, name: str, moment: str
) -> None:
    r = await client.get("/v1/usage", params={name: moment})
    assert "ISO 8601" in _refused(r, 422, f"query.{name}")


async def test_usage_moments_in_iso_8601_are_still_answered(client: httpx.AsyncClient) -> None:
    r = await client.get(
        "/v1/usage", params={"from": "2026-01-01", "to": "2026-02-01T00:00:00+01:00"}
    )
    assert r.status_code == 200, r.text
    assert (r.json()["from"], r.json()["to"]) == ("2026-01-01T00:00:00Z", "2026-01-31T23:00:00Z")


@pytest.mark.parametrize("limit", ["+1", "1_0", "1.0", " 1", "\u0661"])
@pytest.mark.parametrize("path", ["/v1/conversations", "/v1/jobs", "/v1/kbs/none/documents"])
async def test_integers_in_the_query_are_ascii_digits(
    client: httpx.AsyncClient, path: str, limit: str
) -> None:
    _refused(await client.get(path, params={"limit": limit}), 422, "query.limit")


@pytest.mark.parametrize("flag", ["yes", "1", "on", "True"])
async def test_booleans_in_the_query_are_true_or_false(
    client: httpx.AsyncClient, flag: str
) -> None:
    r = await client.get("/v1/kbs/none/documents/none", params={"include_chunks": flag})
    _refused(r, 422, "query.include_chunks")
    r = await client.get("/v1/kbs/none/documents/none", params={"include_chunks": "true"})
    assert r.status_code == 404  # past the parameters: no such KB


# 2. An empty user message


async def _engine_model(client: httpx.AsyncClient) -> str:
    models = (await client.get("/v1/models")).raise_for_status().json()["data"]
    return str(models[0]["id"])


@pytest.mark.parametrize("content", [None, "", [], [{"type": "text", "text": ""}]])
async def test_a_user_message_without_text_is_a_400_naming_it(
    client: httpx.AsyncClient, content: Any
) -> None:
    model = await _engine_model(client)
    messages = [
        {"role": "user", "content": "Where do herons wait?"},
        {"role": "assistant", "content": None},  # an assistant's may be null
        {"role": "user", "content": content},
    ]
    r = await client.post("/v1/chat/completions", json={"model": model, "messages": messages})
    message = _refused(r, 400, "messages[2].content")
    assert "user message must have text" in message
    missing = [{"role": "user"}]
    r = await client.post("/v1/chat/completions", json={"model": model, "messages": missing})
    _refused(r, 400, "messages[0].content")


# 3. Event streams as documented


def _decoded(schema: Any) -> Any:
    """The documented frame schema over frames whose JSON ``data`` is already decoded: each
    ``contentSchema`` (JSON in a string) stands for the string."""
    if isinstance(schema, dict):
        if "contentSchema" in schema:
            return _decoded(schema["contentSchema"])
        return {key: _decoded(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_decoded(value) for value in schema]
    return schema


async def _frame_check(
    client: httpx.AsyncClient, method: str, path: str
) -> jsonschema_rs.Validator:
    document = (await client.get("/openapi.json")).raise_for_status().json()
    content = document["paths"][path][method]["responses"]["200"]["content"]
    item = _decoded(content["text/event-stream"]["itemSchema"])
    return jsonschema_rs.Draft202012Validator(
        {"components": document["components"], "allOf": [item]}
    )


async def _frames(
    client: httpx.AsyncClient, method: str, url: str, **kwargs: Any
) -> list[dict[str, Any]]:
    """Each frame as schemathesis reads one: ``event`` ("message" when absent), ``data`` (its
    JSON decoded, ``[DONE]`` as it is), ``id`` when sent."""
    frames: list[dict[str, Any]] = []
    async with aconnect_sse(client, method, url, **kwargs) as source:
        assert source.response.status_code == 200, await source.response.aread()
        async for sse in source.aiter_sse():
            if not sse.data:
                continue  # a keep-alive comment
            data = sse.data if sse.data == "[DONE]" else json.loads(sse.data)
            frame = {"event": sse.event, "data": data}
            if sse.id:
                frame["id"] = sse.id
            frames.append(frame)
    assert frames
    return frames


def _assert_valid(check: jsonschema_rs.Validator, frames: list[dict[str, Any]]) -> None:
    for frame in frames:
        errors = [e.message for e in check.iter_errors(frame)]
        assert not errors, (frame, errors[:3])


async def test_native_streams_match_their_documented_events(client: httpx.AsyncClient) -> None:
    kb = await make_kb(client, HERONS, prefix="contract")
    body = {"kb": kb, "question": "Where do herons wait?", "max_tokens": 8}
    answer = await _frames(client, "POST", "/v1/answers", json=body)
    assert {"stream", "citation", "token", "done"} <= {f["event"] for f in answer}
    _assert_valid(await _frame_check(client, "post", "/v1/answers"), answer)
    # and resumed through the stream route, which documents every wire
    stream_id = answer[0]["data"]["stream_id"]
    resumed = await _frames(client, "GET", f"/v1/streams/{stream_id}/events")
    _assert_valid(await _frame_check(client, "get", "/v1/streams/{stream_id}/events"), resumed)


async def test_chat_completion_chunks_match_their_documented_frames(
    client: httpx.AsyncClient,
) -> None:
    kb = await make_kb(client, HERONS, prefix="contract")
    body = {
        "model": f"kb:{kb}",
        "messages": [{"role": "user", "content": "Where do herons wait?"}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = await client.post("/v1/chat/completions", json=body)
    stream_id = r.headers["x-stream-id"]
    chat = await _frames(client, "POST", "/v1/chat/completions", json=body)
    assert chat[-1]["data"] == "[DONE]"
    _assert_valid(await _frame_check(client, "post", "/v1/chat/completions"), chat)
    resumed = await _frames(client, "GET", f"/v1/streams/{stream_id}/events")
    assert resumed[-1]["data"] == "[DONE]"
    _assert_valid(await _frame_check(client, "get", "/v1/streams/{stream_id}/events"), resumed)
    # what the schema would refuse: a frame of another wire's shape
    check = await _frame_check(client, "post", "/v1/chat/completions")
    assert not check.is_valid({"event": "message", "data": {"type": "text-delta"}})


async def test_ui_chat_parts_match_their_documented_frames(client: httpx.AsyncClient) -> None:
    body = {
        "id": "contract-chat",
        "model": await _engine_model(client),
        "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "Where?"}]}],
        "max_tokens": 8,
    }
    parts = await _frames(client, "POST", "/v1/ui/chat", json=body)
    assert parts[-1]["data"] == "[DONE]"
    _assert_valid(await _frame_check(client, "post", "/v1/ui/chat"), parts)
