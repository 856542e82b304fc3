"""An answer whose process dies while it searches is searched again by the takeover.

The chaos campaign (scripts/chaos.py) killed 2 of 56 answers during retrieval; they ended with
`start_interrupted`. The first run now saves the question's plan before it searches, and a
takeover that finds it (and no citation in the log) searches again and goes on. Stub engine,
the real embedder and store; the query's embedding is made slow (STUB_SLOW_QUERY_S) so that the
kill lands inside the search. The cancel needs no process of its own: the service in the test
process (tests/support/inprocess.py).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from rag_stream.errors import StartInterrupted
from rag_stream.kinds.answer.kind import AnswerKind
from rag_stream.kinds.answer.plans import QuestionPlan
from rag_stream.kinds.base import KindDeps
from rag_stream.schemas.events import Citation, StreamStarted
from rag_stream.settings import load_settings
from tests.conftest import REDIS_URL, STUB_DELAY_S, ServerFactory
from tests.support import inprocess
from tests.support.inprocess import InProcess, InProcessFactory
from tests.support.kb import make_kb
from tests.support.server import ServerProcess
from tests.support.sse import Frame, read_stream, text_of

QUESTION = "(slow) Where do the grey herons of the Zorblat live?"
DOCS = [
    ("zorblat.md", "# The Zorblat\n\nGrey herons and otters live in the delta of the Zorblat."),
    ("quimby.md", "# Quimby\n\nQuimby holds its fair every September on the river meadow."),
]
SLOW_S = 4.0


def _server(factory: ServerFactory, data: Path, prefix: str, **env: str) -> ServerProcess:
    return factory(
        data_dir=data,
        stub_delay_s=STUB_DELAY_S,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        # streams of these two servers only: no other test's sweeper takes this one over
        RAG_STREAM_STREAMING__KEY_PREFIX=prefix,
        STUB_SLOW_QUERY_S=str(SLOW_S),
        **env,
    )


def _answer(server: ServerProcess, kb: str, stop_after: int | None = None) -> list[Frame]:
    body = {"kb": kb, "question": QUESTION, "max_tokens": 80, "top_k": 2}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        return read_stream(client, "POST", "/v1/answers", json=body, stop_after=stop_after)


def _finished_on(server: ServerProcess, head: list[Frame]) -> list[Frame]:
    """The stream whose first events a killed server sent (``head``), read on from there on
    ``server`` to its end: every event once, in order, ending ``done``."""
    sid = head[0].data["stream_id"]
    with httpx.Client(base_url=server.url, timeout=120) as client:
        rest = read_stream(
            client,
            "GET",
            f"/v1/streams/{sid}/events",
            headers={"Last-Event-ID": str(head[-1].id)},
        )
    frames = head + rest
    assert [f.id for f in frames] == list(range(len(frames)))
    assert frames[-1].event == "done", frames[-1]
    return frames


def _cited(frames: list[Frame]) -> list[tuple[int, str]]:
    return [(f.data["n"], f.data["chunk_id"]) for f in frames if f.event == "citation"]


def test_an_answer_killed_while_searching_is_searched_again_and_finished(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    prefix = f"rs-test-retrieval-{uuid.uuid4().hex[:8]}"
    first = _server(server_factory, data, prefix)
    kb = make_kb(first.url, DOCS, prefix="herons")
    reference = _answer(first, kb)
    assert reference[-1].event == "done", reference[-1]
    assert [f.event for f in reference].count("citation") == 2
    killed = _answer(first, kb, stop_after=1)  # the `stream` event: the search has begun
    sid = killed[0].data["stream_id"]
    status = httpx.get(f"{first.url}/v1/streams/{sid}", timeout=30).json()
    assert status["status"] == "running", status  # still searching (SLOW_S seconds)
    first.kill()  # kill -9, before a citation or the answer's plan
    again = _server(server_factory, data, prefix)
    try:
        frames = _finished_on(again, killed)
        # searched again: the same sources and, the prompt being the same, the same answer
        assert _cited(frames) == _cited(reference)
        assert text_of(frames) == text_of(reference)
        conversation = killed[0].data["conversation_id"]
        stored = httpx.get(f"{again.url}/v1/conversations/{conversation}", timeout=30).json()
        assert [m["content"] for m in stored["messages"]] == [QUESTION, text_of(reference)]
    finally:
        again.stop()


def test_streams_killed_while_they_wait_for_a_generation_slot_are_taken_over(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """A stream queued for a slot had no plan saved until its turn came: killed then, it ended
    with `start_interrupted` (the chaos campaign at scale, with many streams queued). The plan
    now goes into the log with the stream itself."""
    data = tmp_path / "data"
    prefix = f"rs-test-queued-{uuid.uuid4().hex[:8]}"
    one_slot = {
        "RAG_STREAM_LIMITS__MAX_ACTIVE_STREAMS": "1",
        "RAG_STREAM_LIMITS__MAX_TOKENS": "4000",
    }
    first = _server(server_factory, data, prefix, **one_slot)
    kb = make_kb(first.url, DOCS, prefix="queued")
    queued = [
        ("/v1/generate", {"prompt": "Say something about herons.", "max_tokens": 60}),
        ("/v1/answers", {"kb": kb, "question": "Where is the fair held?", "max_tokens": 60}),
    ]
    with httpx.Client(base_url=first.url, timeout=60) as client:
        references = [read_stream(client, "POST", path, json=body) for path, body in queued]
        # holds the one slot for 20 s (4,000 tokens at 200 a second)
        read_stream(client, "POST", "/v1/generate", json={"prompt": "hold", "max_tokens": 4000},
                    stop_after=2)  # fmt: skip
        heads = [read_stream(client, "POST", p, json=b, stop_after=1) for p, b in queued]
        for head in heads:
            status = client.get(f"/v1/streams/{head[0].data['stream_id']}").json()
            assert (status["status"], status["last_event_id"]) == ("running", 0), status
    first.kill()  # kill -9 while both wait for the slot
    again = _server(server_factory, data, prefix, **one_slot)
    try:
        for head, reference in zip(heads, references, strict=True):
            frames = _finished_on(again, head)
            assert _cited(frames) == _cited(reference)
            assert text_of(frames) == text_of(reference)
    finally:
        again.stop()


def test_a_takeover_after_some_citations_went_out_does_not_search_again() -> None:
    """Another search could number the sources otherwise: the stream ends with a clear
    error (`start_interrupted`) instead."""
    plan = QuestionPlan(
        prompt_ids=[1, 2, 3],
        max_tokens=10,
        kb_id="kb",
        question="q",
        conversation_id="c",
        tail_template="",
        top_k=2,
        mmr=False,
        mode="hybrid",
    )
    kind = AnswerKind(KindDeps(None, None, None, None, None, load_settings()))  # type: ignore[arg-type]
    logged = [
        StreamStarted(id=0, stream_id="s", model="m", created=0.0),
        Citation(
            id=1,
            n=1,
            chunk_id="ch",
            document_id="d",
            title="t",
            heading=None,
            snippet="x",
            offsets=(0, 1),
            score=0.5,
        ),
    ]
    with pytest.raises(StartInterrupted):
        kind.continuation(plan.model_dump_json(), logged)


@pytest.fixture
async def searching_slowly(in_process_factory: InProcessFactory) -> AsyncIterator[InProcess]:
    async with in_process_factory(
        delay_s=STUB_DELAY_S,
        slow_query_s=SLOW_S,
        streaming__key_prefix=f"rs-test-retrieval-{uuid.uuid4().hex[:8]}",
    ) as service:
        yield service


async def test_an_answer_cancelled_while_searching_ends_cancelled_and_is_recorded(
    searching_slowly: InProcess,
) -> None:
    """Nothing was answered, so no conversation keeps it; the stream is still recorded, as
    every ended stream is, and GET /v1/usage counts the request."""
    client = searching_slowly.client
    kb = await inprocess.make_kb(client, DOCS, prefix="herons")
    before = (await client.get("/v1/usage")).json()["by_kind"].get("answer", {"requests": 0})
    body = {"kb": kb, "question": QUESTION, "max_tokens": 80, "top_k": 2}
    # the `stream` event: the search has begun
    first = await inprocess.read_stream(
        searching_slowly.live, "POST", "/v1/answers", json=body, stop_after=1
    )
    sid = first[0].data["stream_id"]
    assert (await client.get(f"/v1/streams/{sid}")).json()["status"] == "running"
    (await client.post(f"/v1/streams/{sid}/cancel")).raise_for_status()
    frames = first + await inprocess.read_stream(
        client, "GET", f"/v1/streams/{sid}/events", headers={"Last-Event-ID": "0"}
    )
    assert [f.id for f in frames] == list(range(len(frames)))
    assert [f.event for f in frames] == ["stream", "done"], frames
    assert frames[-1].data["finish_reason"] == "cancelled"
    after = (await client.get("/v1/usage")).json()["by_kind"]["answer"]
    assert after["requests"] == before["requests"] + 1
    conversation = first[0].data["conversation_id"]
    assert (await client.get(f"/v1/conversations/{conversation}")).status_code == 404
