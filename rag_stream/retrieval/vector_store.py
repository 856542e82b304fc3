"""Chunk vectors in Qdrant: local mode (on-disk path) by default, a server by URL.

All knowledge bases share one collection; every point carries ``kb_id``, ``document_id`` and the
document's metadata (under ``meta``) in its payload so searches filter by kb and metadata. Point
ids are the chunk ids, so SQL rows and vectors join one to one.

Only failures to reach Qdrant (no connection, a timeout, a 5xx or 429 answer) become
``VectorStoreUnavailable``, with a short reason; the details go to the log. Anything else (a
request Qdrant refuses, a bug) is raised as it is and answered as an internal error.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import numpy as np
from qdrant_client import AsyncQdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from rag_stream.errors import VectorStoreUnavailable
from rag_stream.schemas.kbs import MetaValue
from rag_stream.settings import Settings

COLLECTION = "chunks"
log = logging.getLogger(__name__)


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
        meta_filter: Mapping[str, MetaValue] | None = None,
        score_threshold: float | None = None,
        with_vectors: bool = False,
    ) -> list[VectorHit]:
        """Nearest points of ``kb_id`` whose metadata matches every key of ``meta_filter``: a
        value matches equal values of the same JSON type (numbers by value, so 2 is 2.0; true
        is not 1), a list any of its values (none, if it is empty), and a document's list
        matches if any of its elements does."""
        ...

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
        with _reaching("setup"):
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
        with _reaching("upsert"):
            await self._client.upsert(COLLECTION, points=structs, wait=True)

    async def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        if not chunk_ids:
            return
        selector = qm.PointIdsList(points=[_point_id(c) for c in chunk_ids])
        with _reaching("delete"):
            await self._client.delete(COLLECTION, points_selector=selector, wait=True)

    async def delete_kb(self, kb_id: str) -> None:
        selector = qm.FilterSelector(filter=qm.Filter(must=[_kb_condition(kb_id)]))
        with _reaching("delete"):
            await self._client.delete(COLLECTION, points_selector=selector, wait=True)

    async def search(
        self,
        kb_id: str,
        vector: Sequence[float] | np.ndarray[Any, Any],
        limit: int,
        meta_filter: Mapping[str, MetaValue] | None = None,
        score_threshold: float | None = None,
        with_vectors: bool = False,
    ) -> list[VectorHit]:
        # Built before the call: a filter Qdrant's models refuse is a bug or bad input, not an
        # outage, and must not come back as a 503.
        must: list[qm.Condition] = [_kb_condition(kb_id)]
        for key, value in (meta_filter or {}).items():
            condition = _meta_condition(f"meta.{key}", value)
            if condition is None:
                return []
            must.append(condition)
        query = [float(x) for x in vector]
        with _reaching("search"):
            response = await self._client.query_points(
                COLLECTION,
                query=query,
                query_filter=qm.Filter(must=must),
                limit=limit,
                score_threshold=score_threshold,
                with_payload=False,
                with_vectors=with_vectors,
            )
        hits = []
        for point in response.points:
            vec = point.vector if isinstance(point.vector, list) else None
            hits.append(VectorHit(_chunk_id(point.id), float(point.score), vec))  # type: ignore[arg-type]
        return hits

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


# Integers below 2**53 in size are exact as floats: a range [v, v] matches them (and equal
# floats) and nothing else. A larger one is matched as an integer, exactly.
_EXACT_FLOAT_INT = 2**53


def _meta_condition(key: str, value: MetaValue) -> qm.Condition | None:
    """The condition for one filter key: equal to the value, or to any value of a list.

    Qdrant matches a point whose payload value is a list if any element matches. Types stay
    apart as in JSON: "2" is not 2, and true is not 1 (Qdrant's exact match keeps booleans,
    integers and strings apart, and a range never matches a boolean). Numbers compare by value,
    so 2 matches 2.0: JSON does not tell them apart, so clients may send either. None when
    nothing can match (an empty list).
    """
    values = value if isinstance(value, list) else [value]
    strings = [v for v in values if isinstance(v, str)]
    conditions: list[qm.Condition] = []
    if strings:  # one MatchAny for all: the common case, and what a keyword index serves
        conditions.append(qm.FieldCondition(key=key, match=qm.MatchAny(any=strings)))
    for v in values:
        if isinstance(v, str):
            continue
        if isinstance(v, bool) or (isinstance(v, int) and abs(v) >= _EXACT_FLOAT_INT):
            conditions.append(qm.FieldCondition(key=key, match=qm.MatchValue(value=v)))
        elif isinstance(v, int | float):  # MatchValue takes no floats; an int one misses 2.0
            conditions.append(qm.FieldCondition(key=key, range=qm.Range(gte=v, lte=v)))
        else:  # a caller that skipped the schema; an open range would match every number
            raise TypeError(f"cannot filter {key} on a {type(v).__name__}")
    if len(conditions) <= 1:
        return conditions[0] if conditions else None
    return qm.Filter(should=conditions)
