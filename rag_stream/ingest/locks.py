"""In-process locks keyed by string, so one process never embeds the same upload twice.

They only order the work of one process; between processes the database's unique constraints
decide (see ``rag_stream.ingest.writer``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager


class KeyedLocks:
    """One ``asyncio.Lock`` per key, created on first use and dropped when nobody needs it."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    @asynccontextmanager
    async def hold(self, keys: Iterable[str]) -> AsyncIterator[None]:
        ordered = sorted(set(keys))  # one global order: no deadlock between two holders
        for key in ordered:
            self._users[key] = self._users.get(key, 0) + 1
            self._locks.setdefault(key, asyncio.Lock())
        held: list[str] = []
        try:
            for key in ordered:
                await self._locks[key].acquire()
                held.append(key)
            yield
        finally:
            for key in reversed(held):
                self._locks[key].release()
            for key in ordered:
                self._users[key] -= 1
                if not self._users[key]:
                    del self._users[key], self._locks[key]
