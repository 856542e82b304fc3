"""Write prepared documents to SQL and Qdrant, and delete them, without half-written state.

Write order for one document (new chunk ids every time):
1. embed the chunks (dense, and BM25 for keyword search) and upsert their vectors into Qdrant;
2. in ONE SQL transaction: delete the previous version with the same source (its chunks
   cascade) and insert the new document and chunk rows;
3. after the commit, delete the previous version's vectors.
Search joins Qdrant hits with live chunk rows, so it sees the old version until the commit and
the new one after it, never both and never neither. If anything fails between 1 and the commit,
the vectors written in 1 are deleted again (compensation), so no orphan rows or points remain.

A wave of several documents is embedded together, so the model sees full, length-sorted
batches, while every document keeps its own SQL transaction and compensation.

Identical content is stored once per knowledge base: the unique constraint on
``(kb_id, content_hash)`` decides races between processes, and the loser returns the winner's
document after removing its own vectors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from rag_stream.errors import Conflict, NotFound, RagStreamError
from rag_stream.ingest.documents import PreparedDocument
from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.sparse import SparseEncoder
from rag_stream.retrieval.vector_store import VectorPoint, VectorStore
from rag_stream.store import ingests
from rag_stream.store import repositories as repo
from rag_stream.store.models import Chunk, Document, KnowledgeBase

log = logging.getLogger(__name__)

_COMMIT_ATTEMPTS = 3


@dataclass(frozen=True)
class IngestResult:
    document: Document
    created: bool
    replaced_id: str | None = None


Outcome = IngestResult | RagStreamError
# called with the number of the wave's chunks embedded so far; raising stops the write
OnProgress = Callable[[int], Awaitable[None]]


class DocumentWriter:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        vectors: VectorStore,
        embedder: Embedder,
        embed_batch_size: int,
        sparse: SparseEncoder,
    ) -> None:
        self._sessions = sessions
        self._vectors = vectors
        self._embedder = embedder
        self._embed_batch_size = embed_batch_size
        self._sparse = sparse

    async def write(
        self, wave: Sequence[PreparedDocument], on_progress: OnProgress | None = None
    ) -> list[Outcome]:
        """Write vectors for the whole wave, then commit document by document; one outcome per
        document (NotFound and Conflict are outcomes, other failures raise). Vectors of a
        document that did not commit (failure, cancellation, or identical content won
        elsewhere) are removed."""
        outcomes: list[Outcome] = []
        committed: set[int] = set()
        try:
            await self._write_vectors(wave, on_progress)
            for i, prepared in enumerate(wave):
                try:
                    result = await self._commit(prepared)
                except (NotFound, Conflict) as exc:
                    outcomes.append(exc)
                    continue
                outcomes.append(result)
                if result.created:
                    committed.add(i)
        finally:
            stale = [c for i, p in enumerate(wave) if i not in committed for c in p.chunk_ids]
            if stale:
                await self._discard(stale)
        return outcomes

    async def delete_document(self, kb_id: str, doc_id: str) -> None:
        async with self._sessions() as session:
            doc = await repo.get_document(session, kb_id, doc_id)
            ids = await repo.chunk_ids(session, doc.id)
            await session.delete(doc)
            await session.commit()
        await self._discard(ids)

    async def delete_kb(self, kb_id: str) -> None:
        # Vectors first: if Qdrant is down nothing is deleted and the caller gets a 503.
        await self._vectors.delete_kb(kb_id)
        async with self._sessions() as session:
            kb = await session.get(KnowledgeBase, kb_id)
            if kb is None:
                raise NotFound(f"knowledge base {kb_id!r} not found")
            await session.delete(kb)
            await session.commit()
        # An ingestion that committed between the two steps left vectors behind: sweep again.
        with anyio.CancelScope(shield=True):
            try:
                await self._vectors.delete_kb(kb_id)
            except Exception as exc:
                log.warning("kb delete: second vector sweep failed: %s", exc)

    async def _write_vectors(
        self, wave: Sequence[PreparedDocument], on_progress: OnProgress | None
    ) -> None:
        # Sorted by length, the slices pad as little as one encode() over everything would,
        # and while slice n+1 is embedded in a worker thread, slice n is written to Qdrant.
        items = sorted(
            (
                (chunk_id, span.text, prepared.document, span.token_count)
                for prepared in wave
                for chunk_id, span in zip(prepared.chunk_ids, prepared.spans, strict=True)
            ),
            key=lambda item: -item[3],
        )
        step = 2 * self._embed_batch_size
        pending: asyncio.Task[None] | None = None
        try:
            for i in range(0, len(items), step):
                batch = items[i : i + step]
                texts = [text for _, text, _, _ in batch]
                vectors = await self._embedder.embed(texts)
                # ~0.1 ms a chunk (1-2 % of embedding it), off the loop all the same
                sparse = await anyio.to_thread.run_sync(self._sparse.encode_documents, texts)
                points = [
                    VectorPoint(chunk_id, vector, doc.kb_id, doc.id, doc.meta, terms)
                    for (chunk_id, _, doc, _), vector, terms in zip(
                        batch, vectors, sparse, strict=True
                    )
                ]
                if pending is not None:
                    await pending
                pending = asyncio.create_task(self._vectors.upsert(points))
                if on_progress is not None:
                    await on_progress(i + len(batch))
            if pending is not None:
                await pending
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.gather(pending, return_exceptions=True)

    async def _commit(self, prepared: PreparedDocument) -> IngestResult:
        document = prepared.document
        rows = [
            {
                "id": chunk_id,
                "document_id": document.id,
                "kb_id": document.kb_id,
                "ordinal": span.ordinal,
                "text": span.text,
                "start": span.start,
                "end": span.end,
                "heading": span.heading[:512] if span.heading else None,
                "token_count": span.token_count,
            }
            for chunk_id, span in zip(prepared.chunk_ids, prepared.spans, strict=True)
        ]
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            async with self._sessions() as session:
                try:
                    old_ids: list[str] = []
                    old = None
                    if document.source:
                        old = await repo.document_by_source(
                            session, document.kb_id, document.source
                        )
                    if old is not None and old.content_hash == document.content_hash:
                        # a concurrent upload of the same content committed since this one
                        # was prepared: that one stands (this one's vectors are removed)
                        return IngestResult(old, created=False)
                    if old is not None:
                        old_ids = await repo.chunk_ids(session, old.id)
                        await session.delete(old)
                        await session.flush()  # the delete must reach SQL before the insert
                    if prepared.from_ingest and not await ingests.claim(session, document.id):
                        raise NotFound(f"document {document.id!r} was deleted during its ingest")
                    session.add(document)
                    await session.flush()
                    await session.execute(insert(Chunk), rows)
                    # once sent, a commit is seen through: cancelled half-way, the rows could be
                    # stored while the caller (taking it for failed) deleted their vectors
                    with anyio.CancelScope(shield=True):
                        await session.commit()
                except (IntegrityError, StaleDataError):
                    await session.rollback()
                    session.expunge_all()
                    winner = await repo.document_by_hash(
                        session, document.kb_id, document.content_hash
                    )
                    if winner is not None:
                        return IngestResult(winner, created=False)
                    if await session.get(KnowledgeBase, document.kb_id) is None:
                        raise NotFound(f"knowledge base {document.kb_id!r} not found") from None
                    if attempt == _COMMIT_ATTEMPTS:
                        raise Conflict(
                            f"source {document.source!r} kept changing concurrently; retry"
                        ) from None
                    continue
            if old_ids:
                await self._discard(old_ids)
            return IngestResult(document, created=True, replaced_id=old.id if old else None)
        raise AssertionError("unreachable")

    async def _discard(self, chunk_ids: list[str]) -> None:
        """Delete vectors whose rows are not (or no longer) committed; never raises."""
        with anyio.CancelScope(shield=True):
            try:
                await self._vectors.delete_chunks(chunk_ids)
            except Exception as exc:
                # Orphan points are invisible to search (it joins live rows) but take space.
                log.warning("ingest: could not delete %d vectors: %s", len(chunk_ids), exc)
