"""The embedded store's upkeep: when qdrant-edge builds its indexes, and moving a store made
before hybrid search (qdrant-client local mode, dense only) with ``reindex``, which preflight
asks for."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from qdrant_client import AsyncQdrantClient
from qdrant_client import models as qm

from rag_stream.errors import ConfigError
from rag_stream.ingest.documents import DocumentDraft
from rag_stream.ingest.local import open_local_stack, reindex_store
from rag_stream.ingest.parsing import parse_plain
from rag_stream.preflight import check_vector_store
from rag_stream.retrieval.collections import COLLECTION
from rag_stream.retrieval.edge_store import EdgeVectorStore
from rag_stream.retrieval.sparse import SparseVector
from rag_stream.retrieval.vector_store import VectorPoint, VectorQuery
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.settings import Settings, load_settings
from rag_stream.store import repositories as repo
from rag_stream.store.db import upgrade
from rag_stream.store.models import KnowledgeBase
from tests.support.waiting import eventually

DIM = 8


def _points(kb: str, n: int) -> list[VectorPoint]:
    rows = []
    for i in range(n):
        vector = [0.0] * DIM
        vector[i % DIM] = 1.0
        terms = SparseVector([i % 5, 100 + i], [1.0, 1.0])
        rows.append(VectorPoint(uuid.uuid4().hex, vector, kb, "doc", {"i": i}, terms))
    return rows


async def test_edge_indexes_after_enough_writes_and_when_idle(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path / "v", optimize_after_points=50, optimize_idle_s=0.2)
    await store.ensure(DIM)
    try:
        points = _points("kb", 60)
        await store.upsert(points[:30])
        assert store.unindexed == 30  # below the threshold: searched as written
        query = VectorQuery("hybrid", [1.0] + [0.0] * (DIM - 1), SparseVector([0], [1.0]))
        before = await store.search("kb", query, 5)
        await store.upsert(points[30:])  # past it: indexed before the write returns
        assert store.unindexed == 0
        after = await store.search("kb", query, 5)
        assert {h.chunk_id for h in before} <= {p.chunk_id for p in points}
        assert after[0].chunk_id in {p.chunk_id for p in points}
        await store.delete_chunks([p.chunk_id for p in points[:10]])
        assert store.unindexed == 10

        async def indexed() -> bool:
            return store.unindexed == 0

        await eventually(indexed, "the optimize once writes paused for 0.2 s")
        assert await store.count("kb") == 50
    finally:
        await store.close()


async def test_a_shard_made_for_another_embedder_asks_for_reindex(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path / "v")
    await store.ensure(DIM)
    await store.close()
    again = EdgeVectorStore(tmp_path / "v")
    try:
        with pytest.raises(RuntimeError, match="run `rag-stream reindex`"):
            await again.ensure(2 * DIM)
    finally:
        await again.close()


# reindex, on a data dir that a version before hybrid search left behind


@pytest.fixture
def settings(tmp_path: Path, models_dir: Path) -> Settings:
    data = tmp_path / "data"
    data.mkdir()
    made = load_settings(profile="test", data_dir=data, models_dir=models_dir)
    upgrade(made.resolved_database_url)
    return made


async def _ingest(settings: Settings) -> tuple[str, set[str]]:
    async with open_local_stack(settings) as stack:
        async with stack.sessions() as session:
            kb = KnowledgeBase(name="kb")
            session.add(kb)
            await session.commit()
            kb_id = kb.id
        texts = {
            "Herons": "The grey heron spears fish.",
            "滚动更新": "滚动更新逐步替换旧版本的 Pod。",
        }
        ids: set[str] = set()
        for title, text in texts.items():
            result = await stack.ingestor.ingest(
                kb_id, DocumentDraft(title, parse_plain(text)), tenant=LOCAL_TENANT
            )
            async with stack.sessions() as session:
                ids |= set(await repo.chunk_ids(session, result.document.id))
    return kb_id, ids


async def _make_legacy(settings: Settings, ids: set[str], kb_id: str) -> None:
    """What the previous version stored: the ``chunks`` collection, one unnamed dense vector."""
    client = AsyncQdrantClient(path=str(settings.qdrant_path))
    await client.create_collection(
        "chunks", vectors_config=qm.VectorParams(size=384, distance=qm.Distance.COSINE)
    )
    points = [
        qm.PointStruct(
            id=str(uuid.UUID(hex=c)), vector=[1.0] + [0.0] * 383, payload={"kb_id": kb_id}
        )
        for c in ids
    ]
    await client.upsert("chunks", points=points)
    await client.close()


@pytest.mark.parametrize("backend", ["edge", "local"])
async def test_reindex_moves_an_old_store_and_preflight_asks_for_it(
    settings: Settings, backend: str
) -> None:
    settings = settings.model_copy(
        update={"vector_store": settings.vector_store.model_copy(update={"backend": backend})}
    )
    kb_id, ids = await _ingest(settings)
    if backend == "edge":  # the old version's store sits beside the new one
        await _make_legacy(settings, ids, kb_id)
    else:  # the old collection sits beside the new one, in the same folder
        await _make_legacy_local(settings, ids, kb_id)
    with pytest.raises(ConfigError, match=r"^.*run `rag-stream reindex`.*$"):
        check_vector_store(settings)
    with pytest.raises(ConfigError, match="rag-stream reindex"):
        async with open_local_stack(settings):
            pass

    summary = await reindex_store(settings, progress=False)
    assert summary.chunks == len(ids) and summary.copied == len(ids)
    check_vector_store(settings)  # the old store is gone: nothing to ask for
    async with open_local_stack(settings) as stack:
        hits = await stack.retriever.search(kb_id, "滚动更新 Pod", 2, mode="sparse")
        assert hits[0].title == "滚动更新"
    # a new embedder: everything embedded again, the store rebuilt
    again = await reindex_store(settings, re_embed=True, progress=False)
    assert again.embedded == len(ids) and again.copied == 0
    async with open_local_stack(settings) as stack:
        hits = await stack.retriever.search(kb_id, "which bird spears fish", 1, mode="dense")
        assert hits[0].title == "Herons"


async def _make_legacy_local(settings: Settings, ids: set[str], kb_id: str) -> None:
    await _make_legacy(settings, ids, kb_id)
    client = AsyncQdrantClient(path=str(settings.qdrant_path))
    assert await client.collection_exists(COLLECTION)  # the new one, written by _ingest
    await client.close()
