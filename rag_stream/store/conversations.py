"""Conversations and their messages (each answer with its citations and usage)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import selectinload

from rag_stream.errors import NotFound
from rag_stream.schemas.events import CitationBody, Done
from rag_stream.store.models import Conversation, Message
from rag_stream.store.streams import FinishedStream, record_streams


async def get_conversation(
    session: AsyncSession, conversation_id: str, *, tenant: str
) -> Conversation:
    """The tenant's conversation with its messages; another tenant's is NotFound."""
    conv = await session.scalar(
        select(Conversation)
        .where(Conversation.id == conversation_id, Conversation.tenant == tenant)
        .options(selectinload(Conversation.messages))
    )
    if conv is None:
        raise NotFound(f"conversation {conversation_id!r} not found")
    return conv


async def save_answer(
    sessions: async_sessionmaker[AsyncSession],
    *,
    tenant: str,
    stream_id: str,
    model: str,
    kb_id: str,
    conversation_id: str,
    question: str,
    answer: str,
    citations: Sequence[CitationBody],
    done: Done,
) -> None:
    """Persist the question and the answer once per stream (a takeover may finalize again)."""
    for _attempt in range(3):
        async with sessions() as session:
            if await session.scalar(select(Message.id).where(Message.stream_id == stream_id)):
                return
            if await session.get(Conversation, conversation_id) is None:
                session.add(Conversation(id=conversation_id, kb_id=kb_id, tenant=tenant))
                await session.flush()
            last = await session.scalar(
                select(func.max(Message.seq)).where(Message.conversation_id == conversation_id)
            )
            seq = (last or 0) + 1
            usage = done.usage.model_dump()
            session.add_all(
                [
                    Message(
                        conversation_id=conversation_id, seq=seq, role="user", content=question
                    ),
                    Message(
                        conversation_id=conversation_id,
                        seq=seq + 1,
                        role="assistant",
                        content=answer,
                        stream_id=stream_id,
                        citations={
                            "sources": [c.model_dump() for c in citations],
                            "cited": done.cited,
                        },
                        usage=usage,
                        finish_reason=done.finish_reason,
                    ),
                ]
            )
            record = FinishedStream(
                tenant=tenant,
                stream_id=stream_id,
                kind="answer",
                model=model,
                finish_reason=done.finish_reason,
                text=answer,
                usage=usage,
                conversation_id=conversation_id,
            )
            await record_streams(session, [record])
            try:
                await session.commit()
                return
            except IntegrityError:
                await session.rollback()  # a concurrent answer took this seq: try the next
    raise RuntimeError(f"could not save the answer of stream {stream_id}")
