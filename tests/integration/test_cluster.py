"""The scale-out topology of docs/deploy.md, started by ``scripts/cluster.sh``: two vLLM OpenAI
servers as engine replicas (with the rag-stream KV connector), two API processes sharing
PostgreSQL and Redis. Streams keep their promise there: the replicas stream what the in-process
engine streams; a conversation stays on one replica and hits its prefix cache; a stream resumes
through the other API process; a replica killed under a stream, or the API process generating
it, does not end it, and the text is the uninterrupted one; with every replica down a process
says so and refuses new streams instead of failing them.

The tests run in order: a replica dies in the fifth, an API process in the sixth."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.brake import Brake, engine_cores
from tests.support.cluster import Cluster, Node
from tests.support.server import ServerProcess
from tests.support.sse import Frame, read_stream, text_of
from tests.support.waiting import eventually_sync

pytestmark = pytest.mark.engine

STORY = {
    "prompt": "Write a long story about a lighthouse keeper who finds a map in a bottle.",
    "chat": True,
    # enough to be mid-stream when a test kills something after 10 tokens: the replicas decode
    # at a few tokens a second here, with the suite's other engines on the same 2 cores
    "max_tokens": 64,
}
# Over two KV blocks (128 tokens each): the replica that takes over loads them from Redis.
LONG = {
    "prompt": (
        "Here are the notes of a lighthouse keeper. "
        + " ".join(
            f"Day {d}: the lamp was lit at dusk, the fog horn sounded {d % 5 + 1} times, and a "
            f"ship named the {name} passed to the north."
            for d, name in enumerate(["Ada", "Brisk", "Corsair", "Dawn", "Egret", "Falcon"] * 2)
        )
        + " Write the next day's notes in the same style, then a long story about that day."
    ),
    "chat": True,
    "max_tokens": 48,
}
RUNNING = "vllm:num_requests_running"
DONE = "vllm:request_success_total"
GENERATED = "vllm:generation_tokens_total"


@pytest.fixture(scope="module")
def cluster(cluster_start: Cluster) -> Iterator[Cluster]:
    cluster_start.wait()
    yield cluster_start
    cluster_start.stop()


def _generate(url: str, body: dict[str, Any]) -> list[Frame]:
    with httpx.Client(base_url=url, timeout=300) as client:
        return read_stream(client, "POST", "/v1/generate", json=body)


class _Reader:
    """Reads a stream on a thread, so a test can kill something under it."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.frames: list[Frame] = []
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._read, args=(url, body), daemon=True)
        self._thread.start()

    def _read(self, url: str, body: dict[str, Any]) -> None:
        try:
            with httpx.Client(base_url=url, timeout=300) as client:
                read_stream(client, "POST", "/v1/generate", json=body, on_frame=self.frames.append)
        except httpx.HTTPError as exc:  # the process it reads from was killed
            self.error = exc

    def wait_for_tokens(self, n: int) -> None:
        deadline = time.monotonic() + 120
        while sum(f.event == "token" for f in self.frames) < n:
            assert time.monotonic() < deadline and self._thread.is_alive(), self.frames
            time.sleep(0.01)

    def join(self) -> list[Frame]:
        self._thread.join(180)
        assert not self._thread.is_alive()
        return list(self.frames)


def _one_stream(frames: list[Frame]) -> None:
    ids = [f.id for f in frames]
    assert ids == list(range(len(ids))), ids  # from 0, no gap, no repeat
    assert frames[-1].event == "done", frames[-1]


def _serving(replicas: list[Node]) -> Node:
    serving = [r for r in replicas if r.metric(RUNNING) > 0]
    assert len(serving) == 1, [r.metric(RUNNING) for r in replicas]
    return serving[0]


def _served_since(replicas: list[Node], done: list[float]) -> Node:
    """The one replica that finished a request since ``done`` was read."""
    deadline = time.monotonic() + 10
    while True:
        served = [r for r, d in zip(replicas, done, strict=True) if r.metric(DONE) > d]
        if len(served) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # (counted as the request's last output goes out, not before)
    assert len(served) == 1, [r.metric(DONE) for r in replicas]
    return served[0]


def test_replicas_stream_what_the_in_process_engine_streams(
    cluster: Cluster, smollm2_server: ServerProcess
) -> None:
    body = {**STORY, "max_tokens": 60}
    remote = _generate(cluster.apis[0].url, body)
    local = _generate(smollm2_server.url, body)
    assert remote[-1].event == "done" and remote[-1].data["finish_reason"] == "length"
    assert text_of(remote) == text_of(local)
    assert [t for f in remote if f.event == "token" for t in f.data["token_ids"]] == [
        t for f in local if f.event == "token" for t in f.data["token_ids"]
    ]


def test_an_api_process_refuses_to_start_on_servers_serving_another_model(
    cluster: Cluster,
) -> None:
    """Checked at start against each server's /v1/models: one line naming what it serves."""
    with pytest.raises(RuntimeError) as refused:
        cluster.add_api(RAG_STREAM_SERVED_MODEL_NAME="not-the-served-model")
    assert "serves SmolLM2-135M-Instruct, not not-the-served-model" in str(refused.value)


def test_a_conversation_stays_on_one_replica_and_hits_its_prefix_cache(
    cluster: Cluster,
) -> None:
    with httpx.Client(base_url=cluster.apis[0].url, timeout=300) as client:
        kb = f"remote-{time.monotonic_ns()}"
        client.post("/v1/kbs", json={"name": kb}).raise_for_status()
        text = (
            "The lighthouse on Skerry Point was built in 1852. Its keeper, Ada Voss, logged "
            "every ship that passed and every storm that hit the coast for forty years. "
        ) * 6
        doc = {"title": "Skerry Point", "text": text, "source": "skerry"}
        client.post(f"/v1/kbs/{kb}/documents", json=doc).raise_for_status()
        before = [r.metric(DONE) for r in cluster.replicas]
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
        served = [r.metric(DONE) - b for r, b in zip(cluster.replicas, before, strict=True)]
    # every request of the conversation (each turn's answer, and the prefills the answer kind
    # sends while it searches) went to one replica
    assert min(served) == 0 and max(served) >= 3, served
    assert usages[-1]["cached_tokens"] > 0, usages  # the history's KV blocks were reused


def test_a_stream_started_on_one_api_process_resumes_on_the_other(cluster: Cluster) -> None:
    first, second = cluster.apis
    reference = _generate(first.url, {**STORY, "max_tokens": 48})
    with httpx.Client(base_url=first.url, timeout=300) as client:
        head = read_stream(
            client, "POST", "/v1/generate", json=STORY | {"max_tokens": 48}, stop_after=8
        )
    assert head[-1].event == "token"  # left mid-answer
    sid = head[0].data["stream_id"]
    with httpx.Client(base_url=second.url, timeout=300) as client:
        rest = read_stream(
            client, "GET", f"/v1/streams/{sid}/events", headers={"Last-Event-ID": str(head[-1].id)}
        )
    frames = head + rest
    _one_stream(frames)
    assert text_of(frames) == text_of(reference)


def test_a_cancelled_stream_aborts_its_request_on_the_replica(cluster: Cluster) -> None:
    api = cluster.apis[0].url
    generated = sum(r.metric(GENERATED) for r in cluster.replicas)
    reader = _Reader(api, {**STORY, "max_tokens": 400})
    reader.wait_for_tokens(3)
    serving = _serving(cluster.replicas)
    sid = reader.frames[0].data["stream_id"]
    r = httpx.post(f"{api}/v1/streams/{sid}/cancel", timeout=30)
    assert r.status_code == 200, r.text
    frames = reader.join()
    _one_stream(frames)
    assert frames[-1].data["finish_reason"] == "cancelled"
    streamed = sum(len(f.data["token_ids"]) for f in frames if f.event == "token")
    deadline = time.monotonic() + 15
    while serving.metric(RUNNING) > 0:  # the replica let the request go...
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1)
    # ... having generated about what was streamed, not the story's 64 tokens or more: aborted
    extra = sum(r.metric(GENERATED) for r in cluster.replicas) - generated - streamed
    assert 0 <= extra <= 16, (streamed, extra)


def test_a_replica_killed_mid_stream_the_stream_finishes_on_the_other_with_its_kv_restored(
    cluster: Cluster,
) -> None:
    api = cluster.apis[0].url
    done = [r.metric(DONE) for r in cluster.replicas]
    reference = _generate(api, LONG)
    assert reference[-1].data["finish_reason"] == "length"
    # The prompt's first KV block picks its replica: the one that served the reference serves
    # the stream too. Known before the stream starts, so the kill can come right after its
    # first tokens (a gauge read mid-stream raced the end of a short stream on a busy machine).
    serving = _served_since(cluster.replicas, done)
    (other,) = [r for r in cluster.replicas if r is not serving]
    served_before = [serving.metric(DONE), other.metric(DONE)]
    reader = _Reader(api, LONG)
    reader.wait_for_tokens(3)
    # still generating there when it dies: the stream has not ended, nor its request
    assert reader.frames[-1].event == "token", reader.frames[-1]
    assert [serving.metric(DONE), other.metric(DONE)] == served_before
    serving.kill()
    frames = reader.join()
    assert reader.error is None, reader.error
    _one_stream(frames)
    assert frames[-1].data["finish_reason"] == "length"
    assert text_of(frames) == text_of(reference)
    # the rest came from the other replica (vLLM counts a request done just after its last
    # output goes out, so the count may trail the stream's end by a moment)
    eventually_sync(
        lambda: other.metric(DONE) == served_before[1] + 1, "the other replica served the rest"
    )
    # which had never computed this prompt: its KV blocks came from Redis (the KV connector)
    assert frames[-1].data["usage"]["cached_tokens"] >= 256, frames[-1].data["usage"]


def test_kill_9_of_the_api_process_mid_stream_the_other_takes_over(cluster: Cluster) -> None:
    victim, survivor = cluster.apis
    reference = _generate(survivor.url, STORY)
    # the replicas slowed, then stopped while the process dies: the stream is still generating
    # then, however far the reader trails it (tests/support/brake.py)
    with Brake(engine_cores(*(replica.pid for replica in cluster.replicas))) as brake:
        reader = _Reader(victim.url, STORY)
        reader.wait_for_tokens(10)
        sid = reader.frames[0].data["stream_id"]
        with brake.hold():
            status = httpx.get(f"{survivor.url}/v1/streams/{sid}", timeout=30).json()
            assert status["status"] == "running", status
            victim.kill()
            head = reader.join()
    assert head[-1].event != "done"
    with httpx.Client(base_url=survivor.url, timeout=300) as client:
        rest = read_stream(
            client, "GET", f"/v1/streams/{sid}/events", headers={"Last-Event-ID": str(head[-1].id)}
        )
    frames = head + rest
    _one_stream(frames)
    assert frames[-1].data["finish_reason"] == "length"
    assert text_of(frames) == text_of(reference)


def test_with_every_replica_down_it_is_unready_and_refuses_new_streams(cluster: Cluster) -> None:
    # One replica and one API process died above; stop the last replica. The process then must
    # not start (or take over) streams it cannot finish: /readyz says why, requests get a 503.
    api = cluster.apis[1].url
    for replica in cluster.replicas:
        replica.kill()
    deadline = time.monotonic() + 30
    while (ready := httpx.get(f"{api}/readyz", timeout=10)).status_code == 200:
        assert time.monotonic() < deadline, ready.json()
        time.sleep(0.2)
    assert ready.status_code == 503 and ready.json()["checks"]["engine"] == "unreachable"
    r = httpx.post(f"{api}/v1/generate", json=STORY, timeout=30)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "engine_unavailable", r.json()
