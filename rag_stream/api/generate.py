"""POST /v1/generate: raw generation over SSE, the smallest end-to-end path."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from rag_stream.api.deps import EngineDep, SettingsDep
from rag_stream.errors import PayloadTooLarge, RagStreamError, from_code
from rag_stream.pipeline.generate import (
    fit_to_window,
    generate_events,
    make_sampling,
    new_stream_id,
)
from rag_stream.schemas.events import Done, ErrorEvent, Token
from rag_stream.schemas.generate import GenerateRequest, GenerateResponse
from rag_stream.streaming.sse import event_stream_response

router = APIRouter(tags=["generate"])


@router.post("/v1/generate", response_model=None)
async def generate(
    body: GenerateRequest, engine: EngineDep, settings: SettingsDep
) -> Response | GenerateResponse:
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
    sampling = fit_to_window(engine, prompt_ids, sampling)
    stream_id = new_stream_id()
    events = generate_events(engine, prompt_ids, sampling, stream_id)
    if body.stream:
        return event_stream_response(events, settings.streaming.keepalive_s)
    pieces: list[str] = []
    ids: list[int] = []
    async for event in events:
        if isinstance(event, Token):
            pieces.append(event.text)
            ids.extend(event.token_ids)
        elif isinstance(event, ErrorEvent):
            raise from_code(event.code, event.message)
        elif isinstance(event, Done):
            return GenerateResponse(
                stream_id=stream_id,
                model=engine.model_name,
                text="".join(pieces),
                token_ids=ids,
                finish_reason=event.finish_reason,
                usage=event.usage,
                timings=event.timings,
            )
    raise RagStreamError("generation ended without a terminal event")
