"""Crash takeover: kill -9 the generating process; another process continues the same stream."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REDIS_URL, STUB_DELAY_S, ServerFactory
from tests.support.server import ServerProcess
from tests.support.sse import read_stream, text_of

pytestmark = pytest.mark.engine


def _takeover_run(
    victim: ServerProcess, survivor: ServerProcess, prompt: str, max_tokens: int, cut: int
) -> tuple[list, dict]:  # type: ignore[type-arg]
    expected = httpx.post(
        survivor.url + "/v1/generate",
        json={"prompt": prompt, "chat": True, "max_tokens": max_tokens, "stream": False},
        timeout=300,
    ).json()
    with httpx.Client(base_url=victim.url, timeout=120) as client:
        first = read_stream(
            client,
            "POST",
            "/v1/generate",
            json={"prompt": prompt, "chat": True, "max_tokens": max_tokens},
            stop_after=cut,
        )
    victim.kill()  # SIGKILL to the whole process group: server and engine core
    sid = first[0].data["stream_id"]
    # the kill landed in the middle of the stream: its log has no end yet
    assert first[-1].event == "token"
    status = httpx.get(f"{survivor.url}/v1/streams/{sid}", timeout=30).json()
    assert status["status"] == "running", status
    with httpx.Client(base_url=survivor.url, timeout=300) as client:
        rest = read_stream(
            client, "GET", f"/v1/streams/{sid}/events", headers={"Last-Event-ID": str(first[-1].id)}
        )
    return first + rest, expected


def test_kill_9_mid_stream_then_resume_gives_the_uninterrupted_text(
    server_factory: ServerFactory, smollm2_path: Path, tokenizer: Any
) -> None:
    env = {"RAG_STREAM_MODEL": str(smollm2_path), "RAG_STREAM_REDIS_URL": REDIS_URL}
    survivor = server_factory(**env)
    victim = server_factory(**env)
    try:
        _check_takeover(victim, survivor, tokenizer)
    finally:
        survivor.stop()


def _check_takeover(victim: ServerProcess, survivor: ServerProcess, tokenizer: Any) -> None:
    # Chinese: the takeover lands between multi-byte characters, split across tokens
    prompt = "请用中文写一个关于灯塔看守人的短故事。"
    frames, expected = _takeover_run(victim, survivor, prompt, max_tokens=120, cut=12)
    assert victim.proc.poll() is not None  # really dead
    assert [f.id for f in frames] == list(range(len(frames)))
    assert frames[-1].event == "done", frames[-1]
    positions = [f.data["index"] for f in frames if f.event == "token"]
    sizes = [len(f.data["token_ids"]) for f in frames if f.event == "token"]
    assert positions == [sum(sizes[:i]) for i in range(len(sizes))]
    assert text_of(frames) == expected["text"]
    # Splitting the text into events, across flushes and the takeover, added no U+FFFD: the
    # text is exactly what the tokenizer makes of all the ids (a small model may itself emit
    # byte sequences that are not UTF-8; those show up in both).
    ids = [t for f in frames if f.event == "token" for t in f.data["token_ids"]]
    assert text_of(frames) == tokenizer.decode(ids, skip_special_tokens=True)
    assert sum(ord(c) > 0x2E80 for c in text_of(frames)) > 10  # really multi-byte text
    assert frames[-1].data["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"]
    status = httpx.get(f"{survivor.url}/v1/streams/{frames[0].data['stream_id']}").json()
    assert status["status"] == "done" and status["owner_alive"] is False


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
    assert httpx.get(f"{survivor.url}/v1/streams/{sid}").json()["status"] == "running"
    deadline = time.monotonic() + 90
    while True:
        status = httpx.get(f"{survivor.url}/v1/streams/{sid}").json()
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
