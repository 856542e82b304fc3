"""Per-tenant and per-key limits on the real Redis, as two processes sharing it see them."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import pytest
from redis.asyncio import Redis

from rag_stream.errors import TooManyRequests
from rag_stream.streaming import quotas as quotas_module
from rag_stream.streaming.admission import Admission
from rag_stream.streaming.quotas import Quotas
from tests.conftest import REDIS_URL
from tests.support.waiting import eventually


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    client = Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


def _quotas(redis: Redis, prefix: str, **kw: object) -> Quotas:
    return Quotas(redis, prefix, kw.pop("active", 2), kw.pop("rpm", None), **kw)  # type: ignore[arg-type]


async def _gone(redis: Redis, key: str, member: str | None) -> None:
    """Wait for a released place's removal, which runs in the background."""

    async def removed() -> bool:
        return await redis.zscore(key, member or "") is None

    await eventually(removed, f"the place {member} removed from {key}")


async def _score(redis: Redis, key: str, member: str | None) -> float:
    """When a place lapses (ms), read from the tenant's set; it must be there."""
    assert member is not None
    score = await redis.zscore(key, member)
    assert score is not None, f"no place {member} in {key}"
    return float(score)


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
    await _gone(redis, f"{prefix}:tenant-active:acme", first)
    assert await two.hold("acme", 3) is not None
    await one.close()
    await two.close()


async def test_a_dead_processs_places_lapse_and_a_live_ones_do_not(redis: Redis) -> None:
    prefix = f"rs-quota-{uuid.uuid4().hex[:8]}"
    key = f"{prefix}:tenant-active:acme"
    dead = _quotas(redis, prefix, hold_ttl_ms=600)
    alive = _quotas(redis, prefix, hold_ttl_ms=600, active=3)
    dead_places = [await dead.hold("acme", 1), await dead.hold("acme", 1)]
    dead._refresher.cancel()  # type: ignore[union-attr]  # the process is gone: no refresh
    mine = await alive.hold("acme", 1)
    with pytest.raises(TooManyRequests):
        await alive.hold("acme", 1)
    # wait out the moment the dead one's places lapse (their scores), not a guess at it
    lapse_ms = max([await _score(redis, key, m) for m in dead_places])

    async def lapsed() -> bool:
        return time.time() * 1000 > lapse_ms

    await eventually(lapsed, "the dead process's places past their lapse")
    assert await _score(redis, key, mine) > time.time() * 1000  # refreshed: still live
    await alive.hold("acme", 1)
    await alive.hold("acme", 1)
    with pytest.raises(TooManyRequests):
        await alive.hold("acme", 1)
    await alive.close()


class _Clock:
    """Stands in for the ``time`` module in rag_stream.streaming.quotas: a minute chosen by the
    test, so the six requests cannot straddle a minute boundary."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


async def test_requests_per_minute_count_per_key(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    minute = int(time.time() // 60) * 60
    clock = _Clock(minute + 15.0)  # 15 s into a minute: 45 s of it left
    monkeypatch.setattr(quotas_module, "time", clock)
    prefix = f"rs-quota-{uuid.uuid4().hex[:8]}"
    rejected: list[str] = []
    quotas = Quotas(redis, prefix, None, 5, on_reject=rejected.append)
    for _ in range(5):
        await quotas.count_request("key-a")
    with pytest.raises(TooManyRequests) as caught:
        await quotas.count_request("key-a")
    assert caught.value.retry_after_s == 45  # the rest of the minute
    assert "limits.requests_per_minute" in caught.value.message
    assert rejected == ["rate_limit"]
    await quotas.count_request("key-b")  # a count per key: another key is not held back
    clock.now += 45  # the next minute: key-a's count starts again
    for _ in range(5):
        await quotas.count_request("key-a")
    assert rejected == ["rate_limit"]


async def test_an_admission_refused_by_the_tenant_limit_gives_its_ticket_back(
    redis: Redis,
) -> None:
    prefix = f"rs-quota-{uuid.uuid4().hex[:8]}"
    quotas = _quotas(redis, prefix, active=1)
    admission = Admission(max_active=4, max_queued=0, retry_after_s=2, quotas=quotas)
    async with admission.ticket("interactive", "acme") as held:
        assert held.hold is not None
        with pytest.raises(TooManyRequests):
            async with admission.ticket("interactive", "acme"):
                pass
        assert admission.queued == 1  # only the first ticket counts
    held.release()
    await _gone(redis, f"{prefix}:tenant-active:acme", held.hold)
    async with admission.ticket("interactive", "acme") as again:
        assert again.hold is not None
    again.release()
    await quotas.close()


class _GatedRedis(Redis):
    """A client whose pipelines wait for ``gate`` (when one is set) before they run: the test
    holds a refresh between reading its places and writing them."""

    gate: Callable[[], Awaitable[None]] | None = None

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        gate, run = self.gate, pipe.execute
        if gate is None:
            return pipe

        async def execute(raise_on_error: bool = True) -> Any:
            await gate()
            return await run(raise_on_error)

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


async def test_a_place_that_lapsed_while_its_stream_ran_counts_again(redis: Redis) -> None:
    # An overloaded process refreshes late: its place lapsed and another process's take removed
    # it. The stream is still generating, so the next refresh puts the place back: the tenant is
    # at its limit again, not one stream under it for as long as that stream runs.
    prefix = f"rs-quota-{uuid.uuid4().hex[:8]}"
    gated = cast(_GatedRedis, _GatedRedis.from_url(REDIS_URL))
    slow = _quotas(gated, prefix, hold_ttl_ms=300, active=1)
    other = _quotas(redis, prefix, hold_ttl_ms=300, active=1)
    key = f"{prefix}:tenant-active:acme"
    try:
        member = await slow.hold("acme", 1)
        assert member is not None
        await redis.zrem(key, member)  # what a late refresh finds: lapsed and gone

        async def back() -> bool:
            return await redis.zscore(key, member) is not None

        await eventually(back, "the lapsed place written back by a refresh")  # every 100 ms
        with pytest.raises(TooManyRequests):
            await other.hold("acme", 1)

        # A release that lands while a refresh is writing: the refresh must not bring it back.
        reached, go = asyncio.Event(), asyncio.Event()

        async def hold_the_refresh() -> None:
            reached.set()
            await go.wait()

        gated.gate = hold_the_refresh
        await asyncio.wait_for(reached.wait(), 5)  # the refresh took its places, not written
        slow.release(member)
        await _gone(redis, key, member)  # the release's removal ran first
        go.set()  # now the refresh writes the place back, and must notice
        refresher = slow._refresher
        assert refresher is not None
        await asyncio.wait_for(refresher, 5)  # nothing held: its last round, then it ends
        assert await redis.zscore(key, member) is None
    finally:
        await slow.close()
        await other.close()
        await gated.aclose()
