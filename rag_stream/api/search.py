"""POST /v1/kbs/{kb}/search."""

from __future__ import annotations

import time

from fastapi import APIRouter

from rag_stream.api.deps import RetrieverDep, TenantDep
from rag_stream.schemas.kbs import SearchRequest, SearchResponse, SearchResult

router = APIRouter(prefix="/v1/kbs", tags=["search"])


@router.post("/{kb}/search")
async def search(
    kb: str, body: SearchRequest, retriever: RetrieverDep, tenant: TenantDep
) -> SearchResponse:
    began = time.perf_counter()
    hits = await retriever.search(
        await retriever.kb_id(kb, tenant=tenant),
        body.query,
        body.top_k,
        meta_filter=body.filter,
        score_threshold=body.score_threshold,
        mmr=body.mmr,
        mode=body.mode,
    )
    return SearchResponse(
        results=[
            SearchResult(
                chunk_id=h.chunk_id,
                document_id=h.document_id,
                title=h.title,
                heading=h.heading,
                text=h.text,
                start=h.start,
                end=h.end,
                score=h.score,
            )
            for h in hits
        ],
        took_ms=round((time.perf_counter() - began) * 1000, 2),
    )
