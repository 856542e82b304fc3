"""The Redis block store against a real Redis: binary values, the cap, TTL, and Redis down."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from rag_stream.kv.metrics import kv_stats
from rag_stream.kv.store import RedisBlockStore
from tests.conftest import REDIS_URL
from tests.support.server import free_port


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"test-kvstore:{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{name}:*"):
        client.delete(key)


def make_store(prefix: str, **kw: int) -> RedisBlockStore:
    return RedisBlockStore(
        REDIS_URL,
        prefix=prefix,
        namespace="ns1",
        ttl_s=kw.get("ttl_s", 60),
        max_bytes=kw.get("max_bytes", 1 << 30),
    )


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_values_round_trip_byte_for_byte(prefix: str) -> None:
    store = make_store(prefix)
    value = bytes(range(256)) * 64
    assert store.put_many([(h(1), value), (h(2), value[::-1])]) == 2
    assert store.get_many([h(1), h(2), h(3)]) == [value, value[::-1], None]


def test_a_stored_block_is_not_written_again(prefix: str) -> None:
    store = make_store(prefix)
    assert store.put_many([(h(1), b"x" * 100)]) == 1
    assert store.put_many([(h(1), b"y" * 100)]) == 0
    assert store.get_many([h(1)]) == [b"x" * 100]


def test_leading_run_stops_at_the_first_missing_block(prefix: str) -> None:
    store = make_store(prefix)
    store.put_many([(h(i), b"v") for i in (0, 1, 3)])
    assert store.count_leading([h(0), h(1), h(2), h(3)]) == 2
    assert store.count_leading([h(2), h(3)]) == 0


def test_memory_cap_evicts_least_recently_used_blocks(prefix: str) -> None:
    store = make_store(prefix, max_bytes=3000)
    for i in range(3):
        store.put_many([(h(i), bytes(1000))])
        time.sleep(0.005)
    store.touch([(h(0), 1000)])  # block 0 was just loaded: it becomes the newest
    store.put_many([(h(3), bytes(1000)), (h(4), bytes(1000))])
    present = [v is not None for v in store.get_many([h(i) for i in range(5)])]
    assert present == [True, False, False, True, True]
    client = redis.Redis.from_url(REDIS_URL)
    assert int(client.get(f"{prefix}:bytes") or 0) == 3000
    assert client.zcard(f"{prefix}:index") == 3


def test_blocks_expire_after_the_ttl_and_leave_the_index(prefix: str) -> None:
    store = make_store(prefix, ttl_s=1)
    store.put_many([(h(1), bytes(500))])
    time.sleep(1.2)
    assert store.count_leading([h(1)]) == 0
    store.put_many([(h(2), bytes(100))])  # a write also forgets expired index entries
    client = redis.Redis.from_url(REDIS_URL)
    assert int(client.get(f"{prefix}:bytes") or 0) == 100


def test_redis_down_means_nothing_stored_and_no_error() -> None:
    store = RedisBlockStore(
        f"redis://127.0.0.1:{free_port()}/0",
        prefix="x",
        namespace="ns",
        ttl_s=60,
        max_bytes=1 << 20,
        timeout_s=0.5,
    )
    assert store.count_leading([h(1)]) == 0
    started = time.monotonic()
    assert store.get_many([h(1), h(2)]) == [None, None]
    assert store.put_many([(h(1), b"v")]) == 0
    store.add_stats({"blocks_loaded": 1})
    assert time.monotonic() - started < 0.1  # after one failure it stops trying for a while
    assert not store.available


def test_kv_stats_sums_the_counters(prefix: str) -> None:
    store = make_store(prefix)
    store.put_many([(h(1), bytes(10)), (h(2), bytes(30))])
    store.add_stats({"lookup_blocks": 4, "hit_blocks": 1, "blocks_loaded": 1, "bytes_loaded": 10})

    async def read() -> dict[str, int | float]:
        client = AsyncRedis.from_url(REDIS_URL)
        try:
            return await kv_stats(client, prefix)
        finally:
            await client.aclose()

    result = asyncio.run(read())
    assert result["blocks_saved"] == 2 and result["bytes_saved"] == 40
    assert result["stored_blocks"] == 2 and result["stored_bytes"] == 40
    assert result["hit_rate"] == 0.25
    assert result["blocks_loaded"] == 1
