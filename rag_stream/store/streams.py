"""Finished streams' records (kept after their Redis log expires)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from rag_stream.store.models import StreamRecord, utcnow


async def record_stream(
    session: AsyncSession,
    *,
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
        "kind": kind,
        "model": model,
        "conversation_id": conversation_id,
        "finish_reason": finish_reason,
        "text": text,
        "usage": usage,
        "created_at": utcnow(),
    }
    await session.execute(_upsert(session.get_bind().dialect.name), values)


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
