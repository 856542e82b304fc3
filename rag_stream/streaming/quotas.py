"""Per-tenant and per-key limits that hold across every process sharing the Redis.

- ``requests_per_minute``: a counter per API key and clock minute (``INCR`` + expiry); past the
  limit a request gets a 429 whose ``Retry-After`` is the rest of the minute.
- ``per_tenant_active``: a sorted set per tenant of the streams it generates, each member
  scored with the moment it lapses. A process refreshes the members it holds every few
  seconds and removes them when its streams end; a process that dies leaves members that lapse
  within ``hold_ttl_ms`` (30 s), so a crash never locks a tenant out for good.

Both are checked before any work is done (see ``Admission.ticket``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from rag_stream.errors import EventLogUnavailable, TooManyRequests

log = logging.getLogger(__name__)


# KEYS[1] the tenant's set; ARGV: now ms, lapse ms, limit, member, key ttl ms
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""


class Quotas:
    def __init__(
        self,
        redis: Redis,
        prefix: str,
        per_tenant_active: int | None,
        requests_per_minute: int | None,
        on_reject: Callable[[str], None] = lambda _reason: None,
        hold_ttl_ms: int = 30_000,
    ) -> None:
        self._redis = redis
        self._ttl_ms = hold_ttl_ms
        self._prefix = prefix
        self.per_tenant_active = per_tenant_active
        self.requests_per_minute = requests_per_minute
        self._on_reject = on_reject
        self._take = redis.register_script(_TAKE)
        self._held: dict[str, str] = {}  # member -> tenant set key
        self._refresher: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()

    async def count_request(self, key_id: str) -> None:
        """Count one request of ``key_id``; TooManyRequests past the per-minute limit."""
        limit = self.requests_per_minute
        if limit is None:
            return
        now = time.time()
        counter = f"{self._prefix}:rate:{key_id}:{int(now // 60)}"
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.incr(counter)
                pipe.expire(counter, 120)
                count, _ = await pipe.execute()
        except RedisError as exc:
            raise EventLogUnavailable(f"rate limiting needs Redis, unavailable: {exc}") from exc
        if int(count) > limit:
            self._on_reject("rate_limit")
            raise TooManyRequests(
                f"this API key made more than {limit} requests this minute "
                "(limits.requests_per_minute); retry after the time in Retry-After",
                retry_after_s=max(1, 60 - int(now % 60)),
            )

    async def hold(self, tenant: str, retry_after_s: int) -> str | None:
        """Take one of the tenant's active-stream places; its member id (None: no limit).
        TooManyRequests when the tenant has ``per_tenant_active`` streams generating."""
        limit = self.per_tenant_active
        if limit is None:
            return None
        key = f"{self._prefix}:tenant-active:{tenant}"
        member = uuid.uuid4().hex
        now = int(time.time() * 1000)
        try:
            taken = await self._take(
                keys=[key], args=[now, now + self._ttl_ms, limit, member, self._ttl_ms * 2]
            )
        except RedisError as exc:
            raise EventLogUnavailable(f"tenant limits need Redis, unavailable: {exc}") from exc
        if not taken:
            self._on_reject("tenant_active")
            raise TooManyRequests(
                f"this tenant already has {limit} streams generating "
                "(limits.per_tenant_active); retry when one ends",
                retry_after_s=retry_after_s,
            )
        self._held[member] = key
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.create_task(self._refresh(), name="tenant-holds")
        return member

    def release(self, member: str | None) -> None:
        """Give a place back (from synchronous code: the removal runs in the background)."""
        if member is None or (key := self._held.pop(member, None)) is None:
            return
        task = asyncio.get_running_loop().create_task(self._remove(key, member))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _remove(self, key: str, member: str) -> None:
        try:
            await self._redis.zrem(key, member)
        except RedisError as exc:  # it lapses on its own within the hold TTL
            log.warning("tenant limits: could not release a place (%s); it lapses", exc)

    async def _refresh(self) -> None:
        while self._held:
            await asyncio.sleep(self._ttl_ms / 1000 / 3)
            lapse = int(time.time() * 1000) + self._ttl_ms
            held = list(self._held.items())
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    # Not only extended: written again. A refresh late by more than the TTL
                    # (an overloaded process) finds its places lapsed and removed; its streams
                    # are still generating, so they count again from now.
                    for member, key in held:
                        pipe.zadd(key, {member: lapse})
                        pipe.pexpire(key, self._ttl_ms * 2)
                    await pipe.execute()
                # a place released while that ran may have been written back after its removal
                for member, key in held:
                    if member not in self._held:
                        await self._remove(key, member)
            except RedisError as exc:
                log.warning("tenant limits: refresh failed (%s); retrying", exc)

    async def close(self) -> None:
        for member in list(self._held):
            self.release(member)
        tasks = [t for t in (self._refresher, *self._pending) if t is not None]
        if self._refresher is not None:
            self._refresher.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
