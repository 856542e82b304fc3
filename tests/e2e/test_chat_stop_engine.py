"""Stop as chat front ends do it (Open WebUI's Stop only closes the connection), on the real
engine: SmolLM2 on vLLM through the ``openai`` SDK. The stream ends ``cancelled`` within the
grace (``streaming.chat_abandon_after_s``) of the client leaving, far from its max_tokens, and
the server generates nothing any more. The server is tests/e2e/test_chat_page.py's
(started a module ahead; it requires keys); tests/integration/test_chat_stop.py has the
in-process cases on the stub engine."""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import pytest

from rag_stream.settings import StreamingSettings
from tests.support.session_servers import KeyedServer

pytestmark = [pytest.mark.engine, pytest.mark.smollm2]
LIMIT = 512  # ~20 s of SmolLM2 here: still running long after the grace


def _generating(http: httpx.Client) -> float:
    """The streams the server is generating (each one's producer holds its engine request)."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("rag_stream_active_streams"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no rag_stream_active_streams in /metrics")


def test_closing_an_openai_stream_stops_the_engine_within_the_grace(
    chat_page_server_start: KeyedServer,
) -> None:
    server = chat_page_server_start.server
    server.wait_ready()
    key = chat_page_server_start.make_key()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
    model = client.models.list().data[0].id
    grace = StreamingSettings().chat_abandon_after_s
    with client.chat.completions.with_streaming_response.create(
        model=model,
        messages=[{"role": "user", "content": f"Tell me everything. ({uuid.uuid4().hex[:8]})"}],
        max_tokens=LIMIT,
        stream=True,
        extra_body={"ignore_eos": True},
    ) as response:
        stream_id = response.headers["x-stream-id"]
        tokens = 0
        for chunk in response.parse():
            tokens += bool(chunk.choices and chunk.choices[0].delta.content)
            if tokens == 5:
                break  # leaving the block closes the connection: the client's Stop
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        status = http.get(f"/v1/streams/{stream_id}").json()
        assert status["status"] == "running", status  # generating when the client left
        left = time.monotonic()
        while status["status"] == "running" and time.monotonic() < left + grace + 10:
            time.sleep(0.1)
            status = http.get(f"/v1/streams/{stream_id}").json()
        ended_after = time.monotonic() - left
        assert status["status"] == "done" and status["finish_reason"] == "cancelled", status
        assert status["last_event_id"] < LIMIT // 2
        assert ended_after < grace + 2, ended_after  # the grace, a lease beat and polling
        assert _generating(http) == 0  # its producer ended, and with it the engine request
