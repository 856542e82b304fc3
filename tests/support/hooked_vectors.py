"""A VectorStore that delegates to a real one and runs a test's hooks at the moments an
ingestion test needs to break or watch: right after an upsert (the vectors are written, the SQL
commit has not happened) and right before chunk vectors are deleted."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from rag_stream.retrieval.vector_store import VectorHit, VectorPoint, VectorQuery, VectorStore

Hook = Callable[[], Awaitable[None]]


async def _nothing() -> None:
    pass


class HookedVectorStore:
    def __init__(
        self,
        inner: VectorStore,
        after_upsert: Hook = _nothing,
        before_delete_chunks: Hook = _nothing,
    ) -> None:
        self._inner = inner
        self._after_upsert = after_upsert
        self._before_delete_chunks = before_delete_chunks

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        await self._inner.upsert(points)
        await self._after_upsert()

    async def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        await self._before_delete_chunks()
        await self._inner.delete_chunks(chunk_ids)

    async def ensure(self, dimension: int) -> None:
        await self._inner.ensure(dimension)

    async def delete_kb(self, kb_id: str) -> None:
        await self._inner.delete_kb(kb_id)

    async def search(
        self,
        kb_id: str,
        query: VectorQuery,
        limit: int,
        meta_filter: Mapping[str, Any] | None = None,
        score_threshold: float | None = None,
        with_vectors: bool = False,
    ) -> list[VectorHit]:
        return await self._inner.search(
            kb_id, query, limit, meta_filter, score_threshold, with_vectors
        )

    async def optimize(self) -> None:
        await self._inner.optimize()

    async def ping(self) -> None:
        await self._inner.ping()

    async def close(self) -> None:
        await self._inner.close()
