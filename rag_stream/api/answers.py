"""POST /v1/answers: cited snippets first, then answer tokens."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from rag_stream.api.deps import ResourcesDep, TenantDep
from rag_stream.schemas.answers import AnswerRequest, AnswerResponse
from rag_stream.schemas.events import CitationBody
from rag_stream.streaming.collect import Collected, collect
from rag_stream.streaming.sse import event_stream_response

router = APIRouter(tags=["answers"])


@router.post("/v1/answers", response_model=None)
async def answer(
    body: AnswerRequest, request: Request, resources: ResourcesDep, tenant: TenantDep
) -> Response | AnswerResponse:
    kind, streams = resources.answers, resources.streams
    coalesce = resources.coalescing.resolve(body.coalesce, request.scope)
    async with resources.admission.ticket(body.priority, tenant) as ticket:
        run = await kind.accept(body, coalesce, tenant)
        ticket.priority = run.priority  # a long prompt waits as batch
        stream_id = await streams.start(kind, run, ticket=ticket, tenant=tenant)
    if body.stream:
        batches = streams.follow_batches(stream_id)
        keepalive = resources.settings.streaming.keepalive_s
        return event_stream_response(batches, keepalive, {"X-Stream-Id": stream_id})
    return _response(await collect(streams.follow(stream_id)))


def _response(result: Collected) -> AnswerResponse:
    started, done = result.start, result.done
    return AnswerResponse(
        stream_id=started.stream_id,
        conversation_id=started.conversation_id or "",
        model=started.model,
        answer=result.text,
        citations=[CitationBody.model_validate(c, from_attributes=True) for c in result.citations],
        finish_reason=done.finish_reason,
        usage=done.usage,
        timings=done.timings,
        cited=done.cited,
        dropped_sources=done.dropped_sources,
    )
