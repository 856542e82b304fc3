"""The sample knowledge base: the project's own docs/ (carried in the package too), ingested
into a KB named "docs" when ``serve`` starts (setting ``ingest.sample_kb``), so a newcomer can
ask questions at once.

It runs on every start and is idempotent: unchanged files are skipped by content hash, edited
ones replace their previous version (the source is the path relative to the project). Its
vectors are kept beside the models (``sample_vectors.py``, setting ``ingest.sample_kb_vectors``):
a start on a new data folder embeds only what changed since any start on this machine.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import anyio
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.ingest.files import IngestSummary, collect_files, ensure_kb, ingest_files
from rag_stream.ingest.sample_vectors import FILE_NAME, MemoEmbedder, SampleVectors, embedder_id
from rag_stream.ingest.service import Ingestor
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.settings import Settings, bundled

log = logging.getLogger(__name__)

SAMPLE_KB_NAME = "docs"
SAMPLE_DOCS_DIR = bundled("docs")  # named docs in the package too: the same sources


async def ingest_sample_kb(
    sessions: async_sessionmaker[AsyncSession],
    ingestor: Ingestor,
    docs_dir: Path = SAMPLE_DOCS_DIR,
    kept: SampleVectors | None = None,
) -> IngestSummary | None:
    """Ingest ``docs_dir``; with ``kept``, the chunks it has vectors for are not embedded, and
    the vectors of the others are added to its file."""
    files = await anyio.to_thread.run_sync(_sample_files, docs_dir)
    if files is None:
        log.info("sample kb: %s not found; skipped", docs_dir)
        return None
    kb = await ensure_kb(
        sessions,
        SAMPLE_KB_NAME,
        "rag-stream's own documentation (sample)",
        tenant=LOCAL_TENANT,  # the open mode's tenant (a key for "local" reaches it too)
    )
    summary = await ingest_files(
        ingestor,
        kb.id,
        files,
        source_for=lambda p: p.relative_to(docs_dir.parent).as_posix(),
        embedder=None if kept is None else MemoEmbedder(ingestor.embedder, kept),
    )
    if kept is not None and kept.added:
        await anyio.to_thread.run_sync(kept.save)
    for path, problem in summary.failed:
        log.warning("sample kb: %s skipped: %s", path, problem)
    log.info(
        "sample kb %r: %d new, %d replaced, %d unchanged documents, %d chunks in %.1f s",
        SAMPLE_KB_NAME,
        summary.created,
        summary.replaced,
        summary.unchanged,
        summary.chunks,
        summary.seconds,
    )
    return summary


def _sample_files(docs_dir: Path) -> list[Path] | None:
    return collect_files([docs_dir])[0] if docs_dir.is_dir() else None


def start_sample_kb(
    settings: Settings, sessions: async_sessionmaker[AsyncSession], ingestor: Ingestor
) -> asyncio.Task[None] | None:
    """Ingest the sample KB in the background when the setting is on (never fails the app)."""
    if not settings.ingest.sample_kb:
        return None

    async def run() -> None:
        try:
            kept = None
            if settings.ingest.sample_kb_vectors:
                path = settings.resolved_models_dir / FILE_NAME
                embedder = ingestor.embedder

                def load() -> SampleVectors:
                    return SampleVectors.load(
                        path, embedder_id(embedder, settings.resolved_embedder)
                    )

                kept = await anyio.to_thread.run_sync(load)
            await ingest_sample_kb(sessions, ingestor, kept=kept)
        except Exception as exc:
            log.warning("sample kb: ingestion failed: %s", exc)

    return asyncio.create_task(run(), name="sample-kb")
