"""Finished streams' records, written in batches.

Streams that decode in step end in step: a batch of answers of one length ends at one engine
step. Written one by one, each record costs a session, a connection (with SQLite, a thread of
its own), a statement and a commit; here the records that are waiting when the writer comes
round go in one statement and one commit. Nothing waits for company: an idle process writes a
record at once, and records that arrive while a batch is being written form the next one.

With SQLite (a file), a batch is written by a synchronous engine on the same file in a worker
thread (``db.sqlite_file_engine``): one crossing to a thread and back for the batch, where
aiosqlite makes one for each call of the write (measured on its own: 0.6 ms of CPU a record
against 1.3-1.6). PostgreSQL's driver has no thread to cross to; its records go through a
session as before.

A stream's finish still waits for its own record (``save`` returns once it is committed), so a
``done`` event is never sent before its record exists. A batch that fails is written again one
record at a time, so one bad record fails only the stream it belongs to; when the database is
unreachable, every record of the batch fails with that error at once.
"""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.store.db import unavailable
from rag_stream.store.streams import FinishedStream, insert_streams, record_streams

# Records per transaction: bounds how long one commit makes the next records wait
MAX_BATCH = 256


class StreamRecorder:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], sqlite_file: Engine | None = None
    ) -> None:
        """``sqlite_file``: the synchronous engine batches are written with, when the database
        is a SQLite file (``db.sqlite_file_engine``; closed by ``close``)."""
        self._sessions = sessions
        self._sqlite_file = sqlite_file
        self._waiting: list[tuple[FinishedStream, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def save(self, record: FinishedStream) -> None:
        """Record a stream that belongs to no conversation; returns once it is committed."""
        done = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieved)  # (a caller that left does not read its error)
        self._waiting.append((record, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_waiting(), name="stream-records")
        # a caller that is cancelled (shutdown) leaves its record to be written all the same
        await asyncio.shield(done)

    async def close(self) -> None:
        """Wait for the records already handed over."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer
        if self._sqlite_file is not None:
            self._sqlite_file.dispose()

    async def _write_waiting(self) -> None:
        batch: list[tuple[FinishedStream, asyncio.Future[None]]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
                await self._write_batch(batch)
        except asyncio.CancelledError:
            # the loop is going away: nobody is left to wait for these records
            for _, done in [*batch, *self._waiting]:
                done.cancel()
            raise

    async def _write_batch(self, batch: list[tuple[FinishedStream, asyncio.Future[None]]]) -> None:
        try:
            await self._write([record for record, _ in batch])
        except Exception as exc:
            if len(batch) == 1 or unavailable(exc) is not None:
                # an unreachable database fails them all alike, and at once: one record at a
                # time would make the last wait out a connection timeout per record before it
                for _, done in batch:
                    _settle(done, exc)
                return
            for record, done in batch:  # find the record that failed, keep the others
                try:
                    await self._write([record])
                except Exception as one:
                    _settle(done, one)
                else:
                    _settle(done, None)
            return
        for _, done in batch:
            _settle(done, None)

    async def _write(self, records: list[FinishedStream]) -> None:
        if self._sqlite_file is not None:
            await asyncio.to_thread(_write_file, self._sqlite_file, records)
            return
        async with self._sessions() as session:
            await record_streams(session, records)
            await session.commit()


def _write_file(engine: Engine, records: list[FinishedStream]) -> None:
    with engine.begin() as conn:  # (commits at the end of the block)
        insert_streams(conn, records)


def _retrieved(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()


def _settle(done: asyncio.Future[None], exc: BaseException | None) -> None:
    if done.done():
        return
    if exc is None:
        done.set_result(None)
    else:
        done.set_exception(exc)
