"""Ingest files and folders from disk (the CLI and the sample knowledge base)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RagStreamError,
    UnsupportedMediaType,
)
from rag_stream.ingest.batch import OnChunks
from rag_stream.ingest.documents import DocumentDraft, parse_upload
from rag_stream.ingest.parsing import SUPPORTED_SUFFIXES
from rag_stream.ingest.service import Ingestor
from rag_stream.ingest.writer import IngestResult, Outcome
from rag_stream.retrieval.embedder import Embedder
from rag_stream.store import repositories as repo
from rag_stream.store.models import KnowledgeBase

OnFile = Callable[[Path, IngestResult | None], None]


@dataclass
class IngestSummary:
    created: int = 0
    replaced: int = 0
    unchanged: int = 0
    chunks: int = 0
    failed: list[tuple[Path, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def documents(self) -> int:
        return self.created + self.replaced + self.unchanged


def collect_files(paths: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """(supported files, other files) under the given files and folders, recursively.
    Hidden files and folders are left out."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.is_file()
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
        elif path.is_file():
            found.append(path)
        else:
            raise InvalidRequest(f"{path}: no such file or folder")
    supported = [p for p in found if p.suffix.lower() in SUPPORTED_SUFFIXES]
    others = [p for p in found if p.suffix.lower() not in SUPPORTED_SUFFIXES]
    return supported, others


async def ensure_kb(
    sessions: async_sessionmaker[AsyncSession],
    name: str,
    description: str | None = None,
    *,
    tenant: str,
) -> KnowledgeBase:
    async with sessions() as session:
        try:
            return await repo.resolve_kb(session, name, tenant=tenant)
        except NotFound:
            pass
        try:
            return await repo.create_kb(session, name, description, tenant=tenant)
        except Conflict:  # created meanwhile by someone else
            return await repo.resolve_kb(session, name, tenant=tenant)


async def ingest_files(
    ingestor: Ingestor,
    kb_id: str,
    files: Iterable[Path],
    source_for: Callable[[Path], str],
    on_file: OnFile | None = None,
    on_chunks: OnChunks | None = None,
    embedder: Embedder | None = None,
) -> IngestSummary:
    """Ingest files, embedding several at a time; a file that cannot be read is reported and
    skipped. ``on_file`` is called once per file, with None when it failed. Parsing is bounded
    by the ingestor's settings; ``embedder`` replaces the ingestor's own (``Ingestor.batch``)."""
    summary = IngestSummary()
    began = time.perf_counter()

    def record(path: Path, outcome: Outcome) -> None:
        if isinstance(outcome, RagStreamError):
            summary.failed.append((path, outcome.message))
        elif not outcome.created:
            summary.unchanged += 1
        else:
            summary.chunks += outcome.document.chunk_count
            if outcome.replaced_id:
                summary.replaced += 1
            else:
                summary.created += 1
        if on_file is not None:
            on_file(path, outcome if isinstance(outcome, IngestResult) else None)

    async with ingestor.batch(kb_id, record, on_chunks, embedder) as batch:
        for path in files:
            try:
                data = await anyio.to_thread.run_sync(path.read_bytes)
                parsed = await parse_upload(data, path.name, None, ingestor.settings)
            except OSError as exc:
                record(path, InvalidRequest(f"cannot read: {exc.strerror or exc}"))
                continue
            except (InvalidRequest, PayloadTooLarge, UnsupportedMediaType) as exc:
                record(path, exc)
                continue
            draft = DocumentDraft(
                title=parsed.title or path.stem,
                parsed=parsed,
                source=source_for(path),
                meta={"filename": path.name},
            )
            await batch.add(draft, path)
    summary.seconds = time.perf_counter() - began
    return summary
