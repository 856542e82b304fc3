"""Per-tenant and per-key limits on the real Redis, as two processes sharing it see them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from rag_stream.errors import TooManyRequests
from rag_stream.streaming.admission import Admission
from rag_stream.streaming.quotas import Quotas
from tests.conftest import REDIS_URL


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    client = Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


def _quotas(redis: Redis, prefix: str, **kw: object) -> Quotas:
    return Quotas(redis, prefix, kw.pop("active", 2), kw.pop("rpm", None), **kw)  # type: ignore[arg-type]


async def test_a_tenants_limit_holds_across_processes_and_per_tenant(redis: Redis) -> None:
    prefix = f"rs-quota-{uuid.uuid4().hex[:8]}"
    one, two = _quotas(redis, prefix), _quotas(redis, prefix)  # two processes' views
    first = await one.hold("acme", 3)
    await two.hold("acme", 3)
    with pytest.raises(TooManyRequests) as caught:
        await one.hold("acme", 3)
    assert caught.value.retry_after_s == 3 and "limits.per_tenant_active" in caught.value.message
    assert await two.hold("other", 3) is not None  # a limit per tenant
    one.release(first)
    await asyncio.sleep(0.05)  # the removal runs in the background
    assert await two.hold("acme", 3) is not None
    await one.close()
    await two.close()


async def test_a_dead_processs_places_lapse_and_a_live_ones_do_not(redis: Redis) -> None:
    prefix = f"rs-quota-{uuid.uuid4().hex[:8]}"
    dead = _quotas(redis, prefix, hold_ttl_ms=600)
    alive = _quotas(redis, prefix, hold_ttl_ms=600, active=3)
    await dead.hold("acme", 1)
    await dead.hold("acme", 1)
    dead._refresher.cancel()  # type: ignore[union-attr]  # the process is gone: no refresh
    await alive.hold("acme", 1)
    with pytest.raises(TooManyRequests):
        await alive.hold("acme", 1)
    await asyncio.sleep(1.0)  # past the TTL: the dead one's places lapsed, the live one's not
    await alive.hold("acme", 1)
    await alive.hold("acme", 1)
    with pytest.raises(TooManyRequests):
        await alive.hold("acme", 1)
    await alive.close()


async def test_requests_per_minute_count_per_key(redis: Redis) -> None:
    prefix = f"rs-quota-{uuid.uuid4().hex[:8]}"
    rejected: list[str] = []
    quotas = Quotas(redis, prefix, None, 5, on_reject=rejected.append)
    for _ in range(5):
        await quotas.count_request("key-a")
    try:
        await quotas.count_request("key-a")
    except TooManyRequests as exc:
        assert 1 <= exc.retry_after_s <= 60
        assert "limits.requests_per_minute" in exc.message
    else:  # the clock minute turned between the calls: the counter started again
        await quotas.count_request("key-a")
    await quotas.count_request("key-b")
    assert rejected in (["rate_limit"], [])


async def test_an_admission_refused_by_the_tenant_limit_gives_its_ticket_back(
    redis: Redis,
) -> None:
    quotas = _quotas(redis, f"rs-quota-{uuid.uuid4().hex[:8]}", active=1)
    admission = Admission(max_active=4, max_queued=0, retry_after_s=2, quotas=quotas)
    async with admission.ticket("interactive", "acme") as held:
        assert held.hold is not None
        with pytest.raises(TooManyRequests):
            async with admission.ticket("interactive", "acme"):
                pass
        assert admission.queued == 1  # only the first ticket counts
    held.release()
    await asyncio.sleep(0.05)
    async with admission.ticket("interactive", "acme") as again:
        assert again.hold is not None
    again.release()
    await quotas.close()


async def test_a_place_that_lapsed_while_its_stream_ran_counts_again(redis: Redis) -> None:
    # An overloaded process refreshes late: its place lapsed and another process's take removed
    # it. The stream is still generating, so the next refresh puts the place back: the tenant is
    # at its limit again, not one stream under it for as long as that stream runs.
    prefix = f"rs-quota-{uuid.uuid4().hex[:8]}"
    slow = _quotas(redis, prefix, hold_ttl_ms=300, active=1)
    other = _quotas(redis, prefix, hold_ttl_ms=300, active=1)
    try:
        member = await slow.hold("acme", 1)
        key = f"{prefix}:tenant-active:acme"
        await redis.zrem(key, member)  # what a late refresh finds: lapsed and gone
        await asyncio.sleep(0.3)  # refreshes every 100 ms
        assert await redis.zscore(key, member) is not None
        with pytest.raises(TooManyRequests):
            await other.hold("acme", 1)
        slow.release(member)
        await asyncio.sleep(0.25)  # a refresh that raced the release does not bring it back
        assert await redis.zscore(key, member) is None
    finally:
        await slow.close()
        await other.close()
