"""The AI SDK's chat transport, natively: ``useChat`` with
``new DefaultChatTransport({api: "<rag-stream>/v1/ui/chat"})`` works unchanged.

``POST /v1/ui/chat`` starts the chat's answer on a model from ``GET /v1/models`` (``kb:<name>``
answers from that knowledge base, sources first) and streams it as UI message parts
(api/ui_format.py). The stream is the chat's by its ``id``: ``GET /v1/ui/chat/{id}/stream``,
the URL the transport derives for ``useChat({resume: true})``, replays the running answer from
its start (204 when none runs). Closing the connection does not stop it (a page reload closes
it too, and resuming after one is the point); Stop is ``POST /v1/streams/{streamId}/cancel``
with the id the ``start`` part's metadata gives.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from sse_starlette import EventSourceResponse

from rag_stream.api.deps import ResourcesDep, StartKeyDep, TenantDep
from rag_stream.api.openapi import errors
from rag_stream.api.streams import stream_wire
from rag_stream.api.ui_format import ui_frames
from rag_stream.generation.sampling import sampling_for
from rag_stream.openai.chat_launch import kb_of, launch_chat
from rag_stream.resources import Resources
from rag_stream.schemas.event_stream import UI, sse_responses
from rag_stream.schemas.ui_chat import CHAT_ID_MAX, UI_STREAM_HEADERS, UIChatRequest, UIWire
from rag_stream.streaming.sse import sse_response

router = APIRouter(tags=["ai-sdk"])


@router.post(
    "/v1/ui/chat",
    response_class=EventSourceResponse,
    responses={**sse_responses(UI), **errors(404, 413)},
)
async def ui_chat(
    body: UIChatRequest,
    request: Request,
    resources: ResourcesDep,
    tenant: TenantDep,
    start_key: StartKeyDep,
) -> Response:
    kb = kb_of(body.model, resources)
    asked = sampling_for(
        resources.settings.limits, body.max_tokens, body.temperature, body.top_p, body.seed
    )
    coalesce = resources.coalescing.resolve(body.coalesce, request.scope)
    base = str(resources.settings.public_url or request.base_url).rstrip("/")
    wire = UIWire(model=body.model, kb=kb, chunk_url_base=base, message_id=body.messageId)
    stream_id = await launch_chat(
        resources,
        body,
        body.model,
        kb,
        replace(asked, ignore_eos=body.ignore_eos),
        coalesce,
        tenant=tenant,
        priority=body.priority,
        wire=wire.model_dump_json(),
        alias=body.id,
        start_key=start_key,
    )
    return _parts(resources, wire, stream_id)


@router.get(
    "/v1/ui/chat/{chat_id}/stream",
    response_class=EventSourceResponse,
    responses={**sse_responses(UI), 204: {"description": "no answer of this chat is running"}},
)
async def resume_ui_chat(
    chat_id: Annotated[str, Path(max_length=CHAT_ID_MAX, description="the chat's id")],
    resources: ResourcesDep,
    tenant: TenantDep,
) -> Response:
    """The chat's running answer, from its start; 204 when none is running."""
    meta = await resources.streams.named(chat_id, tenant=tenant)
    if meta is None or meta.status != "running" or meta.wire is None:
        return Response(status_code=204)
    wire = stream_wire(meta.wire)
    if not isinstance(wire, UIWire):  # (only this route names streams by a chat's id)
        return Response(status_code=204)
    return _parts(resources, wire, meta.stream_id)


def _parts(resources: Resources, wire: UIWire, stream_id: str) -> Response:
    frames = ui_frames(wire, resources.streams.follow_batches(stream_id))
    headers = {"X-Stream-Id": stream_id, **UI_STREAM_HEADERS}
    return sse_response(frames, resources.settings.streaming.keepalive_s, headers)
