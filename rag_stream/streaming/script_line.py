"""Connections of the event log's own for its Lua scripts: the append every engine step makes,
and the few writes every stream makes (its creation, its plan, its end).

redis-py runs a few layers of Python for each command: the pool (a condition, a lock, a timeout
and its observability records to lend a connection, more to take it back), the retry wrapper, a
task for each write's timeout, and the encoding of every argument in Python. A profile of the
stub engine stepping as vLLM does counted about 160 function calls an append; behind the real
engine, a stream's three other writes cost the API process about a quarter of a millisecond
each. A line takes one of the pool's connections for good (it counts towards
``streaming.redis_pool_size`` and closes as the pool's others do) and sends its calls packed by
hiredis in C; redis-py's own parser reads the replies, and an error reply is that call's
exception, as for any command.

- ``ScriptLine``: one caller at a time, several calls of that caller pipelined in one write
  (the flusher's appends: one run a step, for all of a process's streams).
- ``SharedLine``: any number of callers; what they ask for while a write is out goes together
  in the next one (group commit), each caller getting its own reply.

A connection that fails under a run is closed and the run sent once more on a new one, as the
pool's retry does for every other command (``redis_conn.pool_options``: after a restart of Redis
each idle connection is dead); calls of a script Redis no longer has (restarted empty, or
flushed) are sent again once it is given the script. The log's scripts are written for this:
each can run twice and leave what one run leaves.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


@dataclass(frozen=True)
class LuaScript:
    source: str

    @cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


Arg = str | int  # (hiredis packs an int as its decimal digits)
Call = tuple[LuaScript, Sequence[str], Sequence[Arg]]  # a script, its KEYS and its ARGV


class ScriptLine:
    """Calls of Lua scripts on a connection of its own. Not for concurrent use: one caller at a
    time, several calls of one caller pipelined in one write."""

    def __init__(self, redis: Redis, timeout_s: float | None = None) -> None:
        """``timeout_s``: how long a run waits for Redis (the pool's socket timeout if None)."""
        self._redis = redis
        self._conn: AbstractConnection | None = None
        self._timeout_s = timeout_s
        self._busy = False

    async def run(self, calls: Sequence[Call]) -> list[Any]:
        """The reply to each call, in order; a failed call raises (RedisError)."""
        replies = await self.run_each(calls)
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        return replies

    async def run_each(self, calls: Sequence[Call]) -> list[Any]:
        """The reply to each call, in order, a failed call's being its ResponseError; a line
        that cannot reach Redis raises (ConnectionError, TimeoutError)."""
        if self._busy:
            raise RuntimeError("ScriptLine is one caller's: a call is already in flight")
        self._busy = True
        try:
            replies = await self._resending(calls)
            missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
            if missing:
                for script in {calls[i][0] for i in missing}:
                    await self._redis.script_load(script.source)
                again = await self._resending([calls[i] for i in missing])
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
            return replies
        finally:
            self._busy = False

    async def _resending(self, calls: Sequence[Call]) -> list[Any]:
        # (hiredis's stub types the command as a tuple of one element)
        packed = [
            hiredis.pack_command(("EVALSHA", script.sha, len(keys), *keys, *args))  # type: ignore[arg-type]
            for script, keys, args in calls
        ]
        try:
            return await self._send(packed)
        except (RedisConnectionError, RedisTimeoutError):
            if self._conn is not None:
                await self._conn.disconnect(nowait=True)  # the next send reconnects
        return await self._send(packed)

    async def _send(self, packed: list[bytes]) -> list[Any]:
        conn = self._conn
        if conn is None:
            pool = self._redis.connection_pool
            conn = self._conn = await pool.get_connection()  # type: ignore[no-untyped-call]
            # one limit for the whole run, not one a write and one a read (redis-py's wait_for
            # starts a task for every write)
            if self._timeout_s is None:
                self._timeout_s = conn.socket_timeout
            conn.socket_timeout = None
        replies: list[Any] = []
        try:
            async with asyncio.timeout(self._timeout_s):
                await conn.send_packed_command(packed, check_health=False)
                for _ in packed:  # every reply is read, so that the connection stays in step
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
        except TimeoutError:
            raise RedisTimeoutError(f"no answer from Redis in {self._timeout_s} s") from None
        return replies


class SharedLine:
    """A ScriptLine any number of callers share. A call waits while a write is out; then
    every call that came meanwhile goes in one write. The writes are made by a task of the
    line's own, so a caller that leaves (cancelled) takes nobody else's call with it."""

    def __init__(self, line: ScriptLine) -> None:
        self._line = line
        self._queue: list[tuple[Call, asyncio.Future[Any]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def call(self, script: LuaScript, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """The script's reply; its error reply raises (RedisError), as does a Redis away."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(((script, keys, args), reply))
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_queued(), name="redis-shared-line")
        return await reply

    async def _send_queued(self) -> None:
        batch: list[tuple[Call, asyncio.Future[Any]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    replies = await self._line.run_each([c for c, _ in batch])
                except Exception as exc:
                    replies = [exc] * len(batch)
                for (_, reply), value in zip(batch, replies, strict=True):
                    if reply.done():  # (its caller left)
                        continue
                    if isinstance(value, Exception):
                        reply.set_exception(value)
                    else:
                        reply.set_result(value)
                batch = []
        finally:
            self._sender = None
            for _, reply in [*batch, *self._queue]:  # (cancelled: shutting down)
                reply.cancel()
            self._queue = []
