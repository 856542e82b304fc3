"""The column types every database answers alike (SQLite and the real PostgreSQL, migrated):
datetimes come back aware in UTC, and text never carries a NUL character into the database."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.store.db import create_db
from rag_stream.store.models import Conversation, KnowledgeBase, Message, StreamRecord
from rag_stream.store.streams import FinishedStream, record_streams

# The fixture comes from tests/support/kb_stack.py; test arguments reuse its name.
from tests.support.kb_stack import db_url  # noqa: F401


@pytest.fixture
async def sessions(db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:  # noqa: F811
    engine, made = create_db(db_url)
    try:
        yield made
    finally:
        await engine.dispose()


def _name() -> str:
    return f"kb-{uuid.uuid4().hex[:8]}"


async def test_datetimes_come_back_aware_in_utc(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    paris_summer = timezone(timedelta(hours=2))
    written = datetime(2024, 6, 1, 14, 30, 5, 123456, tzinfo=paris_summer)
    async with sessions() as session:
        kb = KnowledgeBase(name=_name(), created_at=written)
        defaulted = KnowledgeBase(name=_name())
        session.add_all([kb, defaulted])
        await session.commit()
    async with sessions() as session:
        read = await session.get(KnowledgeBase, kb.id)
        fresh = await session.get(KnowledgeBase, defaulted.id)
    assert read is not None and fresh is not None
    assert read.created_at == written  # the same moment...
    assert read.created_at.utcoffset() == timedelta(0)  # ...given in UTC
    assert read.created_at.isoformat() == "2024-06-01T12:30:05.123456+00:00"
    assert fresh.created_at.utcoffset() == timedelta(0)
    assert abs(fresh.created_at - datetime.now(UTC)) < timedelta(minutes=5)


async def test_datetimes_compare_as_moments_in_queries(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A bound value in another offset is converted before it reaches SQL (SQLite compares
    the stored text, so an unconverted 14:30+02:00 would sort after 13:00 UTC)."""
    async with sessions() as session:
        conv = Conversation(created_at=datetime(2024, 6, 1, 13, 0, tzinfo=UTC))
        session.add(conv)
        await session.commit()
        later_elsewhere = datetime(2024, 6, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))
        found = await session.scalar(
            select(Conversation.id).where(
                Conversation.id == conv.id, Conversation.created_at > later_elsewhere
            )
        )
    assert found == conv.id  # 13:00 UTC is after 12:30 UTC


async def test_naive_datetimes_already_stored_read_as_utc(
    sessions: async_sessionmaker[AsyncSession],
    db_url: str,  # noqa: F811
) -> None:
    """Rows written before this type (SQLite kept only the wall-clock text) keep their moment."""
    if not db_url.startswith("sqlite"):
        pytest.skip("PostgreSQL stores timestamptz: there are no naive rows")
    name = _name()
    async with sessions() as session:
        await session.execute(
            text(
                "INSERT INTO knowledge_bases (id, name, created_at) "
                "VALUES (:id, :name, '2024-06-01 12:30:05.000000')"
            ),
            {"id": uuid.uuid4().hex, "name": name},
        )
        await session.commit()
        kb = await session.scalar(select(KnowledgeBase).where(KnowledgeBase.name == name))
    assert kb is not None
    assert kb.created_at == datetime(2024, 6, 1, 12, 30, 5, tzinfo=UTC)


async def test_nul_characters_are_stored_as_replacement_characters(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """PostgreSQL refuses U+0000 in text; every database stores U+FFFD instead, one for one
    (so character offsets into stored text stay right)."""
    name = _name()
    async with sessions() as session:
        conv = Conversation()
        session.add(conv)
        await session.flush()
        session.add(
            Message(conversation_id=conv.id, seq=0, role="user", content="a\x00b\x00", usage={})
        )
        session.add(KnowledgeBase(name=name, description="\x00"))
        await session.commit()
    async with sessions() as session:
        message = await session.scalar(select(Message).where(Message.conversation_id == conv.id))
        kb = await session.scalar(select(KnowledgeBase).where(KnowledgeBase.name == name))
    assert message is not None and message.content == "a\ufffdb\ufffd"
    assert kb is not None and kb.description == "\ufffd"


async def test_lookups_by_a_value_with_nul_find_nothing(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session:
        for ref in ("\x00", "kb\x00", "\x00" * 40):
            query = select(KnowledgeBase).where(
                (KnowledgeBase.id == ref) | (KnowledgeBase.name == ref)
            )
            assert (await session.scalars(query)).all() == []
            assert await session.get(Conversation, ref) is None


async def test_a_stream_record_is_written_once_and_replaced_by_a_second_finish(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A takeover may finish a stream its first process already recorded: one row, the last
    finish's values, NULs replaced as everywhere else, on every database."""
    sid = uuid.uuid4().hex
    for reason, answer in (("length", "ab"), ("stop", "a\x00c")):
        record = FinishedStream(
            tenant="t",
            stream_id=sid,
            kind="generate",
            model="m",
            finish_reason=reason,
            text=answer,
            usage={"n": 1},
        )
        async with sessions() as session:
            await record_streams(session, [record])
            await session.commit()
    async with sessions() as session:
        rows = (await session.scalars(select(StreamRecord).where(StreamRecord.id == sid))).all()
    assert [(r.finish_reason, r.text, r.usage) for r in rows] == [("stop", "a\ufffdc", {"n": 1})]
    assert rows[0].created_at.tzinfo is not None
