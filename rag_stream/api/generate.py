"""POST /v1/generate: raw generation over SSE, the smallest end-to-end path."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from rag_stream.api.deps import ResourcesDep, TenantDep
from rag_stream.schemas.generate import GenerateRequest, GenerateResponse
from rag_stream.streaming.collect import Collected, collect
from rag_stream.streaming.sse import event_stream_response

router = APIRouter(tags=["generate"])


@router.post("/v1/generate", response_model=None)
async def generate(
    body: GenerateRequest, request: Request, resources: ResourcesDep, tenant: TenantDep
) -> Response | GenerateResponse:
    kind, streams = resources.generation, resources.streams
    coalesce = resources.coalescing.resolve(body.coalesce, request.scope)
    async with resources.admission.ticket(body.priority, tenant) as ticket:
        run = kind.accept(body, coalesce, tenant)
        ticket.priority = run.priority  # a long prompt waits as batch
        stream_id = await streams.start(kind, run, ticket=ticket, tenant=tenant)
    if body.stream:
        batches = streams.follow_batches(stream_id)
        keepalive = resources.settings.streaming.keepalive_s
        return event_stream_response(batches, keepalive, {"X-Stream-Id": stream_id})
    return _response(await collect(streams.follow(stream_id)))


def _response(result: Collected) -> GenerateResponse:
    done = result.done
    return GenerateResponse(
        stream_id=result.start.stream_id,
        model=result.start.model,
        text=result.text,
        token_ids=result.token_ids,
        finish_reason=done.finish_reason,
        usage=done.usage,
        timings=done.timings,
    )
