"""Search a knowledge base: embed the query, search Qdrant, join the live chunk rows from SQL.

INTERFACE CONTRACT (used by the answers pipeline): ``Retriever.search`` returns hits best first,
each carrying everything a citation needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.mmr import mmr_order
from rag_stream.retrieval.vector_store import VectorHit, VectorStore
from rag_stream.schemas.kbs import MetaValue
from rag_stream.store.repositories import live_chunks, resolve_kb

# Qdrant may still hold vectors of a version being replaced (or of a failed ingestion being
# cleaned up); those hits are dropped, so ask for more than top_k.
_OVERSAMPLE = 3
_OVERSAMPLE_EXTRA = 10
_MAX_CANDIDATES = 1000
MMR_DIVERSITY = 0.5


@dataclass(frozen=True)
class SearchHit:
    chunk_id: str
    document_id: str
    title: str
    heading: str | None
    text: str
    start: int  # character offsets of the chunk in the document's text
    end: int
    score: float


class Retriever:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        vectors: VectorStore,
        embedder: Embedder,
    ) -> None:
        self._sessions = sessions
        self._vectors = vectors
        self._embedder = embedder

    async def kb_id(self, kb_ref: str) -> str:
        """The id of the knowledge base named (or with the id) ``kb_ref``; 404 if none."""
        async with self._sessions() as session:
            return (await resolve_kb(session, kb_ref)).id

    async def search(
        self,
        kb_id: str,
        query: str,
        top_k: int,
        *,
        meta_filter: Mapping[str, MetaValue] | None = None,
        score_threshold: float | None = None,
        mmr: bool = False,
    ) -> list[SearchHit]:
        """Best hits first. ``meta_filter`` matches document metadata, every key (a list means
        any of; see ``VectorStore.search``); ``mmr`` reorders candidates for diversity (scores
        stay the query similarity)."""
        if top_k <= 0 or not query.strip():
            return []
        query_vector = (await self._embedder.embed([query]))[0]
        limit = min(_MAX_CANDIDATES, _OVERSAMPLE * top_k + _OVERSAMPLE_EXTRA)
        while True:
            hits = await self._vectors.search(
                kb_id,
                query_vector,
                limit,
                meta_filter=meta_filter,
                score_threshold=score_threshold,
                with_vectors=mmr,
            )
            async with self._sessions() as session:
                rows = await live_chunks(session, kb_id, [h.chunk_id for h in hits])
            live = [h for h in hits if h.chunk_id in rows]
            exhausted = len(hits) < limit or limit >= _MAX_CANDIDATES
            if len(live) >= top_k or exhausted:
                break
            limit = min(_MAX_CANDIDATES, limit * 2)
        if mmr:
            live = _diversify(live, top_k)
        results = []
        for hit in live[:top_k]:
            chunk, title = rows[hit.chunk_id]
            results.append(
                SearchHit(
                    chunk_id=chunk.id,
                    document_id=chunk.document_id,
                    title=title,
                    heading=chunk.heading,
                    text=chunk.text,
                    start=chunk.start,
                    end=chunk.end,
                    score=hit.score,
                )
            )
        return results


def _diversify(hits: list[VectorHit], top_k: int) -> list[VectorHit]:
    with_vectors = [h for h in hits if h.vector is not None]
    if len(with_vectors) != len(hits) or len(hits) <= 1:
        return hits
    matrix = np.asarray([h.vector for h in hits], dtype=np.float32)
    order = mmr_order([h.score for h in hits], matrix, top_k, MMR_DIVERSITY)
    return [hits[i] for i in order]
