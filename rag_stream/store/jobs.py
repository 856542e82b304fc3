"""Jobs and their finished sections. Each function opens its own session: the producer calls
them from a background task (never a request's session), the routes from their handlers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import InvalidRequest, NotFound
from rag_stream.schemas.events import CitationBody
from rag_stream.schemas.jobs import FINISHED, JobSpec, SectionCitations
from rag_stream.store.models import Job, JobSection, utcnow

Sessions = async_sessionmaker[AsyncSession]


@dataclass(frozen=True)
class FinishedSection:
    index: int
    heading: str
    text: str
    tokens: int
    finish_reason: str
    citations: Sequence[CitationBody]


async def create_job(sessions: Sessions, *, tenant: str, kb_id: str, spec: JobSpec) -> Job:
    job = Job(
        tenant=tenant,
        kb_id=kb_id,
        title=spec.title,
        instructions=spec.instructions,
        spec=spec.model_dump(mode="json"),
        status="queued",
        sections_total=spec.sections,
        sections_done=0,
        tokens=0,
    )
    async with sessions() as session:
        session.add(job)
        await session.commit()
    return job


def job_spec(job: Job) -> JobSpec:
    return JobSpec.model_validate(job.spec)


async def get_job(session: AsyncSession, job_id: str, *, tenant: str) -> Job:
    """The tenant's job; another tenant's is NotFound, as an unknown one."""
    job = await session.scalar(select(Job).where(Job.id == job_id, Job.tenant == tenant))
    if job is None:
        raise NotFound(f"job {job_id!r} not found")
    return job


async def list_jobs(
    session: AsyncSession, *, tenant: str, limit: int, before: str | None
) -> tuple[list[Job], str | None]:
    """The tenant's jobs, newest first, after the job ``before`` (a previous page's last; an
    unknown one, or another tenant's, is a 422 as on the conversation list)."""
    query = select(Job).where(Job.tenant == tenant)
    if before is not None:
        cursor = await session.scalar(select(Job).where(Job.id == before, Job.tenant == tenant))
        if cursor is None:
            raise InvalidRequest(f"before: no job {before!r}", param="before")
        query = query.where(
            or_(
                Job.created_at < cursor.created_at,
                and_(Job.created_at == cursor.created_at, Job.id < cursor.id),
            )
        )
    rows = list(
        (
            await session.scalars(
                query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
            )
        ).all()
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, rows[-1].id if more and rows else None


async def sections_of(session: AsyncSession, job_id: str) -> list[JobSection]:
    rows = await session.scalars(
        select(JobSection).where(JobSection.job_id == job_id).order_by(JobSection.index)
    )
    return list(rows.all())


def section_citations(section: JobSection) -> list[CitationBody]:
    return SectionCitations.model_validate(section.citations).citations


async def _update(sessions: Sessions, job_id: str, **values: object) -> None:
    async with sessions() as session:
        await session.execute(update(Job).where(Job.id == job_id).values(**values))
        await session.commit()


async def set_stream(sessions: Sessions, job_id: str, stream_id: str) -> None:
    await _update(sessions, job_id, stream_id=stream_id)


async def mark_running(sessions: Sessions, job_id: str, outline: Sequence[str] | None) -> None:
    """Running (again, after a takeover); the outline once known. ``started_at`` is the first
    start's."""
    async with sessions() as session:
        job = await session.get(Job, job_id)
        if job is None or job.status in FINISHED:
            return  # deleted, or ended meanwhile (a cancel from another process)
        job.status = "running"
        job.started_at = job.started_at or utcnow()
        if outline is not None:
            job.spec = {**job.spec, "outline": list(outline)}
            job.sections_total = len(outline)
        await session.commit()


async def save_sections(
    sessions: Sessions, job_id: str, sections: Sequence[FinishedSection]
) -> None:
    """Upsert finished sections (a takeover may write a section again) and the progress."""
    if not sections:
        return
    async with sessions() as session:
        if await session.get(Job, job_id) is None:
            return  # deleted while it ran
        dialect = session.get_bind().dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        for s in sections:
            values = {
                "job_id": job_id,
                "index": s.index,
                "heading": s.heading,
                "text": s.text,
                "tokens": s.tokens,
                "finish_reason": s.finish_reason,
                "citations": SectionCitations(citations=list(s.citations)).model_dump(mode="json"),
                "finished_at": utcnow(),
            }
            statement = insert(JobSection).values(**values)
            keep = {k: statement.excluded[k] for k in values if k not in ("job_id", "index")}
            await session.execute(
                statement.on_conflict_do_update(index_elements=["job_id", "index"], set_=keep)
            )
        done = await sections_of(session, job_id)
        await session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(sections_done=len(done), tokens=sum(s.tokens for s in done))
        )
        await session.commit()


async def finish_job(
    sessions: Sessions,
    job_id: str,
    status: str,
    error: tuple[str, str] | None = None,
) -> None:
    """The job's end (completed, failed or cancelled), once."""
    code, message = error if error is not None else (None, None)
    async with sessions() as session:
        job = await session.get(Job, job_id)
        if job is None or job.status in FINISHED:
            return
        job.status = status
        job.error_code, job.error_message = code, message
        job.finished_at = utcnow()
        await session.commit()


async def delete_job(sessions: Sessions, job_id: str) -> None:
    async with sessions() as session:
        await session.execute(delete(JobSection).where(JobSection.job_id == job_id))
        await session.execute(delete(Job).where(Job.id == job_id))
        await session.commit()


def elapsed_s(job: Job, now: datetime) -> float | None:
    if job.started_at is None:
        return None
    return ((job.finished_at or now) - job.started_at).total_seconds()
