"""Redis: a URL in production, otherwise an embedded real redis-server.

The embedded server is a real redis-server process started and stopped with the service (and
killed with it): ``embedded_redis.py``. It listens on a unix socket and keeps its data under
data_dir.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from redis.asyncio import BlockingConnectionPool, Redis, UnixDomainSocketConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from rag_stream.settings import Settings
from rag_stream.streaming.embedded_redis import EmbeddedRedis

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class RedisHandle:
    client: Redis
    embedded: EmbeddedRedis | None = None  # the server, if we started one

    async def close(self) -> None:
        await self.client.aclose()
        if self.embedded is not None:
            await anyio.to_thread.run_sync(self.embedded.stop)


def pool_options(settings: Settings) -> dict[str, Any]:
    """A bounded pool that makes a command wait for a free connection rather than fail; its
    connections are named after this process (``CLIENT LIST`` shows whose they are).

    A command that meets a connection closed under it is sent once more on a new one: after a
    restart of Redis every idle connection of the pool is dead, and without this each gave one
    request a 503 ("Connection closed by server") although Redis was back. (redis-py retries
    so by default only in the pool it makes itself.) A write sent twice (its reply lost, not the
    write) does no harm: appends and ends name the event they follow and are recognised when
    they landed, the rest set keys or members; at worst a rate counter counts that one request
    twice."""
    return {
        "retry": Retry(NoBackoff(), 1),
        "max_connections": settings.streaming.redis_pool_size,
        "timeout": settings.streaming.redis_pool_timeout_s,
        "socket_connect_timeout": 3,
        "client_name": f"rag-stream:{socket.gethostname()}:{os.getpid()}",
    }


async def retry_redis(call: Callable[[], Awaitable[T]], retries: int, what: str) -> T:
    """``call()``, sent again up to ``retries`` times while Redis fails (0.2, 0.4, 0.6 s …
    apart: a restart from its append-only file takes a second or two); the last error is
    raised. For the writes a stream cannot go on without: appends, plans and ends, which are
    all safe to repeat."""
    for attempt in range(retries + 1):
        try:
            return await call()
        except RedisError as exc:
            if attempt == retries:
                raise
            log.warning("%s failed (%s), attempt %d of %d", what, exc, attempt + 1, retries + 1)
            await asyncio.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


async def open_redis(settings: Settings) -> RedisHandle:
    if settings.redis_url:
        pool = BlockingConnectionPool.from_url(settings.redis_url, **pool_options(settings))
        return RedisHandle(Redis(connection_pool=pool))

    server = await anyio.to_thread.run_sync(EmbeddedRedis.start, settings.redis_dir)
    log.info("redis: embedded redis-server on %s", server.socket_path)
    pool = BlockingConnectionPool(
        connection_class=UnixDomainSocketConnection,
        path=server.socket_path,
        **pool_options(settings),
    )
    return RedisHandle(Redis(connection_pool=pool), embedded=server)
