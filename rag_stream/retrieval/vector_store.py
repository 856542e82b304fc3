"""Chunk vectors in Qdrant: local mode (on-disk path) by default, a server by URL.

All knowledge bases share one collection; every point carries ``kb_id``, ``document_id`` and the
document's metadata (under ``meta``) in its payload so searches filter by kb and metadata. Point
ids are the chunk ids, so SQL rows and vectors join one to one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from qdrant_client import AsyncQdrantClient
from qdrant_client import models as qm

from rag_stream.errors import VectorStoreUnavailable
from rag_stream.settings import Settings

COLLECTION = "chunks"


@dataclass(frozen=True)
class VectorPoint:
    chunk_id: str
    vector: Sequence[float] | np.ndarray[Any, Any]
    kb_id: str
    document_id: str
    meta: Mapping[str, Any]


@dataclass(frozen=True)
class VectorHit:
    chunk_id: str
    score: float
    vector: list[float] | None


class VectorStore(Protocol):
    async def ensure(self, dimension: int) -> None: ...

    async def upsert(self, points: Sequence[VectorPoint]) -> None: ...

    async def delete_chunks(self, chunk_ids: Sequence[str]) -> None: ...

    async def delete_kb(self, kb_id: str) -> None: ...

    async def search(
        self,
        kb_id: str,
        vector: Sequence[float] | np.ndarray[Any, Any],
        limit: int,
        meta_filter: Mapping[str, Any] | None = None,
        score_threshold: float | None = None,
        with_vectors: bool = False,
    ) -> list[VectorHit]: ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


def _point_id(chunk_id: str) -> str:
    return str(uuid.UUID(hex=chunk_id))


def _chunk_id(point_id: object) -> str:
    return uuid.UUID(str(point_id)).hex


class QdrantVectorStore:
    def __init__(self, client: AsyncQdrantClient) -> None:
        self._client = client

    @classmethod
    def from_settings(cls, settings: Settings) -> QdrantVectorStore:
        if settings.qdrant_url:
            return cls(AsyncQdrantClient(url=settings.qdrant_url, timeout=10))
        settings.qdrant_path.mkdir(parents=True, exist_ok=True)
        return cls(AsyncQdrantClient(path=str(settings.qdrant_path)))

    async def ensure(self, dimension: int) -> None:
        try:
            if await self._client.collection_exists(COLLECTION):
                return
            await self._client.create_collection(
                COLLECTION,
                vectors_config=qm.VectorParams(size=dimension, distance=qm.Distance.COSINE),
            )
            for key in ("kb_id", "document_id"):
                await self._client.create_payload_index(
                    COLLECTION, key, field_schema=qm.PayloadSchemaType.KEYWORD
                )
        except Exception as exc:
            raise VectorStoreUnavailable(f"vector store: {exc}") from exc

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        if not points:
            return
        structs = [
            qm.PointStruct(
                id=_point_id(p.chunk_id),
                vector=[float(x) for x in p.vector],
                payload={"kb_id": p.kb_id, "document_id": p.document_id, "meta": dict(p.meta)},
            )
            for p in points
        ]
        try:
            await self._client.upsert(COLLECTION, points=structs, wait=True)
        except Exception as exc:
            raise VectorStoreUnavailable(f"vector store upsert failed: {exc}") from exc

    async def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        if not chunk_ids:
            return
        try:
            await self._client.delete(
                COLLECTION,
                points_selector=qm.PointIdsList(points=[_point_id(c) for c in chunk_ids]),
                wait=True,
            )
        except Exception as exc:
            raise VectorStoreUnavailable(f"vector store delete failed: {exc}") from exc

    async def delete_kb(self, kb_id: str) -> None:
        selector = qm.FilterSelector(filter=_kb_filter(kb_id, None))
        try:
            await self._client.delete(COLLECTION, points_selector=selector, wait=True)
        except Exception as exc:
            raise VectorStoreUnavailable(f"vector store delete failed: {exc}") from exc

    async def search(
        self,
        kb_id: str,
        vector: Sequence[float] | np.ndarray[Any, Any],
        limit: int,
        meta_filter: Mapping[str, Any] | None = None,
        score_threshold: float | None = None,
        with_vectors: bool = False,
    ) -> list[VectorHit]:
        try:
            response = await self._client.query_points(
                COLLECTION,
                query=[float(x) for x in vector],
                query_filter=_kb_filter(kb_id, meta_filter),
                limit=limit,
                score_threshold=score_threshold,
                with_payload=False,
                with_vectors=with_vectors,
            )
        except Exception as exc:
            raise VectorStoreUnavailable(f"vector store search failed: {exc}") from exc
        hits = []
        for point in response.points:
            vec = point.vector if isinstance(point.vector, list) else None
            hits.append(VectorHit(_chunk_id(point.id), float(point.score), vec))  # type: ignore[arg-type]
        return hits

    async def ping(self) -> None:
        try:
            await self._client.get_collections()
        except Exception as exc:
            raise VectorStoreUnavailable(f"vector store: {exc}") from exc

    async def close(self) -> None:
        await self._client.close()


def _kb_filter(kb_id: str, meta_filter: Mapping[str, Any] | None) -> qm.Filter:
    must: list[qm.Condition] = [qm.FieldCondition(key="kb_id", match=qm.MatchValue(value=kb_id))]
    for key, value in (meta_filter or {}).items():
        if isinstance(value, list):
            match: qm.MatchAny | qm.MatchValue = qm.MatchAny(any=value)
        else:
            match = qm.MatchValue(value=value)
        must.append(qm.FieldCondition(key=f"meta.{key}", match=match))
    return qm.Filter(must=must)
