"""A RedisKVConnector that loses a block between the match and the load (a mid-load eviction).

For requests whose id starts with ``EVICT_PREFIX`` it deletes the middle block of a planned
load from Redis, as an eviction or a TTL expiry would. Tests select it through
``tests.support.kv_eviction`` (this module imports vLLM and torch).
"""

from __future__ import annotations

import redis

from rag_stream.kv.connector import BlockTransfer, RedisKVConnector
from tests.support.kv_eviction import EVICT_PREFIX


class EvictingKVConnector(RedisKVConnector):
    def _plan_load(self, load: BlockTransfer) -> None:
        super()._plan_load(load)
        if load.req_id.startswith(EVICT_PREFIX):
            url = self._kv_transfer_config.kv_connector_extra_config["redis_url"]
            with redis.Redis.from_url(url) as client:
                client.delete(self._store.key(load.hashes[len(load.hashes) // 2]))
