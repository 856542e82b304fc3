"""A job as it stands, cancelling and deleting it, from any process sharing Redis and SQL."""

from __future__ import annotations

from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import NotFound
from rag_stream.schemas.events import ErrorEvent
from rag_stream.schemas.jobs import FINISHED
from rag_stream.store.jobs import delete_job, finish_job, get_job
from rag_stream.store.models import Job
from rag_stream.streaming.service import Streams


async def current_job(
    sessions: async_sessionmaker[AsyncSession], streams: Streams, job_id: str, tenant: str
) -> Job:
    """The tenant's job, with the end of its stream when SQL missed it: a stream that ended
    with an ``error`` its producer could not record (a takeover that found no plan, or one
    written by another version) makes the job ``failed`` with that error."""
    async with sessions() as session:
        job = await get_job(session, job_id, tenant=tenant)
    if job.status in FINISHED or job.stream_id is None:
        return job
    try:
        meta = await streams.event_log.meta(job.stream_id)
        if meta is None or meta.status != "error":
            return job
        last = await streams.event_log.read(job.stream_id, meta.last_event_id - 1, None)
    except RedisError:
        return job  # the status SQL has is the best there is
    end = last[-1] if last else None
    if isinstance(end, ErrorEvent):
        await finish_job(sessions, job_id, "failed", (end.code, end.message))
    else:
        await finish_job(sessions, job_id, "failed", ("stream_error", "the job's stream failed"))
    async with sessions() as session:
        return await get_job(session, job_id, tenant=tenant)


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
