"""GET /v1/conversations/{id}: the persisted questions and answers with their citations."""

from __future__ import annotations

from fastapi import APIRouter

from rag_stream.api.deps import SessionDep, TenantDep
from rag_stream.schemas.answers import ConversationOut, MessageOut
from rag_stream.store.conversations import get_conversation

router = APIRouter(tags=["conversations"])


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
