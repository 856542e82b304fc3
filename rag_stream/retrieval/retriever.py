"""Search a knowledge base: encode the query (dense and BM25, as the mode needs), search the
vector store, join the live chunk rows from SQL.

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
from rag_stream.retrieval.sparse import SparseEncoder
from rag_stream.retrieval.vector_store import VectorHit, VectorQuery, VectorStore
from rag_stream.schemas.events import CitationBody
from rag_stream.schemas.kbs import MetaValue, SearchMode
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

    def cited_as(self, n: int) -> CitationBody:
        """This hit as source ``[n]`` of an answer or a job section."""
        return CitationBody(
            n=n,
            chunk_id=self.chunk_id,
            document_id=self.document_id,
            title=self.title,
            heading=self.heading,
            snippet=self.text,
            offsets=(self.start, self.end),
            score=self.score,
        )


class Retriever:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        vectors: VectorStore,
        embedder: Embedder,
        *,
        sparse: SparseEncoder,
    ) -> None:
        self._sessions = sessions
        self._vectors = vectors
        self._embedder = embedder
        self._sparse = sparse

    async def kb_id(self, kb_ref: str, *, tenant: str) -> str:
        """The id of the tenant's knowledge base named (or with the id) ``kb_ref``; 404 if
        none."""
        async with self._sessions() as session:
            return (await resolve_kb(session, kb_ref, tenant=tenant)).id

    async def search(
        self,
        kb_id: str,
        query: str,
        top_k: int,
        *,
        meta_filter: Mapping[str, MetaValue] | None = None,
        score_threshold: float | None = None,
        mmr: bool = False,
        mode: SearchMode = "hybrid",
    ) -> list[SearchHit]:
        """Best hits first. ``meta_filter`` matches document metadata, every key (a list means
        any of; see ``VectorStore.search``); ``score_threshold`` is a minimum cosine
        similarity under the embedder, in every mode; ``mmr`` reorders candidates for diversity
        (scores stay what ranked them). A query of stop words only has no BM25 terms: hybrid
        then searches dense alone, and sparse finds nothing."""
        if top_k <= 0 or not query.strip():
            return []
        vector_query = await self._encode(query, mode, need_dense=score_threshold is not None)
        if vector_query is None:
            return []
        limit = min(_MAX_CANDIDATES, _OVERSAMPLE * top_k + _OVERSAMPLE_EXTRA)
        while True:
            hits = await self._vectors.search(
                kb_id,
                vector_query,
                limit,
                meta_filter=meta_filter,
                score_threshold=score_threshold,
                with_vectors=mmr,
            )
            async with self._sessions() as session:
                rows = await live_chunks(session, kb_id, [h.chunk_id for h in hits])
            # Equal scores are common in hybrid mode (RRF fuses ranks: 1st+2nd ties 2nd+1st),
            # and the store returns them in no fixed order (it differed with and without
            # vectors). Ties go by chunk id, so one question always gets the same sources in the
            # same order: a takeover that searches again cites what the first run would have.
            live = sorted(
                (h for h in hits if h.chunk_id in rows), key=lambda h: (-h.score, h.chunk_id)
            )
            exhausted = len(hits) < limit or limit >= _MAX_CANDIDATES
            if len(live) >= top_k or exhausted:
                break
            limit = min(_MAX_CANDIDATES, limit * 2)
        if mmr:
            live = _diversify(live, top_k, relative=vector_query.mode != "dense")
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

    async def _encode(self, query: str, mode: SearchMode, need_dense: bool) -> VectorQuery | None:
        sparse = None
        if mode != "dense":
            sparse = self._sparse.encode_query(query)  # microseconds: no thread needed
            if not sparse:
                if mode == "sparse":
                    return None
                mode, sparse = "dense", None
        dense = None
        if mode != "sparse" or need_dense:
            dense = (await self._embedder.embed([query]))[0]
        return VectorQuery(mode, dense, sparse)


def _diversify(hits: list[VectorHit], top_k: int, relative: bool) -> list[VectorHit]:
    """MMR over the candidates. Its relevance is the cosine in dense mode; fused and BM25
    scores are on other scales, so there each is taken relative to the best (1.0 for the top
    hit), which keeps relevance and the similarity penalty comparable."""
    with_vectors = [h for h in hits if h.vector is not None]
    if len(with_vectors) != len(hits) or len(hits) <= 1:
        return hits
    matrix = np.asarray([h.vector for h in hits], dtype=np.float32)
    relevance = [h.score for h in hits]
    if relative and relevance[0] > 0:
        relevance = [r / relevance[0] for r in relevance]
    order = mmr_order(relevance, matrix, top_k, MMR_DIVERSITY)
    return [hits[i] for i in order]
