"""Finished streams' records (kept after their Redis log expires), and the usage they add up to."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.schemas.tenants import UsageTotals
from rag_stream.store.models import StreamRecord, utcnow


async def record_stream(
    session: AsyncSession,
    *,
    tenant: str,
    stream_id: str,
    kind: str,
    model: str,
    conversation_id: str | None,
    finish_reason: str,
    text: str,
    usage: dict[str, Any],
) -> None:
    """Insert the record, or replace it: a process that takes a stream over may finish it again
    after the first one recorded it and died before ending the log. One statement (an upsert),
    where an ORM merge would read the row first."""
    values = {
        "id": stream_id,
        "tenant": tenant,
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "cached_tokens": int(usage.get("cached_tokens", 0)),
        "completion_tokens": int(usage.get("completion_tokens", 0)),
        "kind": kind,
        "model": model,
        "conversation_id": conversation_id,
        "finish_reason": finish_reason,
        "text": text,
        "usage": usage,
        "created_at": utcnow(),
    }
    await session.execute(_upsert(session.get_bind().dialect.name), values)


async def save_stream(
    sessions: async_sessionmaker[AsyncSession],
    *,
    tenant: str,
    stream_id: str,
    kind: str,
    model: str,
    finish_reason: str,
    text: str,
    usage: dict[str, Any],
) -> None:
    """Record a stream that belongs to no conversation, in a transaction of its own."""
    async with sessions() as session:
        await record_stream(
            session,
            tenant=tenant,
            stream_id=stream_id,
            kind=kind,
            model=model,
            conversation_id=None,
            finish_reason=finish_reason,
            text=text,
            usage=usage,
        )
        await session.commit()


@functools.cache
def _upsert(dialect: str) -> Any:
    """The statement, built once per dialect (the values come as parameters)."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(StreamRecord)
    replace = {
        column.name: statement.excluded[column.name]
        for column in StreamRecord.__table__.columns
        if column.name not in ("id", "created_at")
    }
    return statement.on_conflict_do_update(index_elements=["id"], set_=replace)


async def usage_by_kind(
    session: AsyncSession, tenant: str, start: datetime, end: datetime
) -> dict[str, UsageTotals]:
    """The tenant's streams that ended in [start, end), summed per kind of stream."""
    rows = await session.execute(
        select(
            StreamRecord.kind,
            func.count(StreamRecord.id),
            func.coalesce(func.sum(StreamRecord.prompt_tokens), 0),
            func.coalesce(func.sum(StreamRecord.cached_tokens), 0),
            func.coalesce(func.sum(StreamRecord.completion_tokens), 0),
        )
        .where(
            StreamRecord.tenant == tenant,
            StreamRecord.created_at >= start,
            StreamRecord.created_at < end,
        )
        .group_by(StreamRecord.kind)
    )
    return {
        kind: UsageTotals(
            requests=int(n), prompt_tokens=int(p), cached_tokens=int(c), completion_tokens=int(o)
        )
        for kind, n, p, c, o in rows.tuples()
    }
