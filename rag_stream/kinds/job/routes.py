"""Long-document generation jobs: start, list, inspect, follow, fetch, cancel, delete."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import PlainTextResponse, Response
from sse_starlette import EventSourceResponse

from rag_stream.api.cursor import LastEventIdQuery, resume_cursor
from rag_stream.api.deps import (
    ResourcesDep,
    SessionDep,
    SettingsDep,
    StartKeyDep,
    StreamsDep,
    TenantDep,
)
from rag_stream.api.openapi import errors
from rag_stream.api.query import QueryInt
from rag_stream.errors import NotFound
from rag_stream.kinds.base import KindSlice
from rag_stream.kinds.job.control import cancel_job, current_job, reconcile, remove_job
from rag_stream.kinds.job.kind import JobKind
from rag_stream.kinds.job.result import job_out, job_result, markdown
from rag_stream.schemas.jobs import JobList, JobOut, JobRequest, JobResult
from rag_stream.schemas.streams import SSE_RESPONSES
from rag_stream.store.jobs import get_job, list_jobs, sections_of
from rag_stream.streaming.sse import event_stream_response

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=202, responses=errors(404, 413))
async def create(
    body: JobRequest, resources: ResourcesDep, tenant: TenantDep, start_key: StartKeyDep
) -> JobOut:
    kind = resources.kinds.get(JobKind)
    launched = await resources.streams.launch(
        kind, body, tenant=tenant, priority="batch", start_key=start_key
    )
    if launched.producer is not None:
        job_id = launched.producer.plan.job_id
    else:  # the start key's earlier start: its job is in the plan saved with its stream
        meta = await resources.streams.status(launched.stream_id, tenant=tenant)
        job_id = kind.read_plan(meta.plan or "").job_id
    async with resources.sessions() as session:
        return job_out(await get_job(session, job_id, tenant=tenant))


@router.get("")
async def list_(
    session: SessionDep,
    resources: ResourcesDep,
    tenant: TenantDep,
    limit: Annotated[QueryInt, Query(ge=1, le=100)] = 20,
    before: Annotated[str | None, Query(description="a job id from the previous page")] = None,
) -> JobList:
    jobs, next_before = await list_jobs(session, tenant=tenant, limit=limit, before=before)
    jobs = await reconcile(resources.sessions, resources.streams, jobs)
    return JobList(data=[job_out(j) for j in jobs], limit=limit, next_before=next_before)


@router.get("/{job_id}")
async def status(job_id: str, resources: ResourcesDep, tenant: TenantDep) -> JobOut:
    return job_out(await current_job(resources.sessions, resources.streams, job_id, tenant))


@router.get("/{job_id}/events", response_class=EventSourceResponse, responses=SSE_RESPONSES)
async def events(
    job_id: str,
    session: SessionDep,
    streams: StreamsDep,
    settings: SettingsDep,
    tenant: TenantDep,
    last_event_id_header: Annotated[
        str | None, Header(alias="Last-Event-ID", description="resume after this event id")
    ] = None,
    last_event_id: LastEventIdQuery = None,
) -> Response:
    job = await get_job(session, job_id, tenant=tenant)
    if job.stream_id is None:
        raise NotFound(f"job {job_id!r} has no events (it never started)")
    cursor = resume_cursor(last_event_id_header, last_event_id)
    await streams.check_cursor(job.stream_id, cursor, tenant=tenant)
    batches = streams.follow_batches(job.stream_id, cursor)
    keepalive = settings.streaming.keepalive_s
    return event_stream_response(batches, keepalive, {"X-Stream-Id": job.stream_id})


@router.get(
    "/{job_id}/result",
    response_model=None,
    responses={
        200: {"model": JobResult, "content": {"text/markdown": {"schema": {"type": "string"}}}}
    },
)
async def result(
    job_id: str,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    tenant: TenantDep,
    format: Literal["markdown", "json"] = "markdown",
) -> Response | JobResult:
    job = await get_job(session, job_id, tenant=tenant)
    base = str(settings.public_url or request.base_url).rstrip("/")
    found = job_result(job, await sections_of(session, job.id), base)
    if format == "json":
        return found
    return PlainTextResponse(markdown(found), media_type="text/markdown; charset=utf-8")


@router.post("/{job_id}/cancel")
async def cancel(job_id: str, resources: ResourcesDep, tenant: TenantDep) -> JobOut:
    job = await cancel_job(resources.sessions, resources.streams, job_id, tenant)
    return job_out(job)


@router.delete("/{job_id}", status_code=204)
async def delete(job_id: str, resources: ResourcesDep, tenant: TenantDep) -> Response:
    await remove_job(resources.sessions, resources.streams, job_id, tenant)
    return Response(status_code=204)


KIND = KindSlice(JobKind, router)
