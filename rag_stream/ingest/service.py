"""Ingest documents into a knowledge base, replace and delete them: the one entry point of the
routes, the CLI and the sample knowledge base.

- ``documents``: drafts, and preparing one (chunking; content already stored is found instead);
- ``writer``: vectors first, then one SQL transaction per document, with compensation; the
  write order, and why search never sees half a replacement, is explained there;
- ``batch``: many documents, embedded together in waves;
- ``locks``: an in-process lock per content hash and per source, so one process never embeds
  the same upload twice (between processes the unique constraints decide).

Knowledge bases are named by reference (id or name, as ``repo.resolve_kb`` takes them) and
resolved in the ingestor's own sessions, so a request's session is never held over an upload.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import RagStreamError
from rag_stream.ingest.batch import IngestBatch, OnOutcome
from rag_stream.ingest.chunking import ChunkSpan
from rag_stream.ingest.documents import (
    DocumentDraft,
    DocumentPreparer,
    PreparedDocument,
    content_hash,
    require_text,
)
from rag_stream.ingest.locks import KeyedLocks
from rag_stream.ingest.parsing import ParsedText
from rag_stream.ingest.writer import DocumentWriter, IngestResult
from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.sparse import SparseEncoder
from rag_stream.retrieval.vector_store import VectorStore
from rag_stream.settings import IngestSettings
from rag_stream.store import repositories as repo
from rag_stream.store.models import KnowledgeBase


class Ingestor:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        vectors: VectorStore,
        embedder: Embedder,
        settings: IngestSettings,
        *,
        sparse: SparseEncoder,
    ) -> None:
        self._sessions = sessions
        self.settings = settings
        self._preparer = DocumentPreparer(sessions, embedder, settings)
        self._writer = DocumentWriter(
            sessions, vectors, embedder, settings.embed_batch_size, sparse
        )
        self._wave_chunks = 8 * settings.embed_batch_size
        self._locks = KeyedLocks()

    @property
    def max_tokens(self) -> int:
        """The longest chunk, in embedder tokens."""
        return self._preparer.max_tokens

    async def resolve_kb(self, kb_ref: str, *, tenant: str) -> KnowledgeBase:
        """The tenant's knowledge base whose id or name is ``kb_ref``; NotFound if there is
        none."""
        async with self._sessions() as session:
            return await repo.resolve_kb(session, kb_ref, tenant=tenant)

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

    def batch(self, kb_id: str, on_outcome: OnOutcome | None = None) -> IngestBatch:
        """Ingest many documents into the knowledge base ``kb_id``, embedding chunks of several
        documents together (as fast as one ``encode`` over all texts); each document still
        commits on its own."""
        return IngestBatch(self._preparer, self._writer, kb_id, on_outcome, self._wave_chunks)

    async def delete_document(self, kb_ref: str, doc_id: str, *, tenant: str) -> None:
        kb_id = (await self.resolve_kb(kb_ref, tenant=tenant)).id
        await self._writer.delete_document(kb_id, doc_id)

    async def delete_kb(self, kb_ref: str, *, tenant: str) -> None:
        kb_id = (await self.resolve_kb(kb_ref, tenant=tenant)).id
        await self._writer.delete_kb(kb_id)

    async def chunk(self, parsed: ParsedText) -> list[ChunkSpan]:
        return await self._preparer.chunk(parsed)
