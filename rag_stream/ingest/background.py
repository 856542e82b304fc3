"""Large uploads, ingested after their request has answered (202).

``start`` records the upload as a ``DocumentIngest`` row (status ``processing``) and runs its
ingest in a task of this process: chunking, then embedding batch by batch, each batch's end
recorded as progress (``chunks_done`` of ``chunks_total``) and renewing the row's heartbeat.
The document and its chunks are written in one transaction that also deletes the row
(``writer``, ``store/ingests.claim``), so search finds the document only once it is whole.

Its chunks are embedded at the lowest CPU priority (``low_priority``), so answers keep their
time to first token while it runs. The work is meant to outlive its client, and ends in one of
three ways:

- the document is written (``GET`` on its id then reads the document, ``ready``);
- it fails: the row says ``failed`` with the error, its vectors are removed;
- the row is deleted (``DELETE`` on the document): the task notices at its next progress step,
  or at once in this process (``cancel``), and removes its vectors.

When the service stops, ``close`` cancels the tasks and marks their rows failed
(``ingest_interrupted``); a process killed outright leaves rows whose heartbeat goes stale,
and those are marked failed when read or at the next start (``store/ingests.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import Conflict, RagStreamError
from rag_stream.ingest.documents import (
    DocumentDraft,
    DocumentPreparer,
    PreparedDocument,
    content_hash,
    require_text,
)
from rag_stream.ingest.locks import KeyedLocks
from rag_stream.ingest.slots import IngestSlot
from rag_stream.ingest.writer import DocumentWriter, IngestResult
from rag_stream.store import ingests
from rag_stream.store import repositories as repo
from rag_stream.store.models import DocumentIngest

log = logging.getLogger(__name__)


class _Stopped(Exception):
    """The ingest's row is no longer processing (deleted, or failed by another process)."""


@dataclass(frozen=True)
class Accepted:
    """An upload the background ingests (``created``), or one it was already ingesting."""

    ingest: DocumentIngest
    created: bool


class BackgroundIngests:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        preparer: DocumentPreparer,
        writer: Callable[[], Awaitable[DocumentWriter]],
        locks: KeyedLocks,
    ) -> None:
        self._sessions = sessions
        self._preparer = preparer
        self._writer = writer  # made on first use (ingest/low_priority.py: a model session)
        self._locks = locks
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def start(
        self, kb_id: str, draft: DocumentDraft, slot: IngestSlot
    ) -> Accepted | IngestResult:
        """Record the upload and start its ingest, which then holds ``slot``. Identical content
        already stored is that document (nothing started); identical content being ingested is
        that ingest; another upload of a source being ingested is a Conflict."""
        try:
            digest = content_hash(require_text(draft))
            keys = [f"{kb_id}/hash/{digest}"]
            if draft.source:
                keys.append(f"{kb_id}/source/{draft.source}")
            async with self._locks.hold(keys), self._sessions() as session:
                stored = await repo.document_by_hash(session, kb_id, digest)
                if stored is not None:
                    slot.release()
                    return IngestResult(stored, created=False)
                live = await ingests.processing_with(session, kb_id, digest, draft.source)
                if live is not None and live.content_hash != digest:
                    raise Conflict(
                        f"source {live.source!r} is being ingested as document {live.id!r}; wait "
                        "until it is ready, or delete it first"
                    )
                if live is not None:
                    slot.release()
                    return Accepted(live, created=False)
                row = DocumentIngest(
                    kb_id=kb_id,
                    title=draft.title[:512],
                    source=draft.source,
                    content_hash=digest,
                    media_type=draft.parsed.media_type,
                    meta=dict(draft.meta),
                )
                session.add(row)
                await session.commit()
        except BaseException:
            slot.release()
            raise
        task = asyncio.create_task(self._run(row.id, kb_id, draft, slot), name=f"ingest {row.id}")
        self._tasks[row.id] = task
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._beat(), name="ingest heartbeat")
        return Accepted(row, created=True)

    async def cancel(self, ingest_id: str) -> None:
        """Stop this process's ingest of ``ingest_id`` (its row already deleted) and wait for
        its vectors to be removed."""
        task = self._tasks.get(ingest_id)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    async def recover(self) -> None:
        """At start: mark failed what a process killed outright left processing."""
        try:
            async with self._sessions() as session:
                if failed := await ingests.fail_abandoned(session):
                    await session.commit()
                    log.warning("ingest: %d upload(s) left processing by a stopped process", failed)
        except Exception as exc:
            log.warning("ingest: could not check for abandoned uploads: %s", exc)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)

    async def _run(
        self, ingest_id: str, kb_id: str, draft: DocumentDraft, slot: IngestSlot
    ) -> None:
        try:
            prepared = await self._preparer.prepare(kb_id, draft, ingest_id=ingest_id)
            if not isinstance(prepared, PreparedDocument):
                # stored meanwhile by another process
                raise Conflict(f"identical content was stored meanwhile as {prepared.id!r}")
            total = len(prepared.chunk_ids)

            async def progress(done: int) -> None:
                async with self._sessions() as session:
                    moving = await ingests.progress(session, ingest_id, total, done)
                    await session.commit()
                if not moving:
                    raise _Stopped

            await progress(0)
            writer = await self._writer()
            (outcome,) = await writer.write([prepared], progress)
            if isinstance(outcome, RagStreamError):
                raise outcome
            if not outcome.created:
                raise Conflict(f"identical content was stored meanwhile as {outcome.document.id!r}")
            log.info("ingest %s: %d chunks stored", ingest_id, total)
        except _Stopped:
            log.info("ingest %s: stopped (deleted, or failed elsewhere)", ingest_id)
        except asyncio.CancelledError:
            await self._fail(ingest_id, ingests.INTERRUPTED, ingests.ABANDONED_MESSAGE)
            raise
        except RagStreamError as exc:
            await self._fail(ingest_id, exc.code, exc.message)
        except Exception:
            log.exception("ingest %s failed", ingest_id)
            await self._fail(ingest_id, "internal_error", "internal error; see the server log")
        finally:
            slot.release()
            self._tasks.pop(ingest_id, None)

    async def _fail(self, ingest_id: str, code: str, message: str) -> None:
        with anyio.CancelScope(shield=True):
            try:
                async with self._sessions() as session:
                    await ingests.fail(session, ingest_id, code, message)
                    await session.commit()
            except Exception as exc:  # its heartbeat stops: it is marked failed once stale
                log.warning("ingest %s: could not record its failure: %s", ingest_id, exc)

    async def _beat(self) -> None:
        while self._tasks:
            await asyncio.sleep(ingests.HEARTBEAT.total_seconds())
            try:
                async with self._sessions() as session:
                    await ingests.heartbeat(session, list(self._tasks))
                    await session.commit()
            except Exception as exc:
                log.warning("ingest: heartbeat failed: %s", exc)
