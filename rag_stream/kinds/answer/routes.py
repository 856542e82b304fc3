"""POST /v1/answers: cited snippets first, then answer tokens."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from rag_stream.api.deps import ResourcesDep, StartKeyDep, TenantDep
from rag_stream.api.openapi import errors
from rag_stream.api.responses import stream_or_collect
from rag_stream.kinds.answer.intent import question_from_request
from rag_stream.kinds.answer.kind import AnswerKind
from rag_stream.kinds.base import KindSlice
from rag_stream.schemas.answers import AnswerRequest, AnswerResponse
from rag_stream.schemas.event_stream import NATIVE, sse_responses
from rag_stream.schemas.events import CitationBody
from rag_stream.streaming.collect import Collected

router = APIRouter(tags=["answers"])


@router.post(
    "/v1/answers",
    response_model=None,
    responses={**sse_responses(NATIVE, json=AnswerResponse), **errors(404, 413)},
)
async def answer(
    body: AnswerRequest,
    request: Request,
    resources: ResourcesDep,
    tenant: TenantDep,
    start_key: StartKeyDep,
) -> Response | AnswerResponse:
    coalesce = resources.coalescing.resolve(body.coalesce, request.scope)
    question = question_from_request(body, resources.settings.limits, coalesce)
    launched = await resources.streams.launch(
        resources.kinds.get(AnswerKind),
        question,
        tenant=tenant,
        priority=body.priority,
        start_key=start_key,
    )
    return await stream_or_collect(resources, launched.stream_id, body.stream, _response)


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


KIND = KindSlice(AnswerKind, router)
