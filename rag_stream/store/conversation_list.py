"""A tenant's conversations, newest first, for GET /v1/conversations.

Ordered by creation time (then id), with the last conversation of a page as the cursor: a
conversation that gets a new answer keeps its place, so paging never shows one twice or skips
one. Only conversations with a saved answer exist (the first answer creates the row).
"""

from __future__ import annotations

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from rag_stream.errors import InvalidRequest
from rag_stream.schemas.conversations import TITLE_CHARS, ConversationSummary
from rag_stream.store.models import Conversation, KnowledgeBase, Message


async def list_conversations(
    session: AsyncSession, *, tenant: str, limit: int, before: str | None = None
) -> tuple[list[ConversationSummary], str | None]:
    """One page of the tenant's conversations and the cursor of the next page (None: last).

    ``before`` is a conversation id from an earlier page; an unknown one (or another
    tenant's) is an InvalidRequest, the same for both."""
    query = select(Conversation).where(Conversation.tenant == tenant)
    if before is not None:
        anchor = await session.scalar(
            select(Conversation.created_at).where(
                Conversation.id == before, Conversation.tenant == tenant
            )
        )
        if anchor is None:
            raise InvalidRequest(f"before: no conversation {before!r}", param="before")
        query = query.where(
            or_(
                Conversation.created_at < anchor,
                and_(Conversation.created_at == anchor, Conversation.id < before),
            )
        )
    rows = list(
        await session.scalars(
            query.order_by(Conversation.created_at.desc(), Conversation.id.desc()).limit(limit + 1)
        )
    )
    page, more = rows[:limit], len(rows) > limit
    if not page:
        return [], None
    ids = [c.id for c in page]
    stats = {
        row.conversation_id: row
        for row in await session.execute(
            select(
                Message.conversation_id,
                func.max(Message.created_at).label("updated_at"),
                func.sum(case((Message.role == "user", 1), else_=0)).label("turns"),
                func.min(case((Message.role == "user", Message.seq))).label("first_seq"),
            )
            .where(Message.conversation_id.in_(ids))
            .group_by(Message.conversation_id)
        )
    }
    firsts = {
        (conversation_id, seq): content
        for conversation_id, seq, content in await session.execute(
            select(Message.conversation_id, Message.seq, Message.content).where(
                Message.conversation_id.in_(ids),
                Message.role == "user",
                Message.seq.in_([s.first_seq for s in stats.values() if s.first_seq is not None]),
            )
        )
    }
    kb_ids = {c.kb_id for c in page if c.kb_id}
    names = {
        kb_id: name
        for kb_id, name in await session.execute(
            select(KnowledgeBase.id, KnowledgeBase.name).where(
                KnowledgeBase.id.in_(kb_ids), KnowledgeBase.tenant == tenant
            )
        )
    }
    summaries = []
    for conv in page:
        stat = stats.get(conv.id)
        title = firsts.get((conv.id, stat.first_seq), "") if stat is not None else ""
        summaries.append(
            ConversationSummary(
                id=conv.id,
                kb_id=conv.kb_id,
                kb=names.get(conv.kb_id) if conv.kb_id else None,
                title=title[:TITLE_CHARS],
                created_at=conv.created_at,
                updated_at=stat.updated_at if stat is not None else conv.created_at,
                turns=int(stat.turns or 0) if stat is not None else 0,
            )
        )
    return summaries, page[-1].id if more else None
