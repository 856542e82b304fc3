"""A short soak: a burst of mixed traffic (every kind of stream, resumes, cancels, clients
leaving mid-stream, a job, uploads and deletes), after which the server holds what it held
before. The long version, with memory slopes, is scripts/soak.py (docs/reliability.md).

What it proves, each against a baseline taken after a first, identical burst (so pools that
grow to their working size on first use have done so):
- no file descriptor left open (other than Redis and database pool connections, counted
  apart and bounded by their pools);
- no Redis connection beyond the pool and the presence connection, and none Redis does not
  list as a client of the server;
- no Redis key without an expiry at any point, and the keys back to the baseline once the
  finished streams' retention has passed;
- SQL rows exactly as asked for: one ``streams`` row per stream, a conversation and two
  messages per answer, the jobs and documents that were not deleted;
- every stream read whole and in order (checked by the traffic itself), and every stream a
  client left ended by itself;
- once the server stops, none of its keys left in Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import REDIS_URL, SESSION_PREFIX, STUB_DELAY_S, ServerFactory
from tests.support.pg import postgres_database
from tests.support.probes import Probe, RedisProbe
from tests.support.server import ServerProcess
from tests.support.traffic import Traffic, TrafficConfig, engine_model, seed_kb, wait_until

PREFIX = f"{SESSION_PREFIX}-soak"
KB = "soak"
POOL = 8  # Redis connections the server may open (plus its presence connection)
RETENTION_S = 3  # finished streams' logs expire this soon, so "back to baseline" is quick
ABANDON_S = 2
USERS = 6
BURST_S = 12
TRAFFIC = TrafficConfig(short_tokens=(10, 120), long_tokens=1500, answer_tokens=24)


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    yield from postgres_database("rag_stream_soak")


@pytest.fixture(scope="module")
def server(server_factory: ServerFactory, database: str) -> Iterator[ServerProcess]:
    server = server_factory(
        stub_delay_s=STUB_DELAY_S,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_DATABASE_URL=database,
        RAG_STREAM_STREAMING__KEY_PREFIX=PREFIX,
        RAG_STREAM_STREAMING__RETENTION_S=str(RETENTION_S),
        RAG_STREAM_STREAMING__ABANDON_AFTER_S=str(ABANDON_S),
        RAG_STREAM_STREAMING__REDIS_POOL_SIZE=str(POOL),
        RAG_STREAM_LIMITS__MAX_TOKENS="4000",
        # the tenant limit's keys come and go with every stream; exercise them
        RAG_STREAM_LIMITS__PER_TENANT_ACTIVE="1000",
        # one warm parse worker at most, so the process tree has the same shape after each burst
        RAG_STREAM_INGEST__PARSE_WORKERS="1",
    )
    yield server
    server.stop()
    probe = RedisProbe(REDIS_URL, PREFIX)
    probe.delete_all()
    probe.close()


async def _burst(server: ServerProcess, seed: int, probe: Probe) -> tuple[Traffic, list[str]]:
    """One burst of traffic; meanwhile, every key seen without an expiry."""
    model = await engine_model(server.url)
    no_ttl: set[str] = set()
    async with Traffic([server.url], KB, model, seed=seed, config=TRAFFIC) as traffic:

        async def watch() -> None:
            while True:
                no_ttl.update(await asyncio.to_thread(probe.redis.keys_without_ttl))
                await asyncio.sleep(1)

        watcher = asyncio.create_task(watch())
        try:
            await traffic.run(BURST_S, USERS)
            # at least one of each action that matters here, whatever the dice said
            for name in ("cancel", "disconnect", "resume", "job", "upload", "delete_document"):
                await traffic.act(name)
            await traffic.check_abandoned(timeout_s=60)
            await traffic.check_deleted()
        finally:
            watcher.cancel()
    return traffic, sorted(no_ttl)


async def _settled(probe: Probe, keys: dict[str, int]) -> dict[str, Any]:
    """Once no stream runs and the keys are back to ``keys`` (or a timeout): a snapshot."""

    async def back() -> bool:
        return await asyncio.to_thread(probe.redis.key_census) == keys

    await wait_until(back, timeout_s=RETENTION_S + 30)
    await asyncio.sleep(1)  # the server closes the sockets of the client that just left
    return await probe.snapshot()


async def test_after_a_burst_of_mixed_traffic_the_server_holds_what_it_held_before(
    server: ServerProcess, database: str
) -> None:
    redis = RedisProbe(REDIS_URL, PREFIX)
    probe = Probe({"server": server.proc.pid}, redis, database, db_port=5432)
    await seed_kb(server.url, KB, documents=2)
    idle_keys = await asyncio.to_thread(redis.key_census)
    assert set(idle_keys) == {"proc:*"}, idle_keys  # only the server's presence

    warm, warm_no_ttl = await _burst(server, seed=1, probe=probe)
    baseline = await _settled(probe, idle_keys)

    traffic, no_ttl = await _burst(server, seed=2, probe=probe)
    after = await _settled(probe, idle_keys)

    ledger = traffic.ledger
    print("burst:", ledger.summary())
    print("baseline:", baseline["processes"], "after:", after["processes"])
    assert not warm.ledger.problems and not ledger.problems, [
        *warm.ledger.problems,
        *ledger.problems,
    ]
    assert ledger.actions["cancel"] and ledger.actions["disconnect"] and ledger.actions["job"]
    assert warm_no_ttl == [] and no_ttl == []
    assert after["running_streams"] == 0
    assert after["redis_key_shapes"] == idle_keys
    before, now = baseline["processes"]["server"], after["processes"]["server"]
    assert now["other_fds"] <= before["other_fds"], (before, now)
    assert now["redis_sockets"] <= POOL + 1, now
    assert now["redis_clients"] == now["redis_sockets"], now  # none Redis does not know
    assert after["sql_rows"] == ledger.expected_rows(baseline["sql_rows"])

    # and once the server stops, nothing of it stays in Redis (its presence record goes
    # once its leases would have lapsed)
    server.stop()

    async def gone() -> bool:
        return not await asyncio.to_thread(redis.keys)

    assert await wait_until(gone, timeout_s=15, every_s=0.5) is not None, redis.key_census()
    redis.close()
