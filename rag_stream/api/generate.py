"""POST /v1/generate: raw generation over SSE, the smallest end-to-end path."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from rag_stream.api.deps import EngineDep, ResourcesDep
from rag_stream.errors import PayloadTooLarge
from rag_stream.pipeline.generate import (
    fit_to_window,
    generate_body,
    generation_plan,
    make_sampling,
)
from rag_stream.schemas.generate import GenerateRequest, GenerateResponse
from rag_stream.streaming.collect import collect
from rag_stream.streaming.sse import event_stream_response

router = APIRouter(tags=["generate"])


@router.post("/v1/generate", response_model=None)
async def generate(
    body: GenerateRequest, engine: EngineDep, resources: ResourcesDep
) -> Response | GenerateResponse:
    settings = resources.settings
    limits = settings.limits
    if len(body.prompt) > limits.max_prompt_chars:
        raise PayloadTooLarge(
            f"prompt is {len(body.prompt)} characters; the limit is {limits.max_prompt_chars}"
        )
    sampling = make_sampling(limits, body.max_tokens, body.temperature, body.top_p, body.seed)
    text = (
        engine.chat_prompt([{"role": "user", "content": body.prompt}]) if body.chat else body.prompt
    )
    prompt_ids = engine.tokenizer.encode(text, add_special_tokens=False)
    plan = generation_plan(prompt_ids, fit_to_window(engine, prompt_ids, sampling))
    streams = resources.streams
    sid = await streams.start(
        model=engine.model_name, kind="generate", body=lambda ctx: generate_body(ctx, plan)
    )
    events = streams.follow(sid, -1)
    if body.stream:
        return event_stream_response(events, settings.streaming.keepalive_s)
    result = await collect(events)
    return GenerateResponse(
        stream_id=sid,
        model=engine.model_name,
        text=result.text,
        token_ids=result.token_ids,
        finish_reason=result.done.finish_reason,
        usage=result.done.usage,
        timings=result.done.timings,
    )
