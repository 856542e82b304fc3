"""In-process ingestion stack on the real stores: SQLite or PostgreSQL (migrated with Alembic),
a vector store (qdrant-edge or qdrant-client's local mode in a temporary folder, and a Qdrant
server when ``RAG_STREAM_QDRANT_URL`` names one), and the real sentence-transformers embedder and
BM25 encoder.

On a server each test has a collection of its own, deleted afterwards, so runs sharing the
server never see each other's points. tests/conftest.py moves the variable to
``TEST_QDRANT_URL``: the run's other settings and server processes keep their embedded store.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from qdrant_client import AsyncQdrantClient
from qdrant_client import models as qm
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from rag_stream.errors import VectorStoreUnavailable
from rag_stream.ingest.service import Ingestor
from rag_stream.retrieval.edge_bm25 import EdgeBm25
from rag_stream.retrieval.edge_store import EdgeVectorStore
from rag_stream.retrieval.embedder import LoadedEmbedder, load_embedder
from rag_stream.retrieval.qdrant_store import QdrantVectorStore
from rag_stream.retrieval.retriever import Retriever
from rag_stream.retrieval.vector_store import VectorStore
from rag_stream.settings import IngestSettings
from rag_stream.store.db import create_db
from rag_stream.store.models import Chunk, Document, KnowledgeBase
from tests.support.pg import postgres_database as fresh_database
from tests.support.pg import sqlite_at_head

SMALL_CHUNKS = IngestSettings(chunk_tokens=64, chunk_overlap=8)
QDRANT_URL = os.environ.get("TEST_QDRANT_URL")
BACKENDS = ["edge", "local", *(["server"] if QDRANT_URL else [])]
# Small, so that tests write past it and search, replace and delete over indexed segments too.
EDGE_OPTIMIZE_AFTER = 40


@dataclass
class Stack:
    db_engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    vectors: EdgeVectorStore | QdrantVectorStore
    embedder: LoadedEmbedder
    sparse: EdgeBm25
    ingestor: Ingestor
    retriever: Retriever
    backend: str

    def another_ingestor(self, vectors: VectorStore | None = None) -> Ingestor:
        """A second ingestor on the same stores with its own in-process locks, as a second
        server process would have; ``vectors`` wraps ``self.vectors`` to inject faults."""
        return Ingestor(
            self.sessions, vectors or self.vectors, self.embedder, SMALL_CHUNKS, sparse=self.sparse
        )

    async def new_kb(self, name: str | None = None) -> str:
        async with self.sessions() as session:
            kb = KnowledgeBase(name=name or f"kb-{uuid.uuid4().hex[:8]}")
            session.add(kb)
            await session.commit()
            return kb.id

    async def point_count(self, kb_id: str) -> int:
        if isinstance(self.vectors, EdgeVectorStore):
            return await self.vectors.count(kb_id)
        flt = qm.Filter(must=[qm.FieldCondition(key="kb_id", match=qm.MatchValue(value=kb_id))])
        counted = await self.vectors.client.count(
            self.vectors.collection, count_filter=flt, exact=True
        )
        return counted.count

    async def point_ids(self, kb_id: str) -> set[str]:
        if isinstance(self.vectors, EdgeVectorStore):
            return await self.vectors.point_ids(kb_id)
        flt = qm.Filter(must=[qm.FieldCondition(key="kb_id", match=qm.MatchValue(value=kb_id))])
        points, _ = await self.vectors.client.scroll(
            self.vectors.collection, scroll_filter=flt, limit=10_000
        )
        return {uuid.UUID(str(p.id)).hex for p in points}

    async def row_counts(self, kb_id: str) -> tuple[int, int]:
        async with self.sessions() as session:
            docs = await session.scalar(
                select(func.count(Document.id)).where(Document.kb_id == kb_id)
            )
            chunks = await session.scalar(select(func.count(Chunk.id)).where(Chunk.kb_id == kb_id))
        return int(docs or 0), int(chunks or 0)

    async def chunk_row_ids(self, kb_id: str) -> set[str]:
        async with self.sessions() as session:
            return set(await session.scalars(select(Chunk.id).where(Chunk.kb_id == kb_id)))


def open_vectors(backend: str, folder: Path) -> EdgeVectorStore | QdrantVectorStore:
    if backend == "edge":
        return EdgeVectorStore(folder, optimize_after_points=EDGE_OPTIMIZE_AFTER, optimize_idle_s=0)
    if backend == "server":
        assert QDRANT_URL, "the server backend needs RAG_STREAM_QDRANT_URL"
        client = AsyncQdrantClient(url=QDRANT_URL, timeout=10)
        return QdrantVectorStore(client, collection=f"rag_stream_test_{uuid.uuid4().hex}")
    return QdrantVectorStore(AsyncQdrantClient(path=str(folder)))


async def open_stack(
    db_url: str, folder: Path, embedder: LoadedEmbedder, backend: str = "edge"
) -> Stack:
    vectors = open_vectors(backend, folder)
    unreachable = None
    try:
        await vectors.ensure(embedder.dimension)
    except VectorStoreUnavailable as exc:
        await vectors.close()
        if backend != "server":
            raise
        unreachable = exc.message
    if unreachable:  # an error, never a skip: the run asked for the server
        pytest.fail(f"RAG_STREAM_QDRANT_URL={QDRANT_URL}: {unreachable}", pytrace=False)
    db_engine, sessions = create_db(db_url)
    sparse = EdgeBm25()
    return Stack(
        db_engine,
        sessions,
        vectors,
        embedder,
        sparse,
        Ingestor(sessions, vectors, embedder, SMALL_CHUNKS, sparse=sparse),
        Retriever(sessions, vectors, embedder, sparse=sparse),
        backend,
    )


async def close_stack(stack: Stack) -> None:
    vectors = stack.vectors
    try:
        if stack.backend == "server" and isinstance(vectors, QdrantVectorStore):
            await vectors.client.delete_collection(vectors.collection)
    finally:
        await vectors.close()
        await stack.db_engine.dispose()


# Fixtures, imported by the knowledge-base test modules.


@pytest.fixture(scope="session")
async def embedder(embedder_path: Path) -> LoadedEmbedder:
    # The service's default backend (Settings.embedder_backend).
    return await load_embedder(str(embedder_path), backend="onnx")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database at the schema's head: an SQLite file, or a database on the real PostgreSQL,
    each a copy of one migrated once per run (tests/support/pg.py)."""
    if request.param == "sqlite":
        path = tmp_path / "db.sqlite"
        shutil.copyfile(sqlite_at_head(), path)
        yield f"sqlite+aiosqlite:///{path}"
        return
    databases = fresh_database("rag_stream_kb", migrated=True)
    yield next(databases)
    databases.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The vector store: qdrant-edge (the default), qdrant-client's local mode, or the Qdrant
    server at RAG_STREAM_QDRANT_URL when it is set."""
    return str(request.param)


@pytest.fixture
async def stack(
    db_url: str, backend: str, tmp_path: Path, embedder: LoadedEmbedder
) -> AsyncIterator[Stack]:
    opened = await open_stack(db_url, tmp_path / "vectors", embedder, backend)
    try:
        yield opened
    finally:
        await close_stack(opened)
