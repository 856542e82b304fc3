"""KV blocks saved to Redis by one engine are restored by fresh engines (real vLLM, real Redis).

Engines are expensive to start, so each scenario is one module fixture that runs one engine
(or server) to the end and returns what it saw, and the tests check those outcomes. A scenario
that fails errors only the tests that use it. Start-up is most of an engine's cost: ``engines``
starts each one while the ones before it work, three alive at most, the first ones while an
earlier module's tests run (``tests.support.kv_engines``, ``kv_engines_start`` in conftest).

All of them use one redis-server of the module's own, which the last scenario stops:

- ``reference`` (C: tiny model, connector off) recomputes every prompt;
- ``saved`` (A: tiny, connector on) generates, saving prompt and generated blocks;
- ``served`` (a vLLM OpenAI server with the connector) restores A's blocks and saves a prompt;
- ``restored`` (B: fresh, connector on, no prefix caching) restores A's blocks, including the
  generated blocks of A's long answer (a crash takeover), and the server's prompt; one block
  is evicted mid-load;
- ``other_model`` (S: a second random-weight tiny model of the very same layout, connector on,
  same prefix) must not load the tiny model's blocks;
- ``redis_down`` (B again, once everything else has read the store) keeps working while Redis
  is down, and saves and restores again once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from rag_stream.kv.metrics import kv_stats
from rag_stream.kv.store import index_key, stats_key, total_key
from tests.support import kv_eviction
from tests.support.ahead import Ahead
from tests.support.kv_engines import (
    PREFIX,
    RUNS_FIRST,
    ApiServer,
    KvEngines,
    Outcome,
    PrivateRedis,
    Probe,
    settle,
    wait_for,
)

pytestmark = pytest.mark.engine

BLOCK = 128
GEN = 24
LENGTHS = (300, 600, 1100)
LONG = ("len300", "len600", "len1100")
STORY = 200  # tokens of the long answer
CUT = 190  # the stream "crashed" after this many; the takeover prompt is everything so far


def make_prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


PROMPTS = {
    **{f"len{n}": make_prompt(n, n) for n in LENGTHS},
    "evict": make_prompt(11, 700),
    "story": make_prompt(7, 200),
    "server": make_prompt(13, 500),
    "down": make_prompt(17, 400),
}


def takeover_prompt(story: Outcome) -> list[int]:
    return [*PROMPTS["story"], *story["token_ids"][:CUT]]


def full_blocks(n_tokens: int) -> int:
    """Tokens a fresh engine can restore for a prompt of n tokens (the last is computed)."""
    return (n_tokens - 1) // BLOCK * BLOCK


def saved_blocks(n_prompt: int, n_generated: int) -> int:
    """KV exists for every position but the last generated token; every full block is saved."""
    return (n_prompt + n_generated - 1) // BLOCK


# What A generates: tokens per prompt, and the blocks that makes it save.
A_ANSWERS = {**dict.fromkeys((*LONG, "evict"), GEN), "story": STORY}
A_SAVES = sum(saved_blocks(len(PROMPTS[name]), n) for name, n in A_ANSWERS.items())


def stats(client: redis.Redis, prefix: str) -> dict[str, int]:
    raw: dict[bytes, bytes] = client.hgetall(stats_key(prefix))  # type: ignore[assignment]
    return {k.decode(): int(v) for k, v in raw.items()}


@pytest.fixture(scope="module")
def kv_engines(kv_engines_start: KvEngines) -> Iterator[KvEngines]:
    """The module's redis-server and engines (tests/support/kv_engines.py), started ahead by
    the session (tests/support/session_servers.py) while an earlier module ran, or here; all
    gone at the end."""
    yield kv_engines_start
    kv_engines_start.close()


@pytest.fixture(scope="module")
def store(kv_engines: KvEngines) -> PrivateRedis:
    """The Redis every engine here saves to and loads from: the module's own redis-server,
    because ``redis_down`` stops it (and it comes back empty)."""
    return kv_engines.store


@pytest.fixture(scope="module")
def store_client(store: PrivateRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(store.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def engines(kv_engines: KvEngines) -> Ahead:
    """Every engine of the module, each started while the ones before it work."""
    return kv_engines.ahead


@pytest.fixture(scope="module")
def reference(engines: Ahead) -> dict[str, Outcome]:
    """C: every prompt recomputed with the connector off, and the takeover of its long answer."""
    out: dict[str, Outcome] = {}
    with engines.use("C", Probe) as c:
        for name, ids in PROMPTS.items():
            out[name] = c.generate(f"c-{name}", ids, STORY if name == "story" else GEN)
        out["takeover"] = c.generate("c-takeover", takeover_prompt(out["story"]), STORY - CUT)
    return out


@pytest.fixture(scope="module")
def saved(engines: Ahead, store_client: redis.Redis) -> dict[str, Any]:
    """A: the first engine on a fresh store; its answers and the counters once saves landed."""
    out: dict[str, Any] = {}
    with engines.use("A", Probe) as a:
        for name, max_tokens in A_ANSWERS.items():
            out[name] = a.generate(f"a-{name}", PROMPTS[name], max_tokens)
        settle(lambda: stats(store_client, PREFIX).get("blocks_saved", 0) >= A_SAVES)
        time.sleep(1)  # let any unexpected extra write land before counting
        out["stats"] = stats(store_client, PREFIX)
    return out


@pytest.fixture(scope="module")
def served(
    engines: Ahead,
    store_client: redis.Redis,
    saved: dict[str, Any],  # A's blocks are in Redis before the server is asked
) -> dict[str, Any]:
    """The vLLM OpenAI server: a prompt A saved, then a new prompt, and how many blocks it saved."""
    out: dict[str, Any] = {}
    with engines.use("server", ApiServer) as server:
        out["len600"] = server.complete(PROMPTS["len600"], GEN)
        before = stats(store_client, PREFIX).get("blocks_saved", 0)
        out["server"] = server.complete(PROMPTS["server"], GEN)
        expected = before + saved_blocks(len(PROMPTS["server"]), GEN)
        settle(lambda: stats(store_client, PREFIX).get("blocks_saved", 0) >= expected)
        out["saved"] = stats(store_client, PREFIX).get("blocks_saved", 0) - before
    return out


def run_first(request: pytest.FixtureRequest, scenario: str) -> None:
    """Run the scenarios ``scenario`` comes after; if one fails, its own tests report it and
    everything else is still checked."""
    for name in RUNS_FIRST[scenario]:
        with contextlib.suppress(Exception):
            request.getfixturevalue(name)


@pytest.fixture(scope="module")
def restored(
    request: pytest.FixtureRequest,
    engines: Ahead,
    store_client: redis.Redis,
    saved: dict[str, Any],
) -> dict[str, Any]:
    """B: a fresh engine on A's blocks, with a connector that evicts one block mid-load. It
    stays alive for ``redis_down``."""
    run_first(request, "restored")
    out: dict[str, Any] = {}
    b = engines.get("B", Probe)
    for name in (*LONG, "server"):
        out[name] = b.generate(f"b-{name}", PROMPTS[name], GEN)
    out["takeover"] = b.generate("b-takeover", takeover_prompt(saved["story"]), STORY - CUT)
    failures = stats(store_client, PREFIX).get("load_failures", 0)
    out["evict"] = b.generate(f"{kv_eviction.EVICT_PREFIX}1", PROMPTS["evict"], GEN)
    settle(lambda: stats(store_client, PREFIX).get("load_failures", 0) > failures)
    out["evict_load_failures"] = stats(store_client, PREFIX).get("load_failures", 0) - failures
    return out


@pytest.fixture(scope="module")
def store_stats(
    saved: dict[str, Any], restored: dict[str, Any], store: PrivateRedis
) -> dict[str, float]:
    """``kv_stats`` of the store once A, the server and B used it (``redis_down`` empties it)."""

    async def read() -> dict[str, float]:
        client = AsyncRedis.from_url(store.url)
        try:
            return dict(await kv_stats(client, PREFIX))
        finally:
            await client.aclose()

    return asyncio.run(read())


@pytest.fixture(scope="module")
def other_model(
    engines: Ahead,
    store_client: redis.Redis,
    saved: dict[str, Any],  # the tiny model's blocks are there to be found
) -> dict[str, Any]:
    """S: SmolLM2 on the tiny model's prefix, asked a prompt whose blocks are stored."""
    bookkeeping = {f(PREFIX).encode() for f in (stats_key, index_key, total_key)}
    keys = store_client.scan_iter(f"{PREFIX}:*", count=1000)
    out: dict[str, Any] = {"blocks_stored": sum(1 for key in keys if key not in bookkeeping)}
    with engines.use("S", Probe) as s:
        hits = stats(store_client, PREFIX).get("hit_blocks", 0)
        out["len600"] = s.generate("s-len600", PROMPTS["len600"], GEN)
        out["new_hits"] = stats(store_client, PREFIX).get("hit_blocks", 0) - hits
    return out


@pytest.fixture(scope="module")
def redis_down(
    request: pytest.FixtureRequest,
    engines: Ahead,
    store: PrivateRedis,
    store_client: redis.Redis,
) -> dict[str, Any]:
    """B again: the same prompt while Redis is up, down, back (empty), and once it saved again."""
    run_first(request, "redis_down")

    def blocks_saved() -> int:
        return stats(store_client, PREFIX).get("blocks_saved", 0)

    out: dict[str, Any] = {}
    try:
        b = engines.get("B", Probe)
        before = blocks_saved()
        out["up"] = b.generate("d-1", PROMPTS["down"], GEN)
        wait_for(lambda: blocks_saved() > before)
        store.stop()
        out["down"] = b.generate("d-2", PROMPTS["down"], GEN)
        store.start()  # without persistence: empty, its counters from 0
        time.sleep(6)  # the store waits 5 s before trying a Redis that failed
        out["recovered"] = b.generate("d-3", PROMPTS["down"], GEN)
        settle(lambda: blocks_saved() > 0)
        out["restored"] = b.generate("d-4", PROMPTS["down"], GEN)
    finally:
        engines.stop("B")
    return out


def test_fresh_engine_restores_prompt_blocks_and_matches_recompute(
    saved: dict[str, Any], restored: dict[str, Any], reference: dict[str, Outcome]
) -> None:
    for name in LONG:
        assert restored[name]["cached_tokens"] == full_blocks(len(PROMPTS[name]))
        assert reference[name]["cached_tokens"] == 0
        assert restored[name]["token_ids"] == reference[name]["token_ids"], name
        assert saved[name]["token_ids"] == reference[name]["token_ids"], name


def test_every_full_prompt_and_generated_block_is_saved_once(saved: dict[str, Any]) -> None:
    assert saved["stats"].get("blocks_saved", 0) == A_SAVES
    assert saved["stats"].get("blocks_loaded", 0) == 0


def test_crash_takeover_restores_generated_blocks(
    saved: dict[str, Any], restored: dict[str, Any], reference: dict[str, Outcome]
) -> None:
    takeover = takeover_prompt(saved["story"])
    # The reference recomputed the takeover from its own answer: the same prompt.
    assert takeover_prompt(reference["story"]) == takeover
    # 390 tokens: three full blocks, the third made only of generated tokens.
    assert restored["takeover"]["cached_tokens"] == full_blocks(len(takeover)) == 384
    assert restored["takeover"]["token_ids"] == reference["takeover"]["token_ids"]
    # and the takeover continues exactly where the uninterrupted run went
    assert restored["takeover"]["token_ids"] == saved["story"]["token_ids"][CUT:STORY]


def test_block_evicted_mid_load_falls_back_to_recompute(
    restored: dict[str, Any], reference: dict[str, Outcome]
) -> None:
    assert restored["evict"]["token_ids"] == reference["evict"]["token_ids"]
    assert restored["evict_load_failures"] >= 1


def test_openai_server_with_connector_loads_and_saves(
    served: dict[str, Any], restored: dict[str, Any], reference: dict[str, Outcome]
) -> None:
    # blocks written by the in-process engine are read by the server ...
    assert served["len600"]["cached_tokens"] == full_blocks(600)
    assert served["len600"]["token_ids"] == reference["len600"]["token_ids"]
    # ... and blocks the server wrote are read by a fresh in-process engine
    assert served["saved"] == saved_blocks(500, GEN)
    assert restored["server"]["cached_tokens"] == full_blocks(500)
    assert restored["server"]["token_ids"] == reference["server"]["token_ids"]


def test_blocks_of_another_model_are_never_loaded(other_model: dict[str, Any]) -> None:
    assert other_model["blocks_stored"] > 0  # the tiny model's blocks were there to be found
    assert other_model["len600"]["cached_tokens"] == 0
    assert other_model["new_hits"] == 0


def test_engine_survives_redis_down_and_recovers(
    redis_down: dict[str, Any], reference: dict[str, Outcome]
) -> None:
    expected = reference["down"]["token_ids"]
    assert redis_down["up"]["token_ids"] == expected
    assert redis_down["down"]["cached_tokens"] == 0
    assert redis_down["down"]["token_ids"] == expected
    assert redis_down["recovered"]["token_ids"] == expected
    assert redis_down["restored"]["cached_tokens"] == full_blocks(400)
    assert redis_down["restored"]["token_ids"] == expected


def test_kv_stats_reports_saved_loaded_and_hit_rate(store_stats: dict[str, float]) -> None:
    assert store_stats["blocks_saved"] >= A_SAVES
    assert store_stats["blocks_loaded"] > 0 and store_stats["bytes_loaded"] > 0
    assert 0 < store_stats["hit_rate"] < 1
    assert store_stats["stored_blocks"] > 0 and store_stats["stored_bytes"] > 0
