"""A document before it is stored: the draft a caller hands in, and that draft prepared for
writing (chunked, with the ids its chunk rows and vectors will get).

Identical content (same SHA-256 of the extracted text) is stored once per knowledge base, so
preparing a draft whose content is already there returns the stored document instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import InvalidRequest, NotFound
from rag_stream.ingest.chunking import ChunkSpan, chunk_text
from rag_stream.ingest.parsing import ParsedText, media_type_for
from rag_stream.ingest.sandbox import parse_in_worker
from rag_stream.retrieval.embedder import Embedder
from rag_stream.settings import IngestSettings
from rag_stream.store import repositories as repo
from rag_stream.store.models import Document, KnowledgeBase, new_id


@dataclass(frozen=True)
class DocumentDraft:
    title: str
    parsed: ParsedText
    source: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PreparedDocument:
    """A draft chunked and ready to embed, with the chunk ids its vectors and rows will get."""

    document: Document
    spans: list[ChunkSpan]
    chunk_ids: list[str]
    # written in place of the background ingest of the same id (store/ingests.py claim)
    from_ingest: bool = False


# The parse limits of callers that pass no settings (the upload route, for now).
DEFAULT_LIMITS = IngestSettings()


async def parse_upload(
    data: bytes,
    filename: str | None,
    content_type: str | None,
    settings: IngestSettings = DEFAULT_LIMITS,
) -> ParsedText:
    """Parse uploaded bytes in a worker process, within the limits of ``settings``: 415 for an
    unknown type, 413 for more text than ``max_text_chars``, 422 for an unreadable file or one
    that takes longer than ``parse_timeout_s``."""
    media_type = media_type_for(filename, content_type)
    parsed = await parse_in_worker(data, media_type, settings)
    if not parsed.text.strip():
        raise InvalidRequest(f"{filename or 'the upload'} contains no text")
    return parsed


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def require_text(draft: DocumentDraft) -> str:
    """The draft's text; InvalidRequest when it is only white space."""
    text = draft.parsed.text
    if not text.strip():
        raise InvalidRequest("document text is empty")
    return text


class DocumentPreparer:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        embedder: Embedder,
        settings: IngestSettings,
    ) -> None:
        self._sessions = sessions
        self._embedder = embedder
        self._overlap = settings.chunk_overlap
        # The embedder cannot read more than max_seq_length tokens, including 2 special ones.
        self.max_tokens = max(8, min(settings.chunk_tokens, embedder.max_seq_length - 2))

    async def chunk(self, parsed: ParsedText) -> list[ChunkSpan]:
        return await anyio.to_thread.run_sync(
            chunk_text, parsed, self._embedder.token_offsets, self.max_tokens, self._overlap
        )

    async def prepare(
        self, kb_id: str, draft: DocumentDraft, *, ingest_id: str | None = None
    ) -> PreparedDocument | Document:
        """The draft chunked and ready to write, or the document of the knowledge base that
        already has the same content. NotFound for an unknown knowledge base, InvalidRequest for
        a draft with nothing to index. With ``ingest_id`` the document takes the id of that
        background ingest, and its commit replaces the ingest's row."""
        text = require_text(draft)
        digest = content_hash(text)
        async with self._sessions() as session:
            if await session.get(KnowledgeBase, kb_id) is None:
                raise NotFound(f"knowledge base {kb_id!r} not found")
            existing = await repo.document_by_hash(session, kb_id, digest)
            if existing is not None:
                return existing
        spans = await self.chunk(draft.parsed)
        if not spans:
            raise InvalidRequest("document has no text that can be indexed")
        document = Document(
            id=ingest_id or new_id(),
            kb_id=kb_id,
            title=draft.title[:512],
            source=draft.source,
            content_hash=digest,
            media_type=draft.parsed.media_type,
            text=text,
            meta=dict(draft.meta),
            chunk_count=len(spans),
        )
        chunk_ids = [new_id() for _ in spans]
        return PreparedDocument(document, spans, chunk_ids, from_ingest=ingest_id is not None)
