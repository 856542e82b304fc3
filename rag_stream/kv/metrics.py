"""Connector counters for ``/metrics``.

The connector runs inside vLLM's engine processes, so it publishes its counters in Redis
(``<prefix>:stats``, summed over every engine sharing the prefix) and the service reads them.
"""

from __future__ import annotations

from typing import Any

from rag_stream.kv.store import DEFAULT_PREFIX, index_key, stats_key, total_key

COUNTERS = (
    "blocks_saved",
    "bytes_saved",
    "blocks_loaded",
    "bytes_loaded",
    "blocks_evicted",
    "lookup_blocks",
    "hit_blocks",
    "load_failures",
    "saves_dropped",
)


async def kv_stats(redis: Any, prefix: str = DEFAULT_PREFIX) -> dict[str, int | float]:
    """Counters since the prefix was created, plus what is stored now and the hit rate.

    ``redis`` is a ``redis.asyncio.Redis``. ``hit_rate`` is hit blocks over looked-up blocks
    (full prompt blocks past the engine's own prefix cache).
    """
    pipe = redis.pipeline(transaction=False)
    pipe.hgetall(stats_key(prefix))
    pipe.get(total_key(prefix))
    pipe.zcard(index_key(prefix))
    raw, total, count = await pipe.execute()
    values = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
    stats: dict[str, int | float] = {name: values.get(name, 0) for name in COUNTERS}
    stats["stored_bytes"] = int(total or 0)
    stats["stored_blocks"] = int(count)
    lookups = stats["lookup_blocks"]
    stats["hit_rate"] = stats["hit_blocks"] / lookups if lookups else 0.0
    return stats
