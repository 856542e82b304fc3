"""Finished streams' records (kept after their Redis log expires), and the usage they add up to."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from rag_stream.schemas.tenants import UsageTotals
from rag_stream.store.models import StreamRecord, utcnow


@dataclass(frozen=True)
class FinishedStream:
    """An ended stream's record: what ``GET /v1/usage`` and the stream's history read back."""

    tenant: str
    stream_id: str
    kind: str
    model: str
    finish_reason: str
    text: str
    usage: dict[str, Any]
    conversation_id: str | None = None


async def record_streams(session: AsyncSession, records: Sequence[FinishedStream]) -> None:
    """Insert the records in the session's transaction, or replace them: a process that takes a
    stream over may finish it again after the first one recorded it and died before ending the
    log. One statement (an upsert), where an ORM merge would read each row first. (Streams of no
    conversation are recorded through ``recorder.StreamRecorder``, in batches.)"""
    await session.execute(_upsert(session.get_bind().dialect.name), _rows(records))


def insert_streams(conn: Connection, records: Sequence[FinishedStream]) -> None:
    """``record_streams`` on a synchronous connection (``recorder.py``'s SQLite writes)."""
    conn.execute(_upsert(conn.dialect.name), _rows(records))


def _rows(records: Sequence[FinishedStream]) -> list[dict[str, Any]]:
    return [
        {
            "id": r.stream_id,
            "tenant": r.tenant,
            "prompt_tokens": int(r.usage.get("prompt_tokens", 0)),
            "cached_tokens": int(r.usage.get("cached_tokens", 0)),
            "completion_tokens": int(r.usage.get("completion_tokens", 0)),
            "kind": r.kind,
            "model": r.model,
            "conversation_id": r.conversation_id,
            "finish_reason": r.finish_reason,
            "text": r.text,
            "usage": r.usage,
            "created_at": utcnow(),
        }
        for r in records
    ]


@functools.cache
def _upsert(dialect: str) -> Any:
    """The statement, built once per dialect (the values come as parameters). On the table, not
    the ORM class: a Core statement, so several records go as one executemany without the ORM's
    bulk-insert bookkeeping."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(cast(Table, StreamRecord.__table__))
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
