"""A job as it stands, cancelling and deleting it, from any process sharing Redis and SQL."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import EventLogUnavailable, NotFound
from rag_stream.schemas.events import ErrorEvent
from rag_stream.schemas.jobs import FINISHED
from rag_stream.store.jobs import delete_job, finish_job, get_job
from rag_stream.store.models import Job
from rag_stream.streaming.service import Streams

_VANISHED = (
    "log_lost",
    "the job's event log is gone (its Redis restarted without it), so nothing can continue "
    "it; the sections finished before are kept in its result",
)


async def current_job(
    sessions: async_sessionmaker[AsyncSession], streams: Streams, job_id: str, tenant: str
) -> Job:
    """The tenant's job, with the end of its stream when SQL missed it (see ``reconcile``)."""
    async with sessions() as session:
        job = await get_job(session, job_id, tenant=tenant)
    return (await reconcile(sessions, streams, [job]))[0]


async def reconcile(
    sessions: async_sessionmaker[AsyncSession], streams: Streams, jobs: Sequence[Job]
) -> list[Job]:
    """``jobs`` as they stand, once each unfinished one is checked against its stream:
    - a stream that ended with an ``error`` its producer could not record (a takeover that
      found no plan, or one written by another version) makes the job ``failed`` with it;
    - a stream that is gone altogether (Redis restarted empty while no process ran the job,
      or its meta expired with nobody left to continue it) makes it ``failed`` with
      ``log_lost``: it would otherwise read ``running`` for good.
    A job's stream exists before its id is written to the job, so a job with an id and no
    stream is never one that is starting."""
    out = list(jobs)
    for i, job in enumerate(out):
        if job.status in FINISHED or job.stream_id is None:
            continue
        try:
            error = await _stream_error(streams, job.stream_id, job.tenant)
        except EventLogUnavailable:
            continue  # the status SQL has is the best there is
        if error is None:
            continue
        await finish_job(sessions, job.id, "failed", error)
        async with sessions() as session:
            out[i] = await get_job(session, job.id, tenant=job.tenant)
    return out


async def _stream_error(streams: Streams, stream_id: str, tenant: str) -> tuple[str, str] | None:
    try:
        meta = await streams.status(stream_id, tenant=tenant)
    except NotFound:
        return _VANISHED
    if meta.status != "error":
        return None
    end = await streams.last_event(stream_id, tenant=tenant)
    if isinstance(end, ErrorEvent):
        return end.code, end.message
    return "stream_error", "the job's stream failed"


async def cancel_job(
    sessions: async_sessionmaker[AsyncSession], streams: Streams, job_id: str, tenant: str
) -> Job:
    """Cancel the tenant's job (a no-op once it ended) and return it as it is then. Its
    stream's producer, wherever it runs, ends it within a decode step and records
    ``cancelled``; a job whose stream is gone is marked cancelled here."""
    async with sessions() as session:
        job = await get_job(session, job_id, tenant=tenant)
    if job.status not in FINISHED:
        gone = job.stream_id is None
        if job.stream_id is not None:
            try:
                await streams.cancel(job.stream_id, tenant=tenant)
            except NotFound:
                gone = True  # its log expired: nothing runs it
        if gone:
            await finish_job(sessions, job_id, "cancelled")
    async with sessions() as session:
        return await get_job(session, job_id, tenant=tenant)


async def remove_job(
    sessions: async_sessionmaker[AsyncSession], streams: Streams, job_id: str, tenant: str
) -> None:
    """Cancel the tenant's job if it runs, then delete it and its sections."""
    await cancel_job(sessions, streams, job_id, tenant)
    await delete_job(sessions, job_id)
