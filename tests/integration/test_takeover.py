"""Crash takeover: kill -9 the generating process; another process continues the same stream."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from tests.conftest import REDIS_URL, STUB_DELAY_S, ServerFactory
from tests.support.server import ServerProcess
from tests.support.sse import Frame, read_stream, text_of

pytestmark = pytest.mark.engine


CHINESE = {"prompt": "请用中文写一个关于灯塔看守人的短故事。", "chat": True, "max_tokens": 120}
# Three tokens an event, running on the victim alongside: the takeover keeps the stream's rule
COALESCED = {
    "prompt": "Write a short story about a lighthouse keeper and a storm.",
    "chat": True,
    "max_tokens": 120,
    "coalesce": {"tokens": 3, "ms": 1000},
}


class _Alongside:
    """Reads a stream in a thread until it ends or its server dies under it."""

    def __init__(self, server: ServerProcess, body: dict[str, Any]) -> None:
        self.frames: list[Frame] = []
        self._thread = threading.Thread(target=self._read, args=(server, body), daemon=True)
        self._thread.start()

    def _read(self, server: ServerProcess, body: dict[str, Any]) -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.Client(base_url=server.url, timeout=120) as client,
        ):
            read_stream(client, "POST", "/v1/generate", json=body, on_frame=self.frames.append)

    def wait_for(self, n: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.frames) < n:
            assert time.monotonic() < deadline, self.frames
            time.sleep(0.02)

    def join(self) -> list[Frame]:
        self._thread.join(60)
        return list(self.frames)


# A chat-completions stream (the OpenAI format) on the victim too: it resumes in its format
CHAT = {
    "model": "SmolLM2-135M-Instruct",
    "messages": [{"role": "user", "content": "Describe a busy harbour at dawn, in detail."}],
    "max_tokens": 120,
    "temperature": 0,
}


class _ChatAlongside:
    """Reads a chat-completions stream's raw SSE frames (id, data) in a thread."""

    def __init__(self, server: ServerProcess) -> None:
        self.stream_id = ""
        self.frames: list[tuple[str, str]] = []
        self._thread = threading.Thread(target=self._read, args=(server,), daemon=True)
        self._thread.start()

    def _read(self, server: ServerProcess) -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.Client(base_url=server.url, timeout=120) as client,
            connect_sse(
                client, "POST", "/v1/chat/completions", json={**CHAT, "stream": True}
            ) as source,
        ):
            self.stream_id = source.response.headers["x-stream-id"]
            for sse in source.iter_sse():
                if sse.data:
                    self.frames.append((sse.id, sse.data))

    def wait_for(self, n: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.frames) < n:
            assert time.monotonic() < deadline, self.frames
            time.sleep(0.02)

    def join(self) -> list[tuple[str, str]]:
        self._thread.join(60)
        return list(self.frames)


def _chat_text(datas: list[str]) -> str:
    chunks = [json.loads(d) for d in datas if d != "[DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def _assert_chat_interrupted(survivor: ServerProcess, chat: _ChatAlongside) -> None:
    first = chat.join()
    assert first and first[-1][1] != "[DONE]", first[-1:]  # the kill cut it short
    status = httpx.get(f"{survivor.url}/v1/streams/{chat.stream_id}", timeout=30).json()
    assert status["status"] == "running", status


def _check_chat_takeover(survivor: ServerProcess, chat: _ChatAlongside, expected: str) -> None:
    first = chat.join()
    with (
        httpx.Client(base_url=survivor.url, timeout=300) as client,
        connect_sse(
            client,
            "GET",
            f"/v1/streams/{chat.stream_id}/events",
            headers={"Last-Event-ID": first[-1][0]},
        ) as source,
    ):
        rest = [sse.data for sse in source.iter_sse() if sse.data]
    assert rest[-1] == "[DONE]"
    datas = [d for _, d in first] + rest
    ids = {json.loads(d)["id"] for d in datas if d != "[DONE]"}
    assert ids == {f"chatcmpl-{chat.stream_id}"}
    assert _chat_text(datas) == expected


def _uninterrupted(server: ServerProcess, body: dict[str, Any]) -> dict[str, Any]:
    plain = {k: v for k, v in body.items() if k != "coalesce"}
    r = httpx.post(server.url + "/v1/generate", json={**plain, "stream": False}, timeout=300)
    r.raise_for_status()
    return dict(r.json())


def _assert_interrupted(server: ServerProcess, first: list[Frame]) -> None:
    """The kill landed in the middle of the stream: its log has no end yet."""
    sid = first[0].data["stream_id"]
    assert first[-1].event == "token"
    status = httpx.get(f"{server.url}/v1/streams/{sid}", timeout=30).json()
    assert status["status"] == "running", status


def _resume(server: ServerProcess, first: list[Frame]) -> list[Frame]:
    sid = first[0].data["stream_id"]
    with httpx.Client(base_url=server.url, timeout=300) as client:
        rest = read_stream(
            client, "GET", f"/v1/streams/{sid}/events", headers={"Last-Event-ID": str(first[-1].id)}
        )
    return first + rest


def test_kill_9_mid_stream_then_resume_gives_the_uninterrupted_text(
    smollm2_server: ServerProcess, takeover_victim_start: ServerProcess, tokenizer: Any
) -> None:
    # SmolLM2, the same Redis; the victim started ahead (``takeover_victim_start``)
    survivor, victim = smollm2_server, takeover_victim_start
    try:
        for server in (survivor, victim):
            server.wait_ready()
        expected = _uninterrupted(survivor, CHINESE)
        expected_coalesced = _uninterrupted(survivor, COALESCED)
        r = httpx.post(f"{survivor.url}/v1/chat/completions", json=CHAT, timeout=300)
        expected_chat = r.raise_for_status().json()["choices"][0]["message"]["content"]
        alongside = _Alongside(victim, COALESCED)
        chat = _ChatAlongside(victim)
        alongside.wait_for(3)  # `stream` and two coalesced token events: it is generating
        chat.wait_for(4)  # the role chunk and three tokens
        with httpx.Client(base_url=victim.url, timeout=120) as client:
            first = read_stream(client, "POST", "/v1/generate", json=CHINESE, stop_after=12)
        victim.kill()  # SIGKILL to the whole process group: server and engine core
        assert victim.proc.poll() is not None  # really dead
        coalesced = alongside.join()
        # both right away: the survivor's sweeper finishes orphans even with no reader
        _assert_interrupted(survivor, first)
        _assert_interrupted(survivor, coalesced)
        _assert_chat_interrupted(survivor, chat)
        # the chat client first: once back, a chat stream's short grace counts again
        # (streaming.chat_abandon_after_s; until then it waits abandon_after_s, 30 s)
        _check_chat_takeover(survivor, chat, expected_chat)
        _check_takeover(_resume(survivor, first), expected, survivor, tokenizer)
        _check_coalesced_takeover(_resume(survivor, coalesced), expected_coalesced)
    finally:
        victim.stop()  # (the survivor stops after its last test: session_servers.py)


def _check_whole(frames: list[Frame]) -> list[int]:
    assert [f.id for f in frames] == list(range(len(frames)))
    assert frames[-1].event == "done", frames[-1]
    positions = [f.data["index"] for f in frames if f.event == "token"]
    sizes = [len(f.data["token_ids"]) for f in frames if f.event == "token"]
    assert positions == [sum(sizes[:i]) for i in range(len(sizes))]
    return sizes


def _check_takeover(
    frames: list[Frame], expected: dict[str, Any], survivor: ServerProcess, tokenizer: Any
) -> None:
    # Chinese: the takeover lands between multi-byte characters, split across tokens
    _check_whole(frames)
    assert text_of(frames) == expected["text"]
    # Splitting the text into events, across flushes and the takeover, added no U+FFFD: the
    # text is exactly what the tokenizer makes of all the ids (a small model may itself emit
    # byte sequences that are not UTF-8; those show up in both).
    ids = [t for f in frames if f.event == "token" for t in f.data["token_ids"]]
    assert text_of(frames) == tokenizer.decode(ids, skip_special_tokens=True)
    assert sum(ord(c) > 0x2E80 for c in text_of(frames)) > 10  # really multi-byte text
    assert frames[-1].data["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"]
    status = httpx.get(
        f"{survivor.url}/v1/streams/{frames[0].data['stream_id']}", timeout=30
    ).json()
    assert status["status"] == "done" and status["owner_alive"] is False


def _check_coalesced_takeover(frames: list[Frame], expected: dict[str, Any]) -> None:
    sizes = _check_whole(frames)
    ids = [t for f in frames if f.event == "token" for t in f.data["token_ids"]]
    assert ids == expected["token_ids"] and text_of(frames) == expected["text"]
    # three tokens an event (or a character's few more) before the kill and after the takeover;
    # a step slower than the 1 s limit (a loaded machine) may send fewer, once or twice
    assert all(n <= 6 for n in sizes), sizes
    assert sum(n < 3 for n in sizes[:-1]) <= 2, sizes
    after = [len(f.data["token_ids"]) for f in frames[len(frames) // 2 : -1] if f.event == "token"]
    assert after and sum(n >= 3 for n in after) >= len(after) - 1, sizes  # taken over coalesced


def test_orphaned_stream_is_finished_by_the_sweeper_without_a_reader(
    server_factory: ServerFactory, stub_server: ServerProcess
) -> None:
    survivor = stub_server  # same (stub) model, same Redis
    victim = server_factory(
        stub_delay_s=STUB_DELAY_S,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_LIMITS__MAX_TOKENS="4000",
    )
    with httpx.Client(base_url=victim.url, timeout=120) as client:
        first = read_stream(
            client,
            "POST",
            "/v1/generate",
            json={"prompt": "orphan", "max_tokens": 1000},  # 5 s of paced tokens
            stop_after=3,
        )
    victim.kill()
    sid = first[0].data["stream_id"]
    assert httpx.get(f"{survivor.url}/v1/streams/{sid}", timeout=30).json()["status"] == "running"
    deadline = time.monotonic() + 90
    while True:
        status = httpx.get(f"{survivor.url}/v1/streams/{sid}", timeout=30).json()
        if status["status"] != "running":
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    assert status["status"] == "done"
    assert status["finish_reason"] == "length"
    with httpx.Client(base_url=survivor.url, timeout=60) as client:
        frames = read_stream(client, "GET", f"/v1/streams/{sid}/events")
    assert [f.id for f in frames] == list(range(len(frames)))
    assert sum(len(f.data["token_ids"]) for f in frames if f.event == "token") == 1000
