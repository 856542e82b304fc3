"""Uploads ingested in the background (``DocumentIngest`` rows): their progress, their end, and
the rows whose process stopped working on them. Callers own the session and the commit.

A process renews ``heartbeat_at`` of the rows it works on every ``HEARTBEAT`` (and with each
progress step); a row still ``processing`` whose heartbeat is older than ``STALE_AFTER`` was
abandoned (its process was killed) and is marked failed: at start-up, and whenever it is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncSession

from rag_stream.store.models import DocumentIngest, utcnow

PROCESSING = "processing"
FAILED = "failed"
HEARTBEAT = timedelta(seconds=5)
STALE_AFTER = timedelta(seconds=30)
INTERRUPTED = "ingest_interrupted"
ABANDONED_MESSAGE = (
    "the server stopped while ingesting this document (nothing of it was stored); upload it again"
)


def _changed(result: object) -> int:
    assert isinstance(result, CursorResult)
    return int(result.rowcount)


async def get(session: AsyncSession, kb_id: str, ingest_id: str) -> DocumentIngest | None:
    """The row, marked failed first if its process abandoned it."""
    await fail_abandoned(session, ingest_id=ingest_id)
    return await session.scalar(
        select(DocumentIngest).where(DocumentIngest.kb_id == kb_id, DocumentIngest.id == ingest_id)
    )


async def processing_with(
    session: AsyncSession, kb_id: str, content_hash: str, source: str | None
) -> DocumentIngest | None:
    """A live ingest of the KB with this content, else one with this source."""
    await fail_abandoned(session)
    alike = DocumentIngest.content_hash == content_hash
    if source is not None:  # (== None would match every row without a source)
        alike = alike | (DocumentIngest.source == source)
    rows = (
        await session.scalars(
            select(DocumentIngest).where(
                DocumentIngest.kb_id == kb_id, DocumentIngest.status == PROCESSING, alike
            )
        )
    ).all()
    same = [r for r in rows if r.content_hash == content_hash]
    return next(iter(same or rows), None)


async def progress(session: AsyncSession, ingest_id: str, total: int, done: int) -> bool:
    """Record progress; False when the row is no longer processing (deleted, or failed)."""
    result = await session.execute(
        update(DocumentIngest)
        .where(DocumentIngest.id == ingest_id, DocumentIngest.status == PROCESSING)
        .values(chunks_total=total, chunks_done=done, heartbeat_at=utcnow())
    )
    return _changed(result) == 1


async def heartbeat(session: AsyncSession, ids: Sequence[str]) -> None:
    if ids:
        await session.execute(
            update(DocumentIngest)
            .where(DocumentIngest.id.in_(ids), DocumentIngest.status == PROCESSING)
            .values(heartbeat_at=utcnow())
        )


async def fail(session: AsyncSession, ingest_id: str, code: str, message: str) -> None:
    await session.execute(
        update(DocumentIngest)
        .where(DocumentIngest.id == ingest_id, DocumentIngest.status == PROCESSING)
        .values(status=FAILED, error_code=code, error_message=message[:2000])
    )


async def claim(session: AsyncSession, ingest_id: str) -> bool:
    """Delete the processing row, in the transaction that writes its document; False when it
    is gone (the client deleted it meanwhile) or failed, and the document must not be written."""
    result = await session.execute(
        delete(DocumentIngest).where(
            DocumentIngest.id == ingest_id, DocumentIngest.status == PROCESSING
        )
    )
    return _changed(result) == 1


async def remove(session: AsyncSession, kb_id: str, ingest_id: str) -> DocumentIngest | None:
    """Delete the row whatever its status; the row as it was, or None."""
    row = await session.scalar(
        select(DocumentIngest).where(DocumentIngest.kb_id == kb_id, DocumentIngest.id == ingest_id)
    )
    if row is not None:
        await session.delete(row)
    return row


async def fail_abandoned(session: AsyncSession, *, ingest_id: str | None = None) -> int:
    """Mark failed the processing rows nobody has renewed for ``STALE_AFTER``; how many."""
    stale = (DocumentIngest.status == PROCESSING) & (
        DocumentIngest.heartbeat_at < utcnow() - STALE_AFTER
    )
    if ingest_id is not None:
        stale = stale & (DocumentIngest.id == ingest_id)
    # a read first: an UPDATE would take SQLite's write lock even when nothing matches
    if await session.scalar(select(DocumentIngest.id).where(stale).limit(1)) is None:
        return 0
    result = await session.execute(
        update(DocumentIngest)
        .where(stale)
        .values(status=FAILED, error_code=INTERRUPTED, error_message=ABANDONED_MESSAGE)
    )
    return _changed(result)
