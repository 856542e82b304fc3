"""KV blocks in Redis: binary values, a byte cap with oldest-first eviction, and counters.

Layout under one key prefix ``P`` (shared by every engine that uses it):

- ``P:<namespace>:<block hash hex>``: one block, all layers, raw bytes behind a small header,
  with a TTL.
- ``P:index``: sorted set of stored block keys (member ``<bytes>:<key>``, score = last write
  or load in ms). With ``P:bytes`` (their total size) it enforces the cap: a write that takes
  the total over ``max_bytes`` deletes the least recently used blocks. Members older than the
  TTL are dropped from the index first, since Redis has already expired their keys.
- ``P:stats``: counters read by ``rag_stream.kv.metrics.kv_stats`` for ``/metrics``.

This client is synchronous: it runs inside vLLM's engine processes, not on an event loop.
Every call treats Redis as optional. A connection error is logged, the store stays quiet for
``retry_after_s``, and callers see "nothing stored" / "not saved", so vLLM recomputes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import redis

log = logging.getLogger(__name__)

MAGIC = b"RKV1"
DEFAULT_PREFIX = "rag-stream:kv"

# Store blocks (KEYS[3:]) with SET NX PX, index them, then evict least recently used blocks
# until the total fits under the cap. ARGV: ttl_ms, cap, now_ms, values...
_PUT_LUA = """
local ttl, cap, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local index, total, stats = KEYS[1], KEYS[2], KEYS[3]
local function size_of(member) return tonumber(string.match(member, '^(%d+):')) end
local function key_of(member) return string.match(member, '^%d+:(.*)$') end
local expired = redis.call('ZRANGEBYSCORE', index, '-inf', now - ttl)
for _, m in ipairs(expired) do redis.call('DECRBY', total, size_of(m)) end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', index, '-inf', now - ttl) end
local stored, bytes, evicted = 0, 0, 0
for i = 4, #KEYS do
  local value = ARGV[i]
  if redis.call('SET', KEYS[i], value, 'PX', ttl, 'NX') then
    local n = string.len(value)
    redis.call('ZADD', index, now, n .. ':' .. KEYS[i])
    redis.call('INCRBY', total, n)
    stored, bytes = stored + 1, bytes + n
  end
end
while tonumber(redis.call('GET', total) or '0') > cap do
  local oldest = redis.call('ZPOPMIN', index, 1)
  if #oldest == 0 then redis.call('SET', total, 0) break end
  redis.call('DEL', key_of(oldest[1]))
  redis.call('DECRBY', total, size_of(oldest[1]))
  evicted = evicted + 1
end
if stored > 0 then
  redis.call('HINCRBY', stats, 'blocks_saved', stored)
  redis.call('HINCRBY', stats, 'bytes_saved', bytes)
end
if evicted > 0 then redis.call('HINCRBY', stats, 'blocks_evicted', evicted) end
return {stored, evicted}
"""


def stats_key(prefix: str) -> str:
    return f"{prefix}:stats"


def index_key(prefix: str) -> str:
    return f"{prefix}:index"


def total_key(prefix: str) -> str:
    return f"{prefix}:bytes"


class RedisBlockStore:
    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        namespace: str,
        ttl_s: int,
        max_bytes: int,
        timeout_s: float = 2.0,
        retry_after_s: float = 5.0,
    ) -> None:
        self.prefix = prefix
        self.namespace = namespace
        self.ttl_ms = ttl_s * 1000
        self.max_bytes = max_bytes
        self.retry_after_s = retry_after_s
        self._client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
        self._put = self._client.register_script(_PUT_LUA)
        self._down_until = 0.0

    def key(self, block_hash: bytes) -> str:
        return f"{self.prefix}:{self.namespace}:{block_hash.hex()}"

    def header(self) -> bytes:
        """Written before every value; a load checks it (guards against foreign writers)."""
        return MAGIC + self.namespace.encode()

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, what: str, exc: Exception) -> None:
        if self.available:
            log.warning(
                "kv store: Redis %s failed (%s); recomputing, retry in %.0f s",
                what,
                exc,
                self.retry_after_s,
            )
        self._down_until = time.monotonic() + self.retry_after_s

    def count_leading(self, hashes: Sequence[bytes]) -> int:
        """How many of ``hashes``, from the first, are stored (0 if Redis is unreachable)."""
        if not hashes or not self.available:
            return 0
        try:
            pipe = self._client.pipeline(transaction=False)
            for h in hashes:
                pipe.exists(self.key(h))
            found = pipe.execute()
        except redis.RedisError as exc:
            self._failed("lookup", exc)
            return 0
        n = 0
        for hit in found:
            if not hit:
                break
            n += 1
        return n

    def get_many(self, hashes: Sequence[bytes]) -> list[bytes | None]:
        """Values in order; None for a missing block or when Redis is unreachable."""
        if not hashes:
            return []
        if not self.available:
            return [None] * len(hashes)
        keys = [self.key(h) for h in hashes]
        try:
            values = cast(list[bytes | None], self._client.mget(keys))
        except redis.RedisError as exc:
            self._failed("load", exc)
            return [None] * len(hashes)
        return values

    def touch(self, hashes_and_sizes: Iterable[tuple[bytes, int]]) -> None:
        """Mark loaded blocks as recently used: new TTL and a fresh place in the index."""
        if not self.available:
            return
        now = int(time.time() * 1000)
        try:
            pipe = self._client.pipeline(transaction=False)
            for h, size in hashes_and_sizes:
                key = self.key(h)
                pipe.pexpire(key, self.ttl_ms)
                pipe.zadd(index_key(self.prefix), {f"{size}:{key}": now}, xx=True)
            pipe.execute()
        except redis.RedisError as exc:
            self._failed("touch", exc)

    def put_many(self, blocks: Sequence[tuple[bytes, bytes]]) -> int:
        """Store (hash, value) pairs not stored yet; returns how many were written."""
        if not blocks or not self.available:
            return 0
        keys = [index_key(self.prefix), total_key(self.prefix), stats_key(self.prefix)]
        keys += [self.key(h) for h, _ in blocks]
        args: list[Any] = [self.ttl_ms, self.max_bytes, int(time.time() * 1000)]
        args += [value for _, value in blocks]
        try:
            stored, _evicted = cast(list[int], self._put(keys=keys, args=args))
        except redis.RedisError as exc:
            self._failed("save", exc)
            return 0
        return int(stored)

    def add_stats(self, counts: Mapping[str, int]) -> None:
        counts = {k: v for k, v in counts.items() if v}
        if not counts or not self.available:
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for name, n in counts.items():
                pipe.hincrby(stats_key(self.prefix), name, n)
            pipe.execute()
        except redis.RedisError as exc:
            self._failed("stats", exc)

    def close(self) -> None:
        self._client.close()
