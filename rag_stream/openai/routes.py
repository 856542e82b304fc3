"""OpenAI's Chat Completions and Models endpoints, over rag-stream's streams.

``POST /v1/chat/completions`` with the engine's model is a ``generate`` stream of the chat;
with ``kb:<name>`` it is an ``answer`` stream on that knowledge base (the last user message is
the question, earlier turns the history, system messages follow the built-in system prompt).
Either way the stream goes through the event log like every other, remembers that it speaks
the chat-completions format (``ChatWire``), and says its id in ``X-Stream-Id``, so
``GET /v1/streams/{id}/events`` resumes it in the same format.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse, Response

from rag_stream.api.chat_format import chat_completion, chat_frames
from rag_stream.api.deps import ResourcesDep, StartKeyDep, TenantDep
from rag_stream.api.openapi import errors
from rag_stream.errors import BadRequest, ModelNotFound
from rag_stream.generation.sampling import sampling_for
from rag_stream.openai.chat_launch import kb_of, launch_chat
from rag_stream.schemas.event_stream import CHAT, sse_responses
from rag_stream.schemas.openai import (
    KB_MODEL_PREFIX,
    SOURCES_HEADER,
    ChatCompletion,
    ChatCompletionRequest,
    ChatWire,
    ModelCard,
    ModelList,
    SourceShape,
)
from rag_stream.store.repositories import list_kbs
from rag_stream.streaming.collect import collect
from rag_stream.streaming.sse import sse_response

router = APIRouter(tags=["openai"])
_STARTED = int(time.time())  # the engine model's "created"


@router.get("/v1/models")
async def models(resources: ResourcesDep, tenant: TenantDep) -> ModelList:
    """The engine's model, and ``kb:<name>`` for each of the caller's knowledge bases."""
    served = resources.engines.get().model_name
    cards = [ModelCard(id=served, created=_STARTED, root=served, kb=None)]
    async with resources.sessions() as session:
        kbs = await list_kbs(session, tenant=tenant)
    for stats in kbs:
        kb = stats.kb
        cards.append(
            ModelCard(
                id=f"{KB_MODEL_PREFIX}{kb.name}",
                created=int(kb.created_at.timestamp()),
                root=served,
                kb=kb.name,
            )
        )
    return ModelList(data=cards)


@router.get("/v1/models/{model_id:path}")
async def model(
    model_id: Annotated[str, Path(description="an id from GET /v1/models")],
    resources: ResourcesDep,
    tenant: TenantDep,
) -> ModelCard:
    for card in (await models(resources, tenant)).data:
        if model_id == card.id:
            return card
    raise ModelNotFound(
        f"The model {model_id!r} does not exist (GET /v1/models lists them)", param="model"
    )


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses={**sse_responses(CHAT, json=ChatCompletion), **errors(404, 413)},
)
async def chat_completions(
    body: ChatCompletionRequest,
    request: Request,
    resources: ResourcesDep,
    tenant: TenantDep,
    start_key: StartKeyDep,
) -> Response:
    sources = _source_shape(request.headers.get(SOURCES_HEADER))
    kb = kb_of(body.model, resources)
    streams = resources.streams
    limits = resources.settings.limits
    asked = sampling_for(limits, body.completion_limit, body.temperature, body.top_p, body.seed)
    sampling = replace(asked, ignore_eos=body.ignore_eos)
    coalesce = resources.coalescing.resolve(body.coalesce, request.scope)
    base = str(resources.settings.public_url or request.base_url).rstrip("/")
    wire = ChatWire(
        model=body.model,
        kb=kb,
        chunk_url_base=base,
        include_usage=body.include_usage,
        sources=sources,
    )
    stream_id = await launch_chat(
        resources,
        body,
        body.model,
        kb,
        sampling,
        coalesce,
        tenant=tenant,
        priority=body.priority,
        wire=wire.model_dump_json(),
        # a client that closes the connection to stop (its only Stop) stops the engine soon
        abandon_after_s=resources.settings.streaming.chat_abandon_after_s or None,
        start_key=start_key,
    )
    headers = {"X-Stream-Id": stream_id}
    if body.stream:
        return sse_response(
            chat_frames(wire, streams.follow_batches(stream_id)),
            resources.settings.streaming.keepalive_s,
            headers,
        )
    completion = chat_completion(wire, await collect(streams.follow(stream_id)))
    return JSONResponse(completion.model_dump(), headers=headers)


def _source_shape(asked: str | None) -> SourceShape:
    """How the client asked for its sources (``X-Rag-Stream-Sources``; see ChatWire). Read
    here rather than declared, so the operation's OpenAPI description stays OpenAI's."""
    if asked is None or asked.strip() == "search_results":
        return "search_results"
    if asked.strip() == "open-webui":
        return "open-webui"
    raise BadRequest(
        f"{SOURCES_HEADER} must be 'search_results' or 'open-webui', got {asked[:40]!r}",
        param=SOURCES_HEADER,
    )
