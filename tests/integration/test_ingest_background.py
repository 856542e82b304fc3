"""Uploads over HTTP, in the test process (tests/support/inprocess.py), with an embedder the
test holds at a batch of its choice (tests/support/gated_embedder.py) so that it can act while
an ingest runs: the text limit on JSON, a client leaving an in-request ingest, large uploads
ingested in the background (202, progress, searchable once whole, DELETE stops one), the bound
on ingests at once (429), and what a restart does to an ingest that was running."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.vector_store import VectorQuery
from rag_stream.store.models import Chunk, Document, DocumentIngest, utcnow
from tests.support.gated_embedder import GatedEmbedder
from tests.support.inprocess import (
    InProcess,
    StubOptions,
    explicit_settings,
    postgres,
    run_in_process,
)
from tests.support.waiting import eventually

# Small chunks and batches: a few kilobytes of text make many embedding batches.
SMALL_BATCHES = {
    "ingest__chunk_tokens": 32,
    "ingest__chunk_overlap": 0,
    "ingest__embed_batch_size": 4,  # 8 chunks an embedding call
}
WORDS = ["kestrel", "wagtail", "bunting", "dunnock", "linnet", "siskin", "redpoll", "twite"]


def long_text(marker: str, paragraphs: int = 40) -> str:
    """Prose of ``paragraphs`` paragraphs (about 60 chunks of 32 tokens at 40), with ``marker``
    in the first one, for a search to find."""
    body = [
        " ".join(f"{WORDS[(i + j) % len(WORDS)]}" for j in range(24)) + "."
        for i in range(paragraphs)
    ]
    body[0] = f"The {marker} nests under the bridge. " + body[0]
    return "\n\n".join(body)


@dataclass(frozen=True)
class _Gated(StubOptions):
    gate: GatedEmbedder | None = None

    def embedder(self, shared: Embedder) -> Embedder:
        assert self.gate is not None
        return self.gate


@contextlib.asynccontextmanager
async def service(
    data_dir: Path, models_dir: Path, gate: GatedEmbedder, **overrides: Any
) -> AsyncIterator[InProcess]:
    settings = explicit_settings(data_dir, models_dir, **{**SMALL_BATCHES, **overrides})
    async with run_in_process(settings, gate, _Gated(gate=gate)) as running:
        yield running


@pytest.fixture
def gate(shared_embedder: Embedder) -> GatedEmbedder:
    return GatedEmbedder(shared_embedder, hold_at=2)


async def new_kb(client: httpx.AsyncClient) -> tuple[str, str]:
    r = await client.post("/v1/kbs", json={"name": f"birds-{uuid.uuid4().hex[:8]}"})
    assert r.status_code == 201, r.text
    return r.json()["name"], r.json()["id"]


async def stored(service: InProcess, kb_id: str) -> tuple[int, int, int]:
    """(documents, chunk rows, vector points) of the knowledge base."""
    resources = service.resources
    async with resources.sessions() as session:
        docs = await session.scalar(select(func.count(Document.id)).where(Document.kb_id == kb_id))
        chunks = await session.scalar(select(func.count(Chunk.id)).where(Chunk.kb_id == kb_id))
    (vector,) = await resources.embedder.embed(["kestrel wagtail"])
    hits = await resources.vectors.search(kb_id, VectorQuery("dense", dense=vector), 10_000)
    return int(docs or 0), int(chunks or 0), len(hits)


async def search_hits(client: httpx.AsyncClient, kb: str, query: str) -> list[str]:
    r = await client.post(f"/v1/kbs/{kb}/search", json={"query": query, "mode": "sparse"})
    assert r.status_code == 200, r.text
    return [hit["document_id"] for hit in r.json()["results"]]


async def test_json_text_over_the_text_limit_is_a_413_as_a_file_is(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder
) -> None:
    gate.release()
    async with service(tmp_path, models_dir, gate, ingest__max_text_chars=1000) as app:
        kb, _ = await new_kb(app.client)
        text = "word " * 1200  # 6,000 characters
        as_json = await app.client.post(
            f"/v1/kbs/{kb}/documents", json={"title": "long", "text": text}
        )
        as_file = await app.client.post(
            f"/v1/kbs/{kb}/documents", files={"file": ("long.txt", text.encode(), "text/plain")}
        )
        for r in (as_json, as_file):
            assert r.status_code == 413, r.text
            assert "limit of 1000 characters" in r.json()["error"]["message"]
        within = await app.client.post(
            f"/v1/kbs/{kb}/documents", json={"title": "short", "text": "word " * 100}
        )
        assert within.status_code == 201, within.text


async def test_a_client_leaving_an_in_request_ingest_stops_it_and_leaves_nothing(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder
) -> None:
    async with service(tmp_path, models_dir, gate) as app:
        kb, kb_id = await new_kb(app.client)
        text = long_text("hawfinch")
        assert len(text) < app.settings.ingest.background_above_chars  # ingested in the request
        upload = asyncio.create_task(
            app.live.post(f"/v1/kbs/{kb}/documents", json={"title": "birds", "text": text})
        )
        # the first batch is embedded and its vectors written; the second is being embedded
        await asyncio.wait_for(gate.held.wait(), 60)
        assert gate.batches == 2
        upload.cancel()  # the client leaves
        with contextlib.suppress(asyncio.CancelledError):
            await upload

        async def ended() -> bool:
            return app.resources.ingestor.slots.active == 0

        await eventually(ended, "the ingest ends after its client left", 30)
        gate.release()
        assert await stored(app, kb_id) == (0, 0, 0)
        assert gate.batches == 2  # no batch was embedded after the client left
        assert await search_hits(app.client, kb, "hawfinch") == []


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
async def test_a_long_upload_answers_202_and_is_searchable_only_once_whole(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder, database: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        db: dict[str, str] = {}
        if database == "postgresql":
            db["database_url"] = await stack.enter_async_context(postgres())
        app = await stack.enter_async_context(
            service(tmp_path, models_dir, gate, ingest__background_above_chars=2000, **db)
        )
        kb, kb_id = await new_kb(app.client)
        old = await app.client.post(
            f"/v1/kbs/{kb}/documents",
            json={"title": "birds", "text": "The goldcrest is tiny.", "source": "birds.md"},
        )
        assert old.status_code == 201, old.text
        r = await app.client.post(  # a new version of the same source
            f"/v1/kbs/{kb}/documents",
            json={"title": "birds", "text": long_text("hawfinch"), "source": "birds.md"},
        )
        assert r.status_code == 202, r.text
        accepted = r.json()
        assert accepted["status"] == "processing" and accepted["created"] is True
        doc = accepted["id"]
        assert r.headers["location"] == f"/v1/kbs/{kb}/documents/{doc}"

        await asyncio.wait_for(gate.held.wait(), 60)  # one batch done, the next one held
        seen = (await app.client.get(f"/v1/kbs/{kb}/documents/{doc}")).json()
        assert seen["status"] == "processing", seen
        assert seen["chunk_count"] > 8 and seen["chunks_done"] == 8, seen
        assert seen["text"] is None and seen["error"] is None
        # not searchable, not listed while processing (its first vectors written): the old
        # version is, whole
        assert await search_hits(app.client, kb, "hawfinch") == []
        assert await search_hits(app.client, kb, "goldcrest") == [old.json()["id"]]
        listed = (await app.client.get(f"/v1/kbs/{kb}/documents")).json()["data"]
        assert [d["id"] for d in listed] == [old.json()["id"]]
        assert (await stored(app, kb_id))[:2] == (1, 1)

        gate.release()

        async def ready() -> bool:
            r = await app.client.get(f"/v1/kbs/{kb}/documents/{doc}")
            return bool(r.json()["status"] == "ready")

        await eventually(ready, "the document is ready", 120)
        done = (await app.client.get(f"/v1/kbs/{kb}/documents/{doc}")).json()
        assert done["chunks_done"] == done["chunk_count"] == seen["chunk_count"]
        assert done["source"] == "birds.md" and "hawfinch" in done["text"]
        assert await search_hits(app.client, kb, "hawfinch") == [doc]
        assert await search_hits(app.client, kb, "goldcrest") == []  # replaced at that moment
        assert await stored(app, kb_id) == (1, done["chunk_count"], done["chunk_count"])


async def test_deleting_a_document_being_ingested_stops_its_ingest(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder
) -> None:
    async with service(tmp_path, models_dir, gate, ingest__background_above_chars=2000) as app:
        kb, kb_id = await new_kb(app.client)
        r = await app.client.post(
            f"/v1/kbs/{kb}/documents", json={"title": "birds", "text": long_text("hawfinch")}
        )
        assert r.status_code == 202, r.text
        doc = r.json()["id"]
        await asyncio.wait_for(gate.held.wait(), 60)
        assert (await app.client.delete(f"/v1/kbs/{kb}/documents/{doc}")).status_code == 204
        assert app.resources.ingestor.slots.active == 0  # stopped before the DELETE answered
        gate.release()
        assert gate.batches == 2
        assert (await app.client.get(f"/v1/kbs/{kb}/documents/{doc}")).status_code == 404
        assert await stored(app, kb_id) == (0, 0, 0)


async def test_ingests_past_the_bound_get_a_429_with_retry_after(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder
) -> None:
    async with service(
        tmp_path,
        models_dir,
        gate,
        ingest__background_above_chars=2000,
        ingest__max_active_per_tenant=1,
    ) as app:
        kb, _ = await new_kb(app.client)
        data = long_text("hawfinch").encode()
        first = await app.client.post(  # a file goes to the background as a JSON text does
            f"/v1/kbs/{kb}/documents", files={"file": ("birds.md", data, "text/markdown")}
        )
        assert first.status_code == 202, first.text
        assert first.json()["source"] == "birds.md"
        await asyncio.wait_for(gate.held.wait(), 60)
        second = await app.client.post(
            f"/v1/kbs/{kb}/documents", json={"title": "small", "text": "A wren sang."}
        )
        assert second.status_code == 429, second.text
        assert int(second.headers["retry-after"]) >= 1
        assert second.json()["error"]["code"] == "too_many_requests"
        gate.release()

        async def free() -> bool:
            return app.resources.ingestor.slots.active == 0

        await eventually(free, "the first ingest ends", 120)
        again = await app.client.post(
            f"/v1/kbs/{kb}/documents", json={"title": "small", "text": "A wren sang."}
        )
        assert again.status_code == 201, again.text


async def test_an_ingest_running_at_shutdown_is_failed_and_a_new_upload_stores_it(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder, shared_embedder: Embedder
) -> None:
    options = {"ingest__background_above_chars": 2000}
    async with service(tmp_path, models_dir, gate, **options) as app:
        kb, kb_id = await new_kb(app.client)
        r = await app.client.post(
            f"/v1/kbs/{kb}/documents", json={"title": "birds", "text": long_text("hawfinch")}
        )
        assert r.status_code == 202, r.text
        doc = r.json()["id"]
        await asyncio.wait_for(gate.held.wait(), 60)
    # the same data directory, started again (the schema is already there)
    again = GatedEmbedder(shared_embedder, hold_at=10**6)
    async with service(tmp_path, models_dir, again, **options) as app:
        failed = (await app.client.get(f"/v1/kbs/{kb}/documents/{doc}")).json()
        assert failed["status"] == "failed", failed
        assert failed["error"]["code"] == "ingest_interrupted"
        assert "upload it again" in failed["error"]["message"]
        assert await stored(app, kb_id) == (0, 0, 0)
        retry = await app.client.post(
            f"/v1/kbs/{kb}/documents", json={"title": "birds", "text": long_text("hawfinch")}
        )
        assert retry.status_code == 202, retry.text

        async def ready() -> bool:
            r = await app.client.get(f"/v1/kbs/{kb}/documents/{retry.json()['id']}")
            return bool(r.json()["status"] == "ready")

        await eventually(ready, "the new upload is ready", 120)
        # the failed one stays, for its client to read, until deleted
        assert (await app.client.delete(f"/v1/kbs/{kb}/documents/{doc}")).status_code == 204


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
async def test_an_ingest_its_process_abandoned_is_failed_at_the_next_start(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder, database: str
) -> None:
    """What a kill -9 leaves: a processing row nobody renews. The next start marks it failed
    (before anyone reads it); a live one it leaves alone."""
    gate.release()
    async with contextlib.AsyncExitStack() as stack:
        if database == "postgresql":
            url = await stack.enter_async_context(postgres())
            await _abandon_and_restart(tmp_path, models_dir, gate, database_url=url)
        else:
            await _abandon_and_restart(tmp_path, models_dir, gate)


async def _abandon_and_restart(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder, **db: Any
) -> None:
    async with service(tmp_path, models_dir, gate, **db) as app:
        _, kb_id = await new_kb(app.client)
        async with app.resources.sessions() as session:
            session.add(
                DocumentIngest(
                    id="abandoned",
                    kb_id=kb_id,
                    title="birds",
                    content_hash="0" * 64,
                    media_type="text/markdown",
                    heartbeat_at=utcnow() - timedelta(minutes=5),
                )
            )
            session.add(  # another process's, renewed a moment ago
                DocumentIngest(
                    id="running",
                    kb_id=kb_id,
                    title="wrens",
                    content_hash="1" * 64,
                    media_type="text/markdown",
                )
            )
            await session.commit()
    async with service(tmp_path, models_dir, gate, **db) as app:
        async with app.resources.sessions() as session:
            row = await session.get(DocumentIngest, "abandoned")
            live = await session.get(DocumentIngest, "running")
        assert row is not None and (row.status, row.error_code) == ("failed", "ingest_interrupted")
        assert live is not None and live.status == "processing"


async def test_the_client_waits_for_a_background_ingest_showing_its_progress(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder
) -> None:
    from rag_stream.client import AsyncClient
    from rag_stream.schemas.kbs import DocumentDetail

    async with service(tmp_path, models_dir, gate, ingest__background_above_chars=2000) as app:
        kb, _ = await new_kb(app.client)
        seen: list[tuple[str, int, int]] = []

        def progress(document: DocumentDetail) -> None:
            seen.append((document.status, document.chunks_done, document.chunk_count))
            if document.chunks_done:  # the held batch goes on once a step has been seen
                gate.release()

        transport = httpx.ASGITransport(app.app)
        async with AsyncClient("http://127.0.0.1:8000", transport=transport) as client:
            out = await client.add_document(
                kb, "birds", long_text("hawfinch"), on_progress=progress
            )
            assert out.status == "ready" and out.created
            assert out.chunks_done == out.chunk_count > 8
            assert ("processing", 8, out.chunk_count) in seen
            assert seen[-1] == ("ready", out.chunk_count, out.chunk_count)
            later = await client.add_document(kb, "wren", long_text("wren"), wait=False)
            assert later.status == "processing"
            assert (await client.wait_document(kb, later.id)).status == "ready"


async def test_a_server_stopping_under_an_in_request_ingest_answers_503_not_a_traceback(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder
) -> None:
    """uvicorn cancels the requests still running some seconds into a shutdown; a request that
    ends by raising is logged as "Exception in ASGI application" with a 500. An in-request
    ingest cancelled so removes what it wrote and answers 503 instead."""
    async with service(tmp_path, models_dir, gate) as app:
        kb, kb_id = await new_kb(app.client)
        body = json.dumps({"title": "birds", "text": long_text("hawfinch")}).encode()
        pending = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await asyncio.Event().wait()  # the client stays
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": f"/v1/kbs/{kb}/documents",
            "raw_path": f"/v1/kbs/{kb}/documents".encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")],
            "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 123),
        }
        request = asyncio.create_task(app.app(scope, receive, send))
        await asyncio.wait_for(gate.held.wait(), 60)
        request.cancel()  # what uvicorn does past its graceful-shutdown timeout
        await request  # ends with an answer, not an exception
        assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 503
        assert b"nothing of this document was stored" in sent[1]["body"]
        gate.release()
        assert await stored(app, kb_id) == (0, 0, 0)


async def test_background_embedding_runs_on_one_thread_at_nice_19_with_the_same_vectors(
    shared_embedder: Embedder,
) -> None:
    import os
    import threading

    import numpy as np

    from rag_stream.ingest.low_priority import LowPriorityEmbedder, low_priority

    slow = await asyncio.to_thread(low_priority, shared_embedder)
    assert isinstance(slow, LowPriorityEmbedder)
    try:
        texts = [long_text("hawfinch", 2), "A wren sang.", "Kestrels hover over verges."]
        same = np.allclose(await slow.embed(texts), await shared_embedder.embed(texts), atol=1e-5)
        assert same
        nice = await asyncio.get_running_loop().run_in_executor(
            slow._thread, lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        )
        assert nice == 19
    finally:
        slow.close()


async def test_a_document_whose_ingest_ends_between_two_reads_is_found(
    tmp_path: Path, models_dir: Path, gate: GatedEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET on a document reads it, then (not found) its ingest row. The commit that ends a
    background ingest writes the one and deletes the other, and each read sees what was
    committed when it ran: a commit between the two reads found neither (a 404 seen in CI).
    Here the first read comes just before that commit, the second just after it."""
    from rag_stream.api import documents as route

    gate.release()
    async with service(tmp_path, models_dir, gate) as app:
        kb, _ = await new_kb(app.client)
        r = await app.client.post(
            f"/v1/kbs/{kb}/documents", json={"title": "birds", "text": "The wren is loud."}
        )
        assert r.status_code == 201, r.text
        doc = r.json()["id"]
        real_get = route.repo.get_document
        reads = 0

        async def before_the_commit_then_after(*args: Any) -> Any:
            nonlocal reads
            reads += 1
            if reads == 1:
                raise route.NotFound("no such document")  # (as read just before the commit)
            return await real_get(*args)

        async def row_gone(*_args: Any) -> None:
            return None  # the ingest's row, deleted by that commit

        monkeypatch.setattr(route.repo, "get_document", before_the_commit_then_after)
        monkeypatch.setattr(route.ingests, "get", row_gone)
        seen = await app.client.get(f"/v1/kbs/{kb}/documents/{doc}")
        assert seen.status_code == 200, seen.text
        assert seen.json()["status"] == "ready" and seen.json()["text"] == "The wren is loud."
