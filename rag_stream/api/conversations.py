"""GET /v1/conversations: the caller's conversations, newest first; GET /v1/conversations/{id}:
the persisted questions and answers with their citations."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from rag_stream.api.deps import SessionDep, TenantDep
from rag_stream.api.query import QueryInt
from rag_stream.schemas.answers import ConversationOut, MessageOut
from rag_stream.schemas.conversations import ConversationList
from rag_stream.store.conversation_list import list_conversations
from rag_stream.store.conversations import get_conversation

router = APIRouter(tags=["conversations"])


@router.get("/v1/conversations")
async def conversations(
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[QueryInt, Query(ge=1, le=100)] = 20,
    before: Annotated[
        str | None,
        Query(min_length=1, max_length=64, description="next_before from the previous page"),
    ] = None,
) -> ConversationList:
    page, next_before = await list_conversations(session, tenant=tenant, limit=limit, before=before)
    return ConversationList(data=page, limit=limit, next_before=next_before)


@router.get("/v1/conversations/{conversation_id}")
async def conversation(
    conversation_id: str, session: SessionDep, tenant: TenantDep
) -> ConversationOut:
    conv = await get_conversation(session, conversation_id, tenant=tenant)
    return ConversationOut(
        id=conv.id,
        kb_id=conv.kb_id,
        created_at=conv.created_at,
        messages=[MessageOut.model_validate(m, from_attributes=True) for m in conv.messages],
    )
