"""A thousand requests at once in open mode, and a database pool that runs dry.

Found by scripts/bench_readers.py (1,000 readers, each starting its own stream): in open mode
every request asked the database whether a key exists yet, so the pool's 15 connections ran out
for 30 s and some requests got a bare 500 (SQLAlchemy's pool TimeoutError, which was not taken
for an unavailable database). Now one query at a time asks, and its answer holds for a second;
and a pool that stays busy past its timeout is a 503 `database_unavailable`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from rag_stream.store.db import create_db, unavailable
from rag_stream.store.keys import KeyRing, create_key

# ruff: noqa: F811
from tests.support.kb_stack import db_url  # noqa: F401


class CountingSessions:
    """A session factory that counts the sessions opened."""

    def __init__(self, inner: async_sessionmaker[AsyncSession]) -> None:
        self._inner = inner
        self.opened = 0

    def __call__(self) -> Any:
        self.opened += 1
        return self._inner()


@pytest.fixture
async def sessions(db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine, made = create_db(db_url)
    try:
        yield made
    finally:
        await engine.dispose()


async def test_many_requests_in_open_mode_ask_the_database_once(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    counting = CountingSessions(sessions)
    ring = KeyRing(counting, always_required=False)  # type: ignore[arg-type]
    answers = await asyncio.gather(*(ring.required() for _ in range(500)))
    assert answers == [False] * 500
    assert counting.opened == 1  # was 500: one pool connection each
    async with sessions() as session:
        await create_key(session, "acme", None)
        await session.commit()
    await asyncio.sleep(KeyRing.OPEN_RECHECK_S + 0.1)
    answers = await asyncio.gather(*(ring.required() for _ in range(50)))
    assert answers == [True] * 50  # the first key closes the open mode within the second
    assert counting.opened == 2
    await ring.required()
    assert counting.opened == 2  # and it is never asked again


async def test_a_pool_that_stays_busy_is_an_unavailable_database(db_url: str) -> None:
    engine = create_async_engine(db_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    try:
        async with engine.connect():  # the one connection, held
            with pytest.raises(PoolTimeout) as caught:
                async with engine.connect():
                    pass
        error = unavailable(caught.value)
        assert error is not None and error.code == "database_unavailable"
        assert error.status_code == 503
    finally:
        await engine.dispose()
