"""Stop from chat clients that can only close the connection (Open WebUI's Stop): a
chat-completions stream whose reader leaves and does not come back within
``streaming.chat_abandon_after_s`` is cancelled and its engine request ends; a client that
comes back within it reads the stream to its end; a native stream keeps the long window
(``streaming.abandon_after_s``), so it can be resumed later. The service in the test process
on the paced stub engine (tests/support/inprocess.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rag_stream.settings import StreamingSettings
from tests.support.inprocess import InProcess
from tests.support.waiting import eventually

GRACE_S = 1.0
MAX_TOKENS = 3000  # 30 s at 10 ms a token: far longer than any of these tests
pytestmark = pytest.mark.in_process(
    delay_s=0.01,
    text="Herons nest in the reeds. ",  # ASCII: one event a token
    limits__max_tokens=4000,
    streaming__chat_abandon_after_s=GRACE_S,
    streaming__abandon_after_s=30,
)


def _chat(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me about herons."}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }


async def _status(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    r = await client.get(f"/v1/streams/{sid}")
    assert r.status_code == 200, r.text
    status: dict[str, Any] = r.json()
    return status


async def _read_then_leave(service: InProcess, path: str, body: dict[str, Any]) -> str:
    """Read a few data frames of a running stream, check it is still running, leave."""
    async with service.live.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        sid = response.headers["x-stream-id"]
        frames = 0
        async for line in response.aiter_lines():
            frames += line.startswith("data:")
            if frames >= 5:
                break
        assert (await _status(service.client, sid))["status"] == "running"
    return sid


async def _ended(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    async def ended() -> bool:
        return (await _status(client, sid))["status"] != "running"

    await eventually(ended, f"stream {sid} ended", timeout_s=GRACE_S + 10)
    return await _status(client, sid)


def test_the_default_grace_is_short() -> None:
    assert 0 < StreamingSettings().chat_abandon_after_s <= 3


async def test_closing_a_chat_stream_cancels_it_soon(in_process: InProcess) -> None:
    model = (await in_process.client.get("/v1/models")).json()["data"][0]["id"]
    sid = await _read_then_leave(in_process, "/v1/chat/completions", _chat(model))
    status = await _ended(in_process.client, sid)
    assert status["finish_reason"] == "cancelled"
    assert status["last_event_id"] < MAX_TOKENS // 2  # the engine stopped long before the end


async def test_a_chat_client_back_after_the_grace_reads_an_error_not_a_finish(
    in_process: InProcess,
) -> None:
    model = (await in_process.client.get("/v1/models")).json()["data"][0]["id"]
    sid = await _read_then_leave(in_process, "/v1/chat/completions", _chat(model))
    assert (await _ended(in_process.client, sid))["finish_reason"] == "cancelled"
    r = await in_process.client.get(f"/v1/streams/{sid}/events")  # back, too late
    assert r.status_code == 200
    data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    # the shortened text is not presented as a whole answer: no finish_reason, an error
    error = json.loads(data[-2])["error"]
    assert error["code"] == "stream_abandoned" and "incomplete" in error["message"]
    assert all('"finish_reason":"stop"' not in d for d in data), data[-3:]
    text = "".join(
        c["delta"].get("content", "") for d in data[:-2] for c in json.loads(d)["choices"]
    )
    assert "Herons nest in the reeds." in text  # what it had generated is there


async def test_a_chat_client_back_within_the_grace_reads_to_the_end(
    in_process: InProcess,
) -> None:
    body = {**_chat((await in_process.client.get("/v1/models")).json()["data"][0]["id"])}
    body["max_tokens"] = 300  # 3 s
    sid = await _read_then_leave(in_process, "/v1/chat/completions", body)
    r = await in_process.client.get(f"/v1/streams/{sid}/events")  # back at once, to the end
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]
    status = await _ended(in_process.client, sid)
    assert status["finish_reason"] == "length"


async def test_a_native_stream_left_alone_keeps_generating_past_the_chat_grace(
    in_process: InProcess,
) -> None:
    body = {"prompt": "Tell me about herons.", "max_tokens": MAX_TOKENS}
    sid = await _read_then_leave(in_process, "/v1/generate", body)
    mark = (await _status(in_process.client, sid))["last_event_id"]

    async def went_on() -> bool:
        # 300 tokens at 10 ms: three times the chat grace with nobody reading
        return (await _status(in_process.client, sid))["last_event_id"] >= mark + 300

    await eventually(went_on, "300 more events with no reader", timeout_s=30)
    assert (await _status(in_process.client, sid))["status"] == "running"
    await in_process.client.post(f"/v1/streams/{sid}/cancel")


def test_a_takeover_keeps_the_streams_own_window() -> None:
    from rag_stream.streaming.event_log import NewStream, StreamMeta

    new = NewStream(model="m", kind="generate", created=1.0, abandon_after_s=GRACE_S)
    meta = StreamMeta.from_fields("s", new.fields(), lease_owner=None, last_event_id=0)
    assert meta.new.abandon_after_s == GRACE_S  # what a takeover's writer is given
    plain = NewStream(model="m", kind="generate", created=1.0)
    assert StreamMeta.from_fields("s", plain.fields(), None, 0).new.abandon_after_s is None
