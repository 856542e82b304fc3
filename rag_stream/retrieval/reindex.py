"""Rebuild the vector store from the chunk rows in SQL (``rag-stream reindex``).

SQL holds every chunk's text, so the store can always be rebuilt: each chunk gets its BM25
vector from the text, and its dense vector copied from a store made before hybrid search (a
qdrant-client ``chunks`` collection, in ``data_dir/qdrant`` or on the server) when that one has
it at the embedder's dimension, or embedded again (``re_embed``, a changed embedder, no old
store). The old collection is deleted once the new store is complete; an interruption leaves
the old one in place, so running the command again starts over.

Targets:
- edge: a new shard is built beside the live one (``vectors.reindex``) and swapped in at the
  end; the live one is held open meanwhile, so a running server makes this fail at once;
- qdrant-client (local mode or server): the collection is dropped and filled again (searches
  in between find less).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import numpy as np
from qdrant_client import AsyncQdrantClient
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.retrieval.collections import COLLECTION, LEGACY_COLLECTION, legacy_local_store
from rag_stream.retrieval.edge_store import EdgeVectorStore
from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.qdrant_store import QdrantVectorStore
from rag_stream.retrieval.sparse import SparseEncoder
from rag_stream.retrieval.vector_store import VectorPoint, VectorStore, chunk_id_of, point_id
from rag_stream.store.models import Chunk, Document

PAGE = 512


@dataclass
class ReindexSummary:
    chunks: int = 0
    copied: int = 0  # dense vectors taken from the old store
    embedded: int = 0


class LegacyVectors:
    """Dense vectors of the old ``chunks`` collection, by chunk id."""

    def __init__(self, client: AsyncQdrantClient, owned: bool) -> None:
        self._client = client
        self._owned = owned  # opened here (the local folder beside an edge store)
        self.dimension: int | None = None

    @classmethod
    async def find(cls, client: AsyncQdrantClient, owned: bool) -> LegacyVectors | None:
        if not await client.collection_exists(LEGACY_COLLECTION):
            if owned:
                await client.close()
            return None
        legacy = cls(client, owned)
        info = await client.get_collection(LEGACY_COLLECTION)
        params: Any = info.config.params.vectors
        legacy.dimension = getattr(params, "size", None)
        return legacy

    async def dense(self, chunk_ids: Sequence[str]) -> dict[str, list[float]]:
        records = await self._client.retrieve(
            LEGACY_COLLECTION, ids=[point_id(c) for c in chunk_ids], with_vectors=True
        )
        found: dict[str, list[float]] = {}
        for r in records:
            if isinstance(r.vector, list):
                found[chunk_id_of(r.id)] = [float(cast(float, x)) for x in r.vector]
        return found

    async def drop(self) -> None:
        await self._client.delete_collection(LEGACY_COLLECTION)

    async def close(self) -> None:
        if self._owned:
            await self._client.close()


async def count_chunks(sessions: async_sessionmaker[AsyncSession]) -> int:
    async with sessions() as session:
        return int(await session.scalar(select(func.count(Chunk.id))) or 0)


async def _pages(
    sessions: async_sessionmaker[AsyncSession],
) -> AsyncIterator[list[tuple[str, str, str, str, dict[str, Any]]]]:
    """(chunk id, text, kb id, document id, metadata), PAGE rows at a time, by chunk id."""
    after = ""
    while True:
        async with sessions() as session:
            rows = (
                await session.execute(
                    select(Chunk.id, Chunk.text, Chunk.kb_id, Chunk.document_id, Document.meta)
                    .join(Document, Document.id == Chunk.document_id)
                    .where(Chunk.id > after)
                    .order_by(Chunk.id)
                    .limit(PAGE)
                )
            ).tuples()
            page = [(c, t, k, d, dict(m or {})) for c, t, k, d, m in rows]
        if not page:
            return
        yield page
        after = page[-1][0]


async def fill(
    sessions: async_sessionmaker[AsyncSession],
    target: VectorStore,
    embedder: Embedder,
    sparse: SparseEncoder,
    legacy: LegacyVectors | None,
    on_page: Callable[[int], object] = lambda n: None,
) -> ReindexSummary:
    """Write every chunk in SQL into ``target`` (already ensured), then optimize it."""
    summary = ReindexSummary()
    copy = legacy is not None and legacy.dimension == embedder.dimension
    async for page in _pages(sessions):
        ids = [row[0] for row in page]
        texts = [row[1] for row in page]
        dense: dict[str, Any] = await legacy.dense(ids) if copy and legacy else {}
        missing = [i for i, chunk_id in enumerate(ids) if chunk_id not in dense]
        if missing:
            vectors = await embedder.embed([texts[i] for i in missing])
            for i, vector in zip(missing, vectors, strict=True):
                dense[ids[i]] = vector
        terms = await anyio.to_thread.run_sync(sparse.encode_documents, texts)
        await target.upsert(
            [
                VectorPoint(chunk_id, np.asarray(dense[chunk_id]), kb, doc, meta, bm25)
                for (chunk_id, _, kb, doc, meta), bm25 in zip(page, terms, strict=True)
            ]
        )
        summary.chunks += len(page)
        summary.embedded += len(missing)
        summary.copied += len(page) - len(missing)
        on_page(len(page))
    await target.optimize()
    return summary


async def reindex_edge(
    path: Path,
    legacy_path: Path,
    sessions: async_sessionmaker[AsyncSession],
    embedder: Embedder,
    sparse: SparseEncoder,
    re_embed: bool,
    on_page: Callable[[int], object] = lambda n: None,
) -> ReindexSummary:
    live = EdgeVectorStore(path)  # held open: fails now if a server has it
    building = path.with_name(path.name + ".reindex")
    legacy = None
    try:
        if legacy_local_store(legacy_path) and not re_embed:
            legacy = await LegacyVectors.find(AsyncQdrantClient(path=str(legacy_path)), True)
        shutil.rmtree(building, ignore_errors=True)  # what an interrupted run left
        target = EdgeVectorStore(building, optimize_after_points=0, optimize_idle_s=0)
        try:
            await target.ensure(embedder.dimension)
            summary = await fill(sessions, target, embedder, sparse, legacy, on_page)
        finally:
            await target.close()
        await live.close()
        await anyio.to_thread.run_sync(_swap, building, path)
        if legacy_local_store(legacy_path):
            if legacy is None:
                legacy = await LegacyVectors.find(AsyncQdrantClient(path=str(legacy_path)), True)
            if legacy is not None:
                await legacy.drop()
        return summary
    finally:
        await live.close()
        if legacy is not None:
            await legacy.close()


def _swap(built: Path, live: Path) -> None:
    old = live.with_name(live.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if live.exists():
        live.rename(old)
    built.rename(live)
    shutil.rmtree(old, ignore_errors=True)


async def reindex_qdrant(
    store: QdrantVectorStore,
    sessions: async_sessionmaker[AsyncSession],
    embedder: Embedder,
    sparse: SparseEncoder,
    re_embed: bool,
    on_page: Callable[[int], object] = lambda n: None,
) -> ReindexSummary:
    client = store.client
    legacy = await LegacyVectors.find(client, owned=False)
    if await client.collection_exists(COLLECTION):
        await client.delete_collection(COLLECTION)
    await store.ensure(embedder.dimension)
    summary = await fill(sessions, store, embedder, sparse, None if re_embed else legacy, on_page)
    if legacy is not None:
        await legacy.drop()
    return summary
