"""Ingest documents into a knowledge base, replace and delete them, without half-written state.

Write order for one document (new chunk ids every time):
1. embed the chunks and upsert their vectors into Qdrant;
2. in ONE SQL transaction: delete the previous version with the same source (its chunks
   cascade) and insert the new document and chunk rows;
3. after the commit, delete the previous version's vectors.
Search joins Qdrant hits with live chunk rows, so it sees the old version until the commit and
the new one after it, never both and never neither. If anything fails between 1 and the commit,
the vectors written in 1 are deleted again (compensation), so no orphan rows or points remain.

Many documents (CLI, sample KB) go through ``Ingestor.batch``: chunks of several documents are
embedded together, so the model sees full, length-sorted batches, while every document keeps
its own SQL transaction and compensation.

Identical content (same SHA-256 of the extracted text) in the same knowledge base is stored
once: ingesting it again returns the existing document. The unique constraint on
``(kb_id, content_hash)`` decides races between processes; an in-process lock per content hash
and per source avoids embedding the same upload twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from rag_stream.errors import Conflict, InvalidRequest, NotFound, RagStreamError
from rag_stream.ingest.chunking import ChunkSpan, chunk_text
from rag_stream.ingest.parsing import ParsedText, media_type_for, parse
from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.vector_store import VectorPoint, VectorStore
from rag_stream.settings import IngestSettings
from rag_stream.store import repositories as repo
from rag_stream.store.models import Chunk, Document, KnowledgeBase, new_id

log = logging.getLogger(__name__)

_COMMIT_ATTEMPTS = 3


@dataclass(frozen=True)
class DocumentDraft:
    title: str
    parsed: ParsedText
    source: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class IngestResult:
    document: Document
    created: bool
    replaced_id: str | None = None


async def parse_upload(data: bytes, filename: str | None, content_type: str | None) -> ParsedText:
    """Parse uploaded bytes off the event loop; 415 for unknown types, 422 for unreadable ones."""
    media_type = media_type_for(filename, content_type)
    parsed = await anyio.to_thread.run_sync(parse, data, media_type)
    if not parsed.text.strip():
        raise InvalidRequest(f"{filename or 'the upload'} contains no text")
    return parsed


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    @asynccontextmanager
    async def hold(self, keys: Iterable[str]) -> AsyncIterator[None]:
        ordered = sorted(set(keys))  # one global order: no deadlock between two holders
        for key in ordered:
            self._users[key] = self._users.get(key, 0) + 1
            self._locks.setdefault(key, asyncio.Lock())
        held: list[str] = []
        try:
            for key in ordered:
                await self._locks[key].acquire()
                held.append(key)
            yield
        finally:
            for key in reversed(held):
                self._locks[key].release()
            for key in ordered:
                self._users[key] -= 1
                if not self._users[key]:
                    del self._users[key], self._locks[key]


@dataclass
class _Prepared:
    """A document chunked and ready to embed, with the chunk ids its vectors will get."""

    document: Document
    spans: list[ChunkSpan]
    ids: list[str]


Outcome = IngestResult | RagStreamError
OnOutcome = Callable[[Any, Outcome], None]


class Ingestor:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        vectors: VectorStore,
        embedder: Embedder,
        settings: IngestSettings,
    ) -> None:
        self._sessions = sessions
        self._vectors = vectors
        self._embedder = embedder
        self._settings = settings
        self._locks = _KeyedLocks()
        # The embedder cannot read more than max_seq_length tokens, including 2 special ones.
        self.max_tokens = max(8, min(settings.chunk_tokens, embedder.max_seq_length - 2))

    async def ingest(self, kb_id: str, draft: DocumentDraft) -> IngestResult:
        text = draft.parsed.text
        if not text.strip():
            raise InvalidRequest("document text is empty")
        keys = [f"{kb_id}/hash/{content_hash(text)}"]
        if draft.source:
            keys.append(f"{kb_id}/source/{draft.source}")
        async with self._locks.hold(keys):
            prepared = await self._prepare(kb_id, draft)
            if isinstance(prepared, IngestResult):
                return prepared
            (outcome,) = await self._store([prepared])
            if isinstance(outcome, RagStreamError):
                raise outcome
            return outcome

    def batch(self, kb_id: str, on_outcome: OnOutcome | None = None) -> IngestBatch:
        """Ingest many documents, embedding chunks of several documents together (as fast as
        one ``encode`` over all texts); each document still commits on its own."""
        return IngestBatch(self, kb_id, on_outcome, wave_chunks=8 * self._settings.embed_batch_size)

    async def chunk(self, parsed: ParsedText) -> list[ChunkSpan]:
        return await anyio.to_thread.run_sync(
            chunk_text,
            parsed,
            self._embedder.token_offsets,
            self.max_tokens,
            self._settings.chunk_overlap,
        )

    async def _prepare(self, kb_id: str, draft: DocumentDraft) -> _Prepared | IngestResult:
        text = draft.parsed.text
        if not text.strip():
            raise InvalidRequest("document text is empty")
        digest = content_hash(text)
        async with self._sessions() as session:
            if await session.get(KnowledgeBase, kb_id) is None:
                raise NotFound(f"knowledge base {kb_id!r} not found")
            existing = await repo.document_by_hash(session, kb_id, digest)
            if existing is not None:
                return IngestResult(existing, created=False)
        spans = await self.chunk(draft.parsed)
        if not spans:
            raise InvalidRequest("document has no text that can be indexed")
        document = Document(
            id=new_id(),
            kb_id=kb_id,
            title=draft.title[:512],
            source=draft.source,
            content_hash=digest,
            media_type=draft.parsed.media_type,
            text=text,
            meta=dict(draft.meta),
            chunk_count=len(spans),
        )
        return _Prepared(document, spans, [new_id() for _ in spans])

    async def _store(self, wave: list[_Prepared]) -> list[Outcome]:
        """Write vectors for the whole wave, then commit document by document. Vectors of a
        document that did not commit (failure, or identical content won elsewhere) are removed."""
        outcomes: list[Outcome] = []
        committed: set[int] = set()
        try:
            await self._write_vectors(wave)
            for prepared in wave:
                await self._vectors_written(prepared.document.id)
            for i, prepared in enumerate(wave):
                try:
                    result = await self._commit(prepared.document, prepared.spans, prepared.ids)
                except (NotFound, Conflict) as exc:
                    outcomes.append(exc)
                    continue
                outcomes.append(result)
                if result.created:
                    committed.add(i)
        finally:
            stale = [c for i, p in enumerate(wave) if i not in committed for c in p.ids]
            if stale:
                await self._discard(stale)
        return outcomes

    async def _vectors_written(self, document_id: str) -> None:
        """Seam between the vector upsert and the SQL commit (fault-injection tests use it)."""

    async def _write_vectors(self, wave: list[_Prepared]) -> None:
        # Sorted by length, the slices pad as little as one encode() over everything would,
        # and while slice n+1 is embedded in a worker thread, slice n is written to Qdrant.
        items = sorted(
            (
                (chunk_id, span.text, prepared.document, span.token_count)
                for prepared in wave
                for chunk_id, span in zip(prepared.ids, prepared.spans, strict=True)
            ),
            key=lambda item: -item[3],
        )
        step = 2 * self._settings.embed_batch_size
        pending: asyncio.Task[None] | None = None
        try:
            for i in range(0, len(items), step):
                batch = items[i : i + step]
                vectors = await self._embedder.embed([text for _, text, _, _ in batch])
                points = [
                    VectorPoint(chunk_id, vector, doc.kb_id, doc.id, doc.meta)
                    for (chunk_id, _, doc, _), vector in zip(batch, vectors, strict=True)
                ]
                if pending is not None:
                    await pending
                pending = asyncio.create_task(self._vectors.upsert(points))
            if pending is not None:
                await pending
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.gather(pending, return_exceptions=True)

    async def _commit(
        self, document: Document, spans: list[ChunkSpan], ids: list[str]
    ) -> IngestResult:
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
            for chunk_id, span in zip(ids, spans, strict=True)
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
                    if old is not None:
                        old_ids = await repo.chunk_ids(session, old.id)
                        await session.delete(old)
                        await session.flush()  # the delete must reach SQL before the insert
                    session.add(document)
                    await session.flush()
                    await session.execute(insert(Chunk), rows)
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


class IngestBatch:
    """Collects prepared documents into waves of about ``wave_chunks`` chunks and stores each
    wave; ``on_outcome(tag, result or error)`` is called once per added document."""

    def __init__(
        self, ingestor: Ingestor, kb_id: str, on_outcome: OnOutcome | None, wave_chunks: int
    ) -> None:
        self._ingestor = ingestor
        self._kb_id = kb_id
        self._on_outcome = on_outcome
        self._wave_chunks = wave_chunks
        self._wave: list[tuple[Any, _Prepared]] = []
        self._chunks = 0

    async def __aenter__(self) -> IngestBatch:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            await self.flush()

    async def add(self, draft: DocumentDraft, tag: Any = None) -> None:
        try:
            prepared = await self._ingestor._prepare(self._kb_id, draft)
        except (InvalidRequest, NotFound) as exc:
            self._report(tag, exc)
            return
        if isinstance(prepared, IngestResult):
            self._report(tag, prepared)
            return
        self._wave.append((tag, prepared))
        self._chunks += len(prepared.ids)
        if self._chunks >= self._wave_chunks:
            await self.flush()

    async def flush(self) -> None:
        wave, self._wave, self._chunks = self._wave, [], 0
        if not wave:
            return
        outcomes = await self._ingestor._store([prepared for _, prepared in wave])
        for (tag, _), outcome in zip(wave, outcomes, strict=True):
            self._report(tag, outcome)

    def _report(self, tag: Any, outcome: Outcome) -> None:
        if self._on_outcome is not None:
            self._on_outcome(tag, outcome)
