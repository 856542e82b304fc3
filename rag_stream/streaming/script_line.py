"""One Redis connection of its own for the call every engine step makes: the event log's append.

redis-py runs a few layers of Python for each command: the pool (a condition, a lock, a timeout
and its observability records to lend a connection, more to take it back), the retry wrapper,
and the encoding of every argument in Python. A profile of the stub engine stepping as vLLM does
counted about 160 function calls an append. The append is one ``EVALSHA`` a step for all of a
process's streams (``flusher.py``), sent by one flush at a time, so it needs no pool: the line
takes one of the pool's connections for good (it counts towards ``streaming.redis_pool_size``
and closes as the pool's others do) and sends its calls packed by hiredis in C. The replies
are read by redis-py's own parser, and an error reply raises its exception, as for any
command.

A connection that fails under a call is closed and the call sent once more on a new one, as the
pool's retry does for every other command (``redis_conn.pool_options``: after a restart of Redis
each idle connection is dead); Redis that no longer has the script (restarted empty, or flushed)
is given it again. Both resends are safe for the append, which names the event it follows.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

Call = tuple[Sequence[str], Sequence[str]]  # (KEYS, ARGV) of one call of the script


class ScriptLine:
    """Calls of one Lua script on a connection of its own. Not for concurrent use: one caller
    at a time (the flusher), several calls of one caller pipelined in one write."""

    def __init__(self, redis: Redis, script: str, timeout_s: float | None = None) -> None:
        """``timeout_s``: how long a run waits for Redis (the pool's socket timeout if None)."""
        self._redis = redis
        self._script = script
        self._sha = hashlib.sha1(script.encode()).hexdigest()
        self._conn: AbstractConnection | None = None
        self._timeout_s = timeout_s
        self._busy = False

    async def run(self, calls: Sequence[Call]) -> list[Any]:
        """The script's reply to each call, in order; a failed call raises (RedisError)."""
        if self._busy:
            raise RuntimeError("ScriptLine is one caller's: a call is already in flight")
        self._busy = True
        try:
            # (hiredis's stub types the command as a tuple of one element)
            packed = [
                hiredis.pack_command(("EVALSHA", self._sha, len(keys), *keys, *args))  # type: ignore[arg-type]
                for keys, args in calls
            ]
            reconnected = loaded = False
            while True:
                try:
                    return await self._send(packed)
                except (RedisConnectionError, RedisTimeoutError):
                    if self._conn is not None:
                        await self._conn.disconnect(nowait=True)  # the next send reconnects
                    if reconnected:
                        raise
                    reconnected = True
                except NoScriptError:
                    if loaded:
                        raise
                    await self._redis.script_load(self._script)
                    loaded = True
        finally:
            self._busy = False

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
        failed: ResponseError | None = None
        try:
            async with asyncio.timeout(self._timeout_s):
                await conn.send_packed_command(packed, check_health=False)
                for _ in packed:  # every reply is read, so that the connection stays in step
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:
                        failed = failed or exc
        except TimeoutError:
            raise RedisTimeoutError(f"no answer from Redis in {self._timeout_s} s") from None
        if failed is not None:
            raise failed
        return replies
