"""Finished streams' records (rag_stream/store/recorder.py) on the real SQLite and PostgreSQL:
streams that end together are written in one transaction, each caller returns once its record
is committed, and a record that cannot be written fails its own stream only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from rag_stream.store.db import create_db, sqlite_file_engine
from rag_stream.store.models import StreamRecord
from rag_stream.store.recorder import StreamRecorder
from rag_stream.store.streams import FinishedStream
from tests.support.kb_stack import db_url  # noqa: F401


@dataclass
class Db:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    sqlite_file: Engine | None  # what the app writes records with on SQLite (db.py)

    def recorder(self) -> StreamRecorder:
        return StreamRecorder(self.sessions, self.sqlite_file)  # as create_app makes it

    def commits(self) -> list[int]:
        """A list that grows by one at every commit of the recorder's (on SQLite, of its
        synchronous engine: none there would mean the records went another way)."""
        seen: list[int] = []
        writes = self.sqlite_file or self.engine.sync_engine
        event.listen(writes, "commit", lambda _conn: seen.append(1))
        return seen


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Db]:  # noqa: F811
    engine, sessions = create_db(db_url)
    sqlite_file = sqlite_file_engine(engine)
    assert (sqlite_file is not None) == db_url.startswith("sqlite")
    try:
        yield Db(engine, sessions, sqlite_file)
    finally:
        if sqlite_file is not None:
            sqlite_file.dispose()
        await engine.dispose()


def _record(n: int, **changes: Any) -> FinishedStream:
    fields: dict[str, Any] = {
        "tenant": "t",
        "stream_id": f"s{n}",
        "kind": "generate",
        "model": "m",
        "finish_reason": "length",
        "text": f"text {n}",
        "usage": {"prompt_tokens": n, "completion_tokens": 2 * n},
    }
    return FinishedStream(**(fields | changes))


async def _rows(sessions: async_sessionmaker[AsyncSession]) -> dict[str, StreamRecord]:
    async with sessions() as session:
        found = (await session.execute(select(StreamRecord))).scalars().all()
    return {r.id: r for r in found}


async def test_streams_that_end_together_are_one_transaction(db: Db) -> None:
    sessions = db.sessions
    recorder = db.recorder()
    commits = db.commits()
    await asyncio.gather(*(recorder.save(_record(n)) for n in range(40)))
    # every caller returned after its record was committed: all 40 are there, in one commit
    rows = await _rows(sessions)
    assert sorted(rows) == sorted(f"s{n}" for n in range(40))
    assert len(commits) == 1
    assert rows["s7"].text == "text 7"
    assert (rows["s7"].prompt_tokens, rows["s7"].completion_tokens) == (7, 14)
    # one alone is written at once, in a transaction of its own
    await recorder.save(_record(40))
    assert len(commits) == 2
    # a stream finished again (after a takeover) replaces its record
    await asyncio.gather(
        recorder.save(_record(3, text="again", finish_reason="stop")),
        recorder.save(_record(41)),
    )
    rows = await _rows(sessions)
    assert (rows["s3"].text, rows["s3"].finish_reason) == ("again", "stop")
    assert len(rows) == 42
    await recorder.close()


async def test_a_record_that_cannot_be_written_fails_its_stream_only(db: Db) -> None:
    sessions = db.sessions
    recorder = db.recorder()
    bad = _record(1, usage={"prompt_tokens": 1, "note": object()})  # not JSON
    results = await asyncio.gather(
        recorder.save(_record(0)),
        recorder.save(bad),
        recorder.save(_record(2)),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], Exception)
    assert sorted(await _rows(sessions)) == ["s0", "s2"]


async def test_a_caller_that_leaves_still_has_its_record_written(db: Db) -> None:
    sessions = db.sessions
    recorder = db.recorder()
    saving = asyncio.ensure_future(recorder.save(_record(5)))
    await asyncio.sleep(0)  # handed over: the writer task has it
    saving.cancel()  # the stream's task is cancelled (shutdown)
    with pytest.raises(asyncio.CancelledError):
        await saving
    await recorder.close()  # what the app's shutdown waits for
    assert list(await _rows(sessions)) == ["s5"]


async def test_records_waiting_when_the_writer_is_cancelled_are_not_left_hanging(db: Db) -> None:
    """The loop going away cancels the writer mid-commit: its callers must not wait for ever."""
    recorder = db.recorder()
    writing = asyncio.Event()

    async def stuck(records: list[FinishedStream]) -> None:
        writing.set()
        await asyncio.Event().wait()  # a commit that never returns

    recorder._write = stuck  # type: ignore[method-assign]
    first = asyncio.ensure_future(recorder.save(_record(1)))
    await asyncio.wait_for(writing.wait(), 5)
    second = asyncio.ensure_future(recorder.save(_record(2)))  # waits behind the stuck batch
    await asyncio.sleep(0)
    assert recorder._writer is not None
    recorder._writer.cancel()
    for saving in (first, second):
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(saving, 5)


async def test_an_unreachable_database_fails_the_whole_batch_at_once() -> None:
    """No record-by-record retry when the database cannot be reached: each would wait out its
    own connection attempt before the streams behind it heard anything."""
    engine, sessions = create_db("postgresql+asyncpg://postgres@127.0.0.1:1/test")  # refused
    opened: list[int] = []

    def counting() -> AsyncSession:
        opened.append(1)
        return sessions()

    recorder = StreamRecorder(counting)  # type: ignore[arg-type]
    try:
        results = await asyncio.gather(
            *(recorder.save(_record(n)) for n in range(5)), return_exceptions=True
        )
    finally:
        await engine.dispose()
    assert all(isinstance(r, OSError | DBAPIError) for r in results), results
    assert len(opened) == 1  # one attempt for the batch
