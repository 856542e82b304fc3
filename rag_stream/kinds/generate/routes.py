"""POST /v1/generate: raw generation over SSE, the smallest end-to-end path."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from rag_stream.api.deps import ResourcesDep, StartKeyDep, TenantDep
from rag_stream.api.openapi import errors
from rag_stream.api.responses import stream_or_collect
from rag_stream.kinds.base import KindSlice
from rag_stream.kinds.generate.intent import prompt_from_request
from rag_stream.kinds.generate.kind import GenerateKind
from rag_stream.schemas.event_stream import NATIVE, sse_responses
from rag_stream.schemas.generate import GenerateRequest, GenerateResponse
from rag_stream.streaming.collect import Collected

router = APIRouter(tags=["generate"])


@router.post(
    "/v1/generate",
    response_model=None,
    responses={**sse_responses(NATIVE, json=GenerateResponse), **errors(413)},
)
async def generate(
    body: GenerateRequest,
    request: Request,
    resources: ResourcesDep,
    tenant: TenantDep,
    start_key: StartKeyDep,
) -> Response | GenerateResponse:
    coalesce = resources.coalescing.resolve(body.coalesce, request.scope)
    prompt = prompt_from_request(body, resources.settings.limits, coalesce)
    launched = await resources.streams.launch(
        resources.kinds.get(GenerateKind),
        prompt,
        tenant=tenant,
        priority=body.priority,
        start_key=start_key,
    )
    return await stream_or_collect(resources, launched.stream_id, body.stream, _response)


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


KIND = KindSlice(GenerateKind, router)
