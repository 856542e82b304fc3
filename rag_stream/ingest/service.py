"""Ingest documents into a knowledge base, replace and delete them: the one entry point of the
routes, the CLI and the sample knowledge base.

- ``documents``: drafts, and preparing one (chunking; content already stored is found instead);
- ``writer``: vectors first, then one SQL transaction per document, with compensation; the
  write order, and why search never sees half a replacement, is explained there;
- ``batch``: many documents, embedded together in waves;
- ``locks``: an in-process lock per content hash and per source, so one process never embeds
  the same upload twice (between processes the unique constraints decide);
- ``background``: uploads longer than ``ingest.background_above_chars``, ingested after their
  request answered 202, observable and cancellable by the document's id;
- ``slots``: how many uploads one process ingests at once, in all and per tenant (429 past).

An upload (``submit``) below the background threshold is ingested inside its request and is
whole-or-nothing: when its caller leaves (``gone`` returns) the ingest is cancelled and its
vectors removed, so nothing of it stays; when the service stops under it, the same happens and
the request answers 503.

Knowledge bases are named by reference (id or name, as ``repo.resolve_kb`` takes them) and
resolved in the ingestor's own sessions, so a request's session is never held over an upload.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import RagStreamError, ServiceUnavailable
from rag_stream.ingest.background import Accepted, BackgroundIngests
from rag_stream.ingest.batch import IngestBatch, OnChunks, OnOutcome
from rag_stream.ingest.chunking import ChunkSpan
from rag_stream.ingest.documents import (
    DocumentDraft,
    DocumentPreparer,
    PreparedDocument,
    content_hash,
    require_text,
)
from rag_stream.ingest.locks import KeyedLocks
from rag_stream.ingest.low_priority import LowPriorityEmbedder, low_priority
from rag_stream.ingest.parsing import ParsedText
from rag_stream.ingest.slots import IngestSlots
from rag_stream.ingest.writer import DocumentWriter, IngestResult
from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.sparse import SparseEncoder
from rag_stream.retrieval.vector_store import VectorStore
from rag_stream.settings import IngestSettings
from rag_stream.store import ingests
from rag_stream.store import repositories as repo
from rag_stream.store.models import KnowledgeBase

T = TypeVar("T")


class CallerLeft(Exception):
    """The caller of an in-request ingest went away first; nothing of it was stored."""


class Ingestor:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        vectors: VectorStore,
        embedder: Embedder,
        settings: IngestSettings,
        *,
        sparse: SparseEncoder,
        retry_after_s: int = 2,
    ) -> None:
        self._sessions = sessions
        self.settings = settings
        self._preparer = DocumentPreparer(sessions, embedder, settings)
        self._writer = DocumentWriter(
            sessions, vectors, embedder, settings.embed_batch_size, sparse
        )
        self._vectors = vectors
        self._embedder = embedder
        self._sparse = sparse
        self._background_writer: DocumentWriter | None = None
        self._slow_embedder: Embedder | None = None
        self._making_background_writer = asyncio.Lock()
        self._wave_chunks = 8 * settings.embed_batch_size
        self._locks = KeyedLocks()
        self.slots = IngestSlots(settings.max_active, settings.max_active_per_tenant, retry_after_s)
        self._background = BackgroundIngests(
            sessions, self._preparer, self._writer_for_background, self._locks
        )

    async def _writer_for_background(self) -> DocumentWriter:
        """The background ingests' writer: its embedder at the lowest CPU priority."""
        async with self._making_background_writer:
            if self._background_writer is None:
                slow = await anyio.to_thread.run_sync(low_priority, self._embedder)
                self._slow_embedder = slow
                self._background_writer = DocumentWriter(
                    self._sessions,
                    self._vectors,
                    slow,
                    self.settings.embed_batch_size,
                    self._sparse,
                )
            return self._background_writer

    @property
    def embedder(self) -> Embedder:
        """The embedder of requests' ingests."""
        return self._embedder

    @property
    def max_tokens(self) -> int:
        """The longest chunk, in embedder tokens."""
        return self._preparer.max_tokens

    async def resolve_kb(self, kb_ref: str, *, tenant: str) -> KnowledgeBase:
        """The tenant's knowledge base whose id or name is ``kb_ref``; NotFound if there is
        none."""
        async with self._sessions() as session:
            return await repo.resolve_kb(session, kb_ref, tenant=tenant)

    async def submit(
        self,
        kb_id: str,
        draft: DocumentDraft,
        *,
        tenant: str,
        gone: Callable[[], Awaitable[None]],
    ) -> IngestResult | Accepted:
        """An upload from a client: ingested in the background when its text is longer than
        ``background_above_chars`` (Accepted), else now, unless ``gone()`` returns first
        (CallerLeft, nothing stored). TooManyRequests when the process or the tenant is
        ingesting as many uploads as it may."""
        slot = self.slots.take(tenant)
        background = len(draft.parsed.text) > self.settings.background_above_chars
        if not background:
            try:
                async with self._sessions() as session:
                    live = await ingests.processing_with(
                        session, kb_id, content_hash(require_text(draft)), draft.source
                    )
            except BaseException:
                slot.release()
                raise
            # the same content, or its source, is being ingested: the background answers
            background = live is not None
        if background:
            return await self._background.start(kb_id, draft, slot)  # holds the slot now
        try:
            return await _unless(gone, self.ingest(kb_id, draft, tenant=tenant))
        finally:
            slot.release()

    async def ingest(self, kb_ref: str, draft: DocumentDraft, *, tenant: str) -> IngestResult:
        digest = content_hash(require_text(draft))
        kb_id = (await self.resolve_kb(kb_ref, tenant=tenant)).id
        keys = [f"{kb_id}/hash/{digest}"]
        if draft.source:
            keys.append(f"{kb_id}/source/{draft.source}")
        async with self._locks.hold(keys):
            prepared = await self._preparer.prepare(kb_id, draft)
            if not isinstance(prepared, PreparedDocument):
                return IngestResult(prepared, created=False)
            (outcome,) = await self._writer.write([prepared])
            if isinstance(outcome, RagStreamError):
                raise outcome
            return outcome

    def batch(
        self,
        kb_id: str,
        on_outcome: OnOutcome | None = None,
        on_chunks: OnChunks | None = None,
        embedder: Embedder | None = None,
    ) -> IngestBatch:
        """Ingest many documents into the knowledge base ``kb_id``, embedding chunks of several
        documents together (as fast as one ``encode`` over all texts); each document still
        commits on its own. ``on_chunks`` follows each wave's embedding. ``embedder``, when
        given, embeds the chunks instead of the ingestor's own (the sample KB's kept vectors)."""
        writer = self._writer
        if embedder is not None:
            writer = DocumentWriter(
                self._sessions,
                self._vectors,
                embedder,
                self.settings.embed_batch_size,
                self._sparse,
            )
        return IngestBatch(self._preparer, writer, kb_id, on_outcome, self._wave_chunks, on_chunks)

    async def delete_document(self, kb_ref: str, doc_id: str, *, tenant: str) -> None:
        """Delete the document, or stop its background ingest (or forget its failure)."""
        kb_id = (await self.resolve_kb(kb_ref, tenant=tenant)).id
        # The ingest's row first: its commit claims that row, so once it is deleted the ingest
        # can no longer write the document, and if it is gone the document is written already.
        async with self._sessions() as session:
            stopped = await ingests.remove(session, kb_id, doc_id)
            await session.commit()
        if stopped is not None:
            await self._background.cancel(doc_id)
            return
        await self._writer.delete_document(kb_id, doc_id)

    async def recover(self) -> None:
        """At start: uploads a killed process left processing are marked failed."""
        await self._background.recover()

    async def close(self) -> None:
        """Stop the background ingests; their uploads are marked failed, nothing half-stored."""
        await self._background.close()
        if isinstance(self._slow_embedder, LowPriorityEmbedder):
            self._slow_embedder.close()

    async def delete_kb(self, kb_ref: str, *, tenant: str) -> None:
        kb_id = (await self.resolve_kb(kb_ref, tenant=tenant)).id
        await self._writer.delete_kb(kb_id)

    async def chunk(self, parsed: ParsedText) -> list[ChunkSpan]:
        return await self._preparer.chunk(parsed)


async def _unless(gone: Callable[[], Awaitable[None]], work: Awaitable[T]) -> T:
    """``work``'s result, unless ``gone()`` returns first: then ``work`` is cancelled (it
    cleans up after itself) and CallerLeft raised. Cancelled itself (the server stopping), it
    cancels ``work`` too and answers 503 rather than ending the request with a traceback."""
    job = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({job, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        await _stop(job)
        raise ServiceUnavailable(
            "the server is stopping; nothing of this document was stored"
        ) from None
    finally:
        watch.cancel()
    if job.done():
        return job.result()
    await _stop(job)
    raise CallerLeft


async def _stop(job: asyncio.Future[T]) -> None:
    job.cancel()
    # shielded: a second cancellation must not leave it half-done (its own clean-up is too)
    await asyncio.shield(asyncio.gather(job, return_exceptions=True))
