"""Generating on vLLM OpenAI servers (``engine_urls``) instead of an in-process engine: the same
token ids, one replica per conversation (its prefix cache is hit), and a replica killed under a
stream does not end it: the stream finishes on the other with the same text."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REDIS_URL, ServerFactory
from tests.support.server import ServerProcess
from tests.support.sse import Frame, read_stream, text_of
from tests.support.vllm_servers import VllmServer

pytestmark = pytest.mark.engine

SERVED = "SmolLM2-135M-Instruct"
STORY = {
    "prompt": "Write a long story about a lighthouse keeper who finds a map in a bottle.",
    "chat": True,
    "max_tokens": 160,
}
RUNNING = "vllm:num_requests_running"
DONE = "vllm:request_success_total"


@pytest.fixture(scope="module")
def replicas(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[VllmServer]]:
    logs = tmp_path_factory.mktemp("replicas")
    servers = [
        VllmServer(
            smollm2_path,
            logs / f"vllm-{n}.log",
            *("--scheduling-policy", "priority"),
            served_name=SERVED,
        )
        for n in range(2)
    ]
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def remote_server(
    server_factory: ServerFactory, replicas: list[VllmServer], smollm2_path: Path
) -> Iterator[ServerProcess]:
    server = server_factory(
        RAG_STREAM_ENGINE_URLS=",".join(r.url for r in replicas),
        RAG_STREAM_MODEL=str(smollm2_path),
        RAG_STREAM_REDIS_URL=REDIS_URL,
    )
    yield server
    server.stop()


def _generate(server: ServerProcess, body: dict[str, Any]) -> list[Frame]:
    with httpx.Client(base_url=server.url, timeout=300) as client:
        return read_stream(client, "POST", "/v1/generate", json=body)


def test_replicas_stream_what_the_in_process_engine_streams(
    remote_server: ServerProcess, smollm2_server: ServerProcess
) -> None:
    body = {**STORY, "max_tokens": 60}
    remote = _generate(remote_server, body)
    local = _generate(smollm2_server, body)
    assert remote[-1].event == "done" and remote[-1].data["finish_reason"] == "length"
    assert text_of(remote) == text_of(local)
    assert [t for f in remote if f.event == "token" for t in f.data["token_ids"]] == [
        t for f in local if f.event == "token" for t in f.data["token_ids"]
    ]


def test_a_conversation_stays_on_one_replica_and_hits_its_prefix_cache(
    remote_server: ServerProcess, replicas: list[VllmServer]
) -> None:
    with httpx.Client(base_url=remote_server.url, timeout=300) as client:
        kb = f"remote-{time.monotonic_ns()}"
        client.post("/v1/kbs", json={"name": kb}).raise_for_status()
        text = (
            "The lighthouse on Skerry Point was built in 1852. Its keeper, Ada Voss, logged "
            "every ship that passed and every storm that hit the coast for forty years. "
        ) * 6
        doc = {"title": "Skerry Point", "text": text, "source": "skerry"}
        client.post(f"/v1/kbs/{kb}/documents", json=doc).raise_for_status()
        before = [r.metric(DONE) for r in replicas]
        conversation = None
        usages = []
        for question in ("Who kept the lighthouse?", "When was it built?", "What did she log?"):
            body: dict[str, Any] = {"kb": kb, "question": question, "max_tokens": 30}
            if conversation:
                body["conversation_id"] = conversation
            frames = read_stream(client, "POST", "/v1/answers", json=body)
            conversation = frames[0].data["conversation_id"]
            assert frames[-1].event == "done", frames[-1]
            usages.append(frames[-1].data["usage"])
        served = [r.metric(DONE) - b for r, b in zip(replicas, before, strict=True)]
    # every request of the conversation (each turn's answer, and the prefills the answer kind
    # sends while it searches) went to one replica
    assert min(served) == 0 and max(served) >= 3, served
    assert usages[-1]["cached_tokens"] > 0, usages  # the history's KV blocks were reused


def test_a_replica_killed_mid_stream_the_stream_finishes_on_the_other(
    remote_server: ServerProcess, replicas: list[VllmServer]
) -> None:
    reference = _generate(remote_server, STORY)
    assert reference[-1].data["finish_reason"] == "length"

    frames: list[Frame] = []

    def read() -> None:
        with httpx.Client(base_url=remote_server.url, timeout=300) as client:
            read_stream(client, "POST", "/v1/generate", json=STORY, on_frame=frames.append)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while sum(f.event == "token" for f in frames) < 10:
        assert time.monotonic() < deadline and reader.is_alive(), frames
        time.sleep(0.01)
    serving = [r for r in replicas if r.metric(RUNNING) > 0]
    assert len(serving) == 1, [r.metric(RUNNING) for r in replicas]
    (other,) = [r for r in replicas if r is not serving[0]]
    served_before = other.metric(DONE)
    assert frames[-1].event == "token"  # still generating when its replica dies
    serving[0].kill()
    reader.join(180)
    assert not reader.is_alive()
    assert frames[-1].event == "done", frames[-1]
    assert frames[-1].data["finish_reason"] == "length"
    ids = [f.id for f in frames]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # one stream: no gap, no repeat
    assert text_of(frames) == text_of(reference)
    assert other.metric(DONE) == served_before + 1  # the rest came from the other replica


def test_with_every_replica_down_it_is_unready_and_refuses_new_streams(
    remote_server: ServerProcess, replicas: list[VllmServer]
) -> None:
    # After the test above one replica is dead; stop the other. This process then must not
    # start (or take over) streams it cannot finish: /readyz says why, requests get a 503.
    for replica in replicas:
        replica.kill()
    deadline = time.monotonic() + 30
    while (ready := httpx.get(f"{remote_server.url}/readyz", timeout=10)).status_code == 200:
        assert time.monotonic() < deadline, ready.json()
        time.sleep(0.2)
    assert ready.status_code == 503 and ready.json()["checks"]["engine"] == "unreachable"
    r = httpx.post(f"{remote_server.url}/v1/generate", json=STORY, timeout=30)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "engine_unavailable", r.json()
