"""The stores and models the CLI needs, built in-process from settings (no server involved).

An embedded vector store (qdrant-edge, or qdrant-client's local mode) is locked by the process
that opens it, so this cannot run while a ``serve`` uses the same data dir; with
``RAG_STREAM_QDRANT_URL`` set both share the Qdrant server and that is fine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import ConfigError
from rag_stream.ingest.files import IngestSummary, collect_files, ensure_kb, ingest_files
from rag_stream.ingest.service import Ingestor
from rag_stream.ingest.writer import IngestResult
from rag_stream.retrieval.edge_store import StoreInUse
from rag_stream.retrieval.embedder import load_embedder
from rag_stream.retrieval.retriever import Retriever, SearchHit
from rag_stream.retrieval.stores import (
    edge_path,
    in_use,
    old_store,
    open_sparse_encoder,
    open_vector_store,
)
from rag_stream.retrieval.vector_store import VectorStore
from rag_stream.schemas.kbs import SearchMode
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.settings import Settings
from rag_stream.store.db import create_db
from rag_stream.store.repositories import resolve_kb

if TYPE_CHECKING:
    from rag_stream.retrieval.reindex import ReindexSummary


@dataclass(frozen=True)
class LocalStack:
    sessions: async_sessionmaker[AsyncSession]
    vectors: VectorStore
    ingestor: Ingestor
    retriever: Retriever


@asynccontextmanager
async def open_local_stack(settings: Settings) -> AsyncIterator[LocalStack]:
    message = old_store(settings)
    if message:
        raise ConfigError(message)
    vectors = open_vector_store(settings)
    db_engine, sessions = create_db(settings.resolved_database_url)
    try:
        embedder = await load_embedder(
            settings.resolved_embedder,
            batch_size=settings.ingest.embed_batch_size,
            backend=settings.embedder_backend,
        )
        sparse = open_sparse_encoder()
        await vectors.ensure(embedder.dimension)
        yield LocalStack(
            sessions,
            vectors,
            Ingestor(sessions, vectors, embedder, settings.ingest, sparse=sparse),
            Retriever(sessions, vectors, embedder, sparse=sparse),
        )
    finally:
        await vectors.close()
        await db_engine.dispose()


async def ingest_paths(
    settings: Settings,
    kb_name: str,
    paths: Sequence[Path],
    progress: bool = True,
    tenant: str = LOCAL_TENANT,
) -> tuple[IngestSummary, list[Path]]:
    """Ingest files and folders into the KB named ``kb_name`` (created if missing).
    Returns the summary and the files left out because of their type."""
    from tqdm import tqdm

    files, others = collect_files([p.expanduser() for p in paths])
    async with open_local_stack(settings) as stack:
        kb = await ensure_kb(stack.sessions, kb_name, tenant=tenant)
        with tqdm(total=len(files), unit="file", disable=not progress) as bar:

            def advance(path: Path, _result: IngestResult | None) -> None:
                bar.set_postfix_str(path.name[-40:], refresh=False)
                bar.update()

            def embedding(done: int, total: int) -> None:
                # a large file is one wave of minutes: the bar moves within it too
                bar.set_postfix_str(f"embedding {done}/{total} chunks")

            summary = await ingest_files(
                stack.ingestor,
                kb.id,
                files,
                source_for=lambda p: p.resolve().as_posix(),
                on_file=advance,
                on_chunks=embedding,
            )
        await stack.vectors.optimize()  # this process ends now: index what it wrote
    return summary, others


async def search_kb(
    settings: Settings,
    kb_ref: str,
    query: str,
    top_k: int,
    mmr: bool,
    tenant: str = LOCAL_TENANT,
    mode: SearchMode = "hybrid",
) -> list[SearchHit]:
    async with open_local_stack(settings) as stack:
        async with stack.sessions() as session:
            kb = await resolve_kb(session, kb_ref, tenant=tenant)
        return await stack.retriever.search(kb.id, query, top_k, mmr=mmr, mode=mode)


async def reindex_store(
    settings: Settings, re_embed: bool = False, progress: bool = True
) -> ReindexSummary:
    """Rebuild the configured vector store from SQL (see ``rag_stream.retrieval.reindex``)."""
    from tqdm import tqdm

    # imported here: the reindex imports qdrant-client (a second), which ingest and search
    # on the default store never need
    from rag_stream.retrieval.qdrant_store import QdrantVectorStore
    from rag_stream.retrieval.reindex import count_chunks, reindex_edge, reindex_qdrant

    db_engine, sessions = create_db(settings.resolved_database_url)
    try:
        embedder = await load_embedder(
            settings.resolved_embedder,
            batch_size=settings.ingest.embed_batch_size,
            backend=settings.embedder_backend,
        )
        sparse = open_sparse_encoder()
        total = await count_chunks(sessions)
        with tqdm(total=total, unit="chunk", disable=not progress) as bar:
            if not settings.qdrant_url and settings.vector_store.backend == "edge":
                try:
                    return await reindex_edge(
                        edge_path(settings),
                        settings.qdrant_path,
                        sessions,
                        embedder,
                        sparse,
                        re_embed,
                        bar.update,
                    )
                except StoreInUse:
                    raise in_use(edge_path(settings)) from None
            store = open_vector_store(settings)
            assert isinstance(store, QdrantVectorStore)
            try:
                return await reindex_qdrant(store, sessions, embedder, sparse, re_embed, bar.update)
            finally:
                await store.close()
    finally:
        await db_engine.dispose()
