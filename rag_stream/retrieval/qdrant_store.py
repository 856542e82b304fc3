"""Chunk vectors through qdrant-client: a Qdrant server (``qdrant_url``) or local mode (a folder;
``vector_store.backend: local``), which speaks the same API. The layout is in ``vector_store``.

Collections made before hybrid search (``chunks``: one unnamed dense vector, no BM25) are
not used: ``legacy_collection_exists`` tells preflight, and ``rag-stream reindex`` moves them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
from qdrant_client import AsyncQdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from rag_stream.errors import VectorStoreUnavailable
from rag_stream.retrieval.collections import COLLECTION, LEGACY_COLLECTION
from rag_stream.retrieval.filters import AnyKeyword, Condition, Exact, meta_conditions
from rag_stream.retrieval.sparse import SparseVector
from rag_stream.retrieval.vector_store import (
    DENSE,
    RRF_K,
    SPARSE,
    VectorHit,
    VectorPoint,
    VectorQuery,
    chunk_id_of,
    cosine_at_least,
    point_id,
)
from rag_stream.schemas.kbs import MetaValue

log = logging.getLogger(__name__)


class QdrantVectorStore:
    def __init__(self, client: AsyncQdrantClient, collection: str = COLLECTION) -> None:
        self._client = client
        self._collection = collection  # another name: test runs sharing one server

    @property
    def client(self) -> AsyncQdrantClient:
        return self._client

    @property
    def collection(self) -> str:
        return self._collection

    async def ensure(self, dimension: int) -> None:
        with _reaching("setup"):
            if await self._client.collection_exists(self._collection):
                return
            await self._client.create_collection(
                self._collection,
                vectors_config={
                    DENSE: qm.VectorParams(size=dimension, distance=qm.Distance.COSINE)
                },
                sparse_vectors_config={SPARSE: qm.SparseVectorParams(modifier=qm.Modifier.IDF)},
            )
            for key in ("kb_id", "document_id"):
                await self._client.create_payload_index(
                    self._collection, key, field_schema=qm.PayloadSchemaType.KEYWORD
                )

    async def legacy_collection_exists(self) -> bool:
        with _reaching("setup"):
            return await self._client.collection_exists(LEGACY_COLLECTION)

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        if not points:
            return
        structs = [
            qm.PointStruct(
                id=point_id(p.chunk_id),
                vector={DENSE: [float(x) for x in p.vector], SPARSE: _sparse(p.sparse)},
                payload={"kb_id": p.kb_id, "document_id": p.document_id, "meta": dict(p.meta)},
            )
            for p in points
        ]
        with _reaching("upsert"):
            await self._client.upsert(self._collection, points=structs, wait=True)

    async def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        if not chunk_ids:
            return
        selector = qm.PointIdsList(points=[point_id(c) for c in chunk_ids])
        with _reaching("delete"):
            await self._client.delete(self._collection, points_selector=selector, wait=True)

    async def delete_kb(self, kb_id: str) -> None:
        selector = qm.FilterSelector(filter=qm.Filter(must=[_kb_condition(kb_id)]))
        with _reaching("delete"):
            await self._client.delete(self._collection, points_selector=selector, wait=True)

    async def search(
        self,
        kb_id: str,
        query: VectorQuery,
        limit: int,
        meta_filter: Mapping[str, MetaValue] | None = None,
        score_threshold: float | None = None,
        with_vectors: bool = False,
    ) -> list[VectorHit]:
        # Built before the call: a filter Qdrant's models refuse is a bug or bad input, not an
        # outage, and must not come back as a 503.
        groups = meta_conditions(meta_filter)
        if groups is None:
            return []
        kb = qm.Filter(must=[_kb_condition(kb_id)])
        must: list[qm.Condition] = [_kb_condition(kb_id), *map(_group, groups)]
        # BM25's IDF over this knowledge base, not every tenant's chunks.
        params = qm.SearchParams(idf=qm.IdfCorpusParams(corpus=kb))
        dense = [float(x) for x in query.dense] if query.dense is not None else None
        fetch_vectors = with_vectors or (score_threshold is not None and query.mode != "dense")
        prefetch: list[qm.Prefetch] | None = None
        if query.mode == "dense":
            assert dense is not None
            q: Any = qm.NearestQuery(nearest=dense)
            using: str | None = DENSE
            threshold = score_threshold
        elif query.mode == "sparse":
            assert query.sparse is not None
            q, using, threshold = qm.NearestQuery(nearest=_sparse(query.sparse)), SPARSE, None
        else:
            assert dense is not None and query.sparse is not None
            depth = 2 * limit  # a chunk ranked lower in both lists can beat one found once
            prefetch = [
                qm.Prefetch(
                    query=dense,
                    using=DENSE,
                    filter=qm.Filter(must=must),
                    limit=depth,
                    score_threshold=score_threshold,
                ),
                qm.Prefetch(
                    query=_sparse(query.sparse),
                    using=SPARSE,
                    filter=qm.Filter(must=must),
                    limit=depth,
                    params=params,
                ),
            ]
            q, using, threshold = qm.RrfQuery(rrf=qm.Rrf(k=RRF_K)), None, None
        with _reaching("search"):
            response = await self._client.query_points(
                self._collection,
                prefetch=prefetch,
                query=q,
                using=using,
                query_filter=qm.Filter(must=must),
                search_params=params,
                limit=limit,
                score_threshold=threshold,
                with_payload=False,
                with_vectors=[DENSE] if fetch_vectors else False,
            )
        hits = []
        for point in response.points:
            vec = point.vector.get(DENSE) if isinstance(point.vector, dict) else None
            hits.append(VectorHit(chunk_id_of(point.id), float(point.score), vec))  # type: ignore[arg-type]
        if query.mode != "dense":
            hits = cosine_at_least(hits, query.dense, score_threshold)
        if not with_vectors:
            hits = [VectorHit(h.chunk_id, h.score, None) for h in hits]
        return hits

    async def optimize(self) -> None:
        """A server indexes in the background and local mode has no indexes: nothing to do."""

    async def ping(self) -> None:
        try:
            await self._client.get_collections()
        except Exception as exc:
            # Readiness: whatever the failure, the store is not usable.
            log.warning("vector store check failed", exc_info=exc)
            reason = _outage(exc) or "unexpected error (see the server log)"
            raise VectorStoreUnavailable(f"vector store check failed: {reason}") from exc

    async def close(self) -> None:
        await self._client.close()


def _sparse(vector: SparseVector) -> qm.SparseVector:
    return qm.SparseVector(indices=vector.indices, values=vector.values)


def _outage(exc: BaseException) -> str | None:
    """A short reason when ``exc`` means Qdrant could not be reached or is overloaded; None
    when it is anything else. Never the exception's text: it may hold URLs, paths, payloads."""
    if isinstance(exc, ResponseHandlingException):  # how qdrant-client wraps transport errors
        exc = exc.source
    if isinstance(exc, UnexpectedResponse):
        status = exc.status_code or 0
        return f"it answered HTTP {status}" if status >= 500 or status == 429 else None
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return "timed out"
    if isinstance(exc, httpx.TransportError | ConnectionError):
        return "cannot connect"
    return None


@contextmanager
def _reaching(action: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        reason = _outage(exc)
        if reason is None:
            raise
        log.warning("vector store %s failed", action, exc_info=exc)
        raise VectorStoreUnavailable(f"vector store {action} failed: {reason}") from exc


def _kb_condition(kb_id: str) -> qm.FieldCondition:
    return qm.FieldCondition(key="kb_id", match=qm.MatchValue(value=kb_id))


def _condition(c: Condition) -> qm.FieldCondition:
    if isinstance(c, AnyKeyword):
        return qm.FieldCondition(key=c.key, match=qm.MatchAny(any=c.values))
    if isinstance(c, Exact):
        return qm.FieldCondition(key=c.key, match=qm.MatchValue(value=c.value))
    return qm.FieldCondition(key=c.key, range=qm.Range(gte=c.value, lte=c.value))


def _group(group: list[Condition]) -> qm.Condition:
    if len(group) == 1:
        return _condition(group[0])
    return qm.Filter(should=[_condition(c) for c in group])
