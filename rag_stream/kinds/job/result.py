"""A job's document from its stored sections: structured (``JobResult``) or Markdown.

Sources are numbered across the document; each entry links to its chunk
(``/v1/kbs/{kb}/chunks/{chunk_id}``), where the chunk's text and its document are.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from urllib.parse import quote

from rag_stream.generation.markers import cited_markers
from rag_stream.schemas.events import FinishReason
from rag_stream.schemas.jobs import (
    FINISHED,
    JobError,
    JobOut,
    JobProgress,
    JobResult,
    JobStatus,
    SectionOut,
    SourceOut,
)
from rag_stream.store.jobs import elapsed_s, job_spec, section_citations
from rag_stream.store.models import Job, JobSection, utcnow


def _status(job: Job) -> JobStatus:
    status = job.status
    assert status in ("queued", "running", "completed", "failed", "cancelled")
    return status  # type: ignore[return-value]


def job_out(job: Job, now: datetime | None = None) -> JobOut:
    """The job's state and progress; the time left is estimated from the rate of the
    sections written so far."""
    now = now or utcnow()
    elapsed = elapsed_s(job, now)
    eta = None
    left = job.sections_total - job.sections_done
    if job.status in FINISHED:
        eta = 0.0
    elif elapsed is not None and job.sections_done:
        eta = elapsed / job.sections_done * left
    error = None
    if job.error_code is not None:
        error = JobError(code=job.error_code, message=job.error_message or "")
    return JobOut(
        id=job.id,
        kb_id=job.kb_id,
        title=job.title,
        status=_status(job),
        stream_id=job.stream_id,
        outline=job_spec(job).outline,
        section_tokens=job_spec(job).section_tokens,
        progress=JobProgress(
            sections_done=job.sections_done,
            sections_total=job.sections_total,
            tokens=job.tokens,
            elapsed_s=elapsed,
            eta_s=eta,
        ),
        error=error,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )


def chunk_url(base: str, kb_id: str, chunk_id: str) -> str:
    return f"{base}/v1/kbs/{quote(kb_id, safe='')}/chunks/{quote(chunk_id, safe='')}"


def job_result(job: Job, sections: Sequence[JobSection], base_url: str) -> JobResult:
    sources: dict[int, SourceOut] = {}
    out: list[SectionOut] = []
    for section in sections:
        citations = section_citations(section)
        mine = {c.n for c in citations}
        for c in citations:
            sources.setdefault(
                c.n,
                SourceOut(
                    n=c.n,
                    chunk_id=c.chunk_id,
                    document_id=c.document_id,
                    title=c.title,
                    heading=c.heading,
                    url=chunk_url(base_url, job.kb_id, c.chunk_id),
                ),
            )
        cited = cited_markers(section.text, mine)
        reason: FinishReason = section.finish_reason  # type: ignore[assignment]
        out.append(
            SectionOut(
                index=section.index,
                heading=section.heading,
                text=section.text,
                tokens=section.tokens,
                finish_reason=reason,
                cited=cited,
            )
        )
    return JobResult(
        id=job.id,
        title=job.title,
        status=_status(job),
        complete=job.status == "completed" and len(out) == job.sections_total,
        sections=out,
        sources=[sources[n] for n in sorted(sources)],
    )


def markdown(result: JobResult) -> str:
    """Title, one ``##`` heading per section, then the numbered Sources list."""
    parts = [f"# {result.title}", ""]
    for section in result.sections:
        parts += [f"## {section.heading}", "", section.text.strip(), ""]
    if not result.complete:
        parts += [f"_Incomplete: the job is {result.status}; {len(result.sections)} sections._", ""]
    if result.sources:
        parts += ["## Sources", ""]
        for s in result.sources:
            where = f"{s.title} — {s.heading}" if s.heading else s.title
            parts.append(f"- [{s.n}] [{where}]({s.url}) (document `{s.document_id}`)")
        # reference definitions: a Markdown renderer turns each [n] of the text into a link
        parts.append("")
        parts += [f"[{s.n}]: {s.url}" for s in result.sources]
        parts.append("")
    return "\n".join(parts)
