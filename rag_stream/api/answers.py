"""POST /v1/answers: cited snippets first, then answer tokens."""

from __future__ import annotations

import time
from functools import partial

from fastapi import APIRouter
from fastapi.responses import Response

from rag_stream.api.deps import EngineDep, ResourcesDep, SessionDep
from rag_stream.errors import InvalidRequest, PayloadTooLarge
from rag_stream.generation.prompt import layout
from rag_stream.pipeline.answer import AnswerJob, answer_body
from rag_stream.pipeline.generate import fit_to_window, make_sampling
from rag_stream.schemas.answers import AnswerRequest, AnswerResponse
from rag_stream.schemas.events import CitationBody
from rag_stream.store.conversations import get_conversation, history_of
from rag_stream.store.models import new_id
from rag_stream.store.repositories import resolve_kb
from rag_stream.streaming.collect import collect
from rag_stream.streaming.sse import event_stream_response

router = APIRouter(tags=["answers"])


@router.post("/v1/answers", response_model=None)
async def answer(
    body: AnswerRequest, engine: EngineDep, resources: ResourcesDep, session: SessionDep
) -> Response | AnswerResponse:
    accepted_at = time.monotonic()
    settings = resources.settings
    cfg = settings.answers
    question = body.question.strip()
    if not question:
        raise InvalidRequest("question: must not be empty or only whitespace")
    if len(question) > cfg.max_question_chars:
        raise PayloadTooLarge(
            f"question is {len(question)} characters; the limit is {cfg.max_question_chars}"
        )
    top_k = cfg.default_top_k if body.top_k is None else body.top_k
    if top_k > cfg.max_top_k:
        raise InvalidRequest(f"top_k must be between 0 and {cfg.max_top_k}, got {top_k}")
    sampling = make_sampling(
        settings.limits, body.max_tokens, body.temperature, body.top_p, body.seed
    )
    kb = await resolve_kb(session, body.kb)
    if body.conversation_id:
        history = history_of(await get_conversation(session, body.conversation_id))
        conversation_id = body.conversation_id
    else:
        history, conversation_id = [], new_id()
    await session.close()  # the stream outlives this request: never hold its session

    lay = layout(engine, history, question, cfg.history_budget_tokens)
    # the reply always has room: sources are dropped before max_tokens is cut
    sampling = fit_to_window(engine, lay.full_ids(engine, []), sampling)
    job = AnswerJob(
        kb_id=kb.id,
        question=question,
        conversation_id=conversation_id,
        history=history,
        layout=lay,
        top_k=top_k,
        sampling=sampling,
        mmr=body.mmr,
        accepted_at=accepted_at,
    )
    streams = resources.streams
    sid = await streams.start(
        model=engine.model_name,
        kind="answer",
        body=partial(answer_body, job=job, retriever=resources.retriever, cfg=cfg),
        conversation_id=conversation_id,
    )
    events = streams.follow(sid, -1)
    if body.stream:
        return event_stream_response(events, settings.streaming.keepalive_s)
    result = await collect(events)
    return AnswerResponse(
        stream_id=sid,
        conversation_id=conversation_id,
        model=engine.model_name,
        answer=result.text,
        citations=[CitationBody(**c.model_dump(exclude={"id", "type"})) for c in result.citations],
        finish_reason=result.done.finish_reason,
        usage=result.done.usage,
        timings=result.done.timings,
        cited=result.done.cited,
        dropped_sources=result.done.dropped_sources,
    )
