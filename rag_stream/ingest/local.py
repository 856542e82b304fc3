"""The stores and models the CLI needs, built in-process from settings (no server involved).

Qdrant in local mode locks its folder, so this cannot run while a ``serve`` uses the same data
dir; with ``RAG_STREAM_QDRANT_URL`` set both share the Qdrant server and that is fine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import ConfigError
from rag_stream.ingest.files import IngestSummary, collect_files, ensure_kb, ingest_files
from rag_stream.ingest.service import Ingestor
from rag_stream.ingest.writer import IngestResult
from rag_stream.retrieval.embedder import SentenceTransformerEmbedder
from rag_stream.retrieval.retriever import Retriever, SearchHit
from rag_stream.retrieval.vector_store import QdrantVectorStore
from rag_stream.settings import ENV_PREFIX, Settings
from rag_stream.store.db import create_db
from rag_stream.store.repositories import resolve_kb


@dataclass(frozen=True)
class LocalStack:
    sessions: async_sessionmaker[AsyncSession]
    ingestor: Ingestor
    retriever: Retriever


@asynccontextmanager
async def open_local_stack(settings: Settings) -> AsyncIterator[LocalStack]:
    try:
        vectors = QdrantVectorStore.from_settings(settings)
    except RuntimeError as exc:
        if "already accessed" not in str(exc):
            raise
        raise ConfigError(
            f"the local Qdrant in {settings.qdrant_path} is in use by another process "
            "(a running `rag-stream serve`?): stop it, use the HTTP API instead, or set "
            f"{ENV_PREFIX}QDRANT_URL to a Qdrant server both can share"
        ) from None
    db_engine, sessions = create_db(settings.resolved_database_url)
    try:
        embedder = await SentenceTransformerEmbedder.load(
            settings.resolved_embedder, batch_size=settings.ingest.embed_batch_size
        )
        await vectors.ensure(embedder.dimension)
        yield LocalStack(
            sessions,
            Ingestor(sessions, vectors, embedder, settings.ingest),
            Retriever(sessions, vectors, embedder),
        )
    finally:
        await vectors.close()
        await db_engine.dispose()


async def ingest_paths(
    settings: Settings, kb_name: str, paths: Sequence[Path], progress: bool = True
) -> tuple[IngestSummary, list[Path]]:
    """Ingest files and folders into the KB named ``kb_name`` (created if missing).
    Returns the summary and the files left out because of their type."""
    from tqdm import tqdm

    files, others = collect_files([p.expanduser() for p in paths])
    async with open_local_stack(settings) as stack:
        kb = await ensure_kb(stack.sessions, kb_name)
        with tqdm(total=len(files), unit="file", disable=not progress) as bar:

            def advance(path: Path, _result: IngestResult | None) -> None:
                bar.set_postfix_str(path.name[-40:], refresh=False)
                bar.update()

            summary = await ingest_files(
                stack.ingestor,
                kb.id,
                files,
                source_for=lambda p: p.resolve().as_posix(),
                on_file=advance,
            )
    return summary, others


async def search_kb(
    settings: Settings, kb_ref: str, query: str, top_k: int, mmr: bool
) -> list[SearchHit]:
    async with open_local_stack(settings) as stack:
        async with stack.sessions() as session:
            kb = await resolve_kb(session, kb_ref)
        return await stack.retriever.search(kb.id, query, top_k, mmr=mmr)
