"""KV blocks saved to Redis by one engine are restored by fresh engines (real vLLM, real Redis).

Engines are expensive to start, so each scenario is one module fixture that runs one engine
(or server) to the end and returns what it saw, and the tests check those outcomes. A scenario
that fails errors only the tests that use it. Start-up is most of an engine's cost: ``engines``
starts each one while the one before works, two alive at most (``tests.support.ahead``).

All of them use one redis-server of the module's own, which the last scenario stops:

- ``reference`` (C: tiny model, connector off) recomputes every prompt;
- ``saved`` (A: tiny, connector on) generates, saving prompt and generated blocks;
- ``served`` (a vLLM OpenAI server with the connector) restores A's blocks and saves a prompt;
- ``restored`` (B: fresh, connector on, no prefix caching) restores A's blocks, including the
  generated blocks of A's long answer (a crash takeover), and the server's prompt; one block
  is evicted mid-load;
- ``other_model`` (S: SmolLM2, connector on, same prefix) must not load the tiny model's blocks;
- ``redis_down`` (B again, once everything else has read the store) keeps working while Redis
  is down, and saves and restores again once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from rag_stream.kv.config import transfer_config_json
from rag_stream.kv.metrics import kv_stats
from rag_stream.kv.probe import ProbeProcess
from rag_stream.kv.store import index_key, stats_key, total_key
from rag_stream.settings import load_settings
from tests.support import kv_eviction
from tests.support.ahead import Ahead
from tests.support.server import ROOT, free_port

pytestmark = pytest.mark.engine

BLOCK = 128
GEN = 24
LENGTHS = (300, 600, 1100)
LONG = ("len300", "len600", "len1100")
STORY = 200  # tokens of the long answer
CUT = 190  # the stream "crashed" after this many; the takeover prompt is everything so far

Outcome = dict[str, Any]


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


def settle(predicate: Callable[[], bool], timeout_s: float = 30) -> bool:
    """Wait for asynchronous saves or counters; the tests assert on what was reached."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30) -> None:
    if not settle(predicate, timeout_s):
        raise TimeoutError("condition not reached")


def connector_on(prefix: str, url: str) -> tuple[str, ...]:
    return ("--kv-url", url, "--kv-prefix", prefix)


class Probe(ProbeProcess):
    """A probe engine (``rag_stream.kv.probe``) that stops like the other processes here."""

    def stop(self) -> None:
        self.close()


def probe(
    log: Path, model: Path, *args: str, env: dict[str, str] | None = None
) -> Callable[[], Probe]:
    """What starts a probe engine on ``model``."""
    return lambda: Probe(["--model", str(model), *args], str(log), env)


class PrivateRedis:
    """A redis-server of our own on a free port, so the test can stop it."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: _pings(client), 10)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class ApiServer:
    """``python -m vllm.entrypoints.openai.api_server`` with the connector."""

    def __init__(self, model: Path, kv_config: str, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = str(model)
        self._log = open(log_path, "ab")  # noqa: SIM115
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "vllm.entrypoints.openai.api_server"),
                *("--model", self.model, "--dtype", "float32", "--enforce-eager"),
                *("--max-model-len", "4608", "--kv-cache-memory-bytes", str(512 << 20)),
                *("--gpu-memory-utilization", "0.3", "--seed", "0"),
                *("--port", str(self.port), "--kv-transfer-config", kv_config),
                "--enable-prompt-tokens-details",
            ],
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"api_server exited; see {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"api_server not ready; see {self.log_path}")

    def complete(self, prompt_ids: list[int], max_tokens: int) -> Outcome:
        body = {
            "model": self.model,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
        }
        response = httpx.post(self.url + "/v1/completions", json=body, timeout=300)
        response.raise_for_status()
        data = response.json()
        details = data["usage"].get("prompt_tokens_details") or {}
        return {
            "token_ids": data["choices"][0]["token_ids"],
            "cached_tokens": details.get("cached_tokens") or 0,
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


PREFIX = "test-kv"  # the store is the module's own: no other user to keep apart from

# The engine of each scenario fixture, in the order the tests below first ask for them.
# ``restored`` runs ``served`` first; ``redis_down`` runs on B once the others read the store.
SCENARIOS = {
    "saved": "A",
    "served": "server",
    "restored": "B",
    "reference": "C",
    "other_model": "S",
    "redis_down": "B",
}
# What must run before: B also reads the blocks the server saved; stopping Redis loses every
# block the others read, and the counters ``store_stats`` reads.
RUNS_FIRST = {
    "restored": ("served",),
    "redis_down": ("restored", "other_model", "store_stats"),
}


def wanted_engines(request: pytest.FixtureRequest) -> list[str]:
    """The engines the selected tests of this module need, in the order they ask for them (a
    run of one test starts no engine it does not need)."""
    asked: set[str] = set()
    for item in request.session.items:
        if item.path == request.node.path:
            asked.update(getattr(item, "fixturenames", ()))
    for scenario in reversed(RUNS_FIRST):
        if scenario in asked:
            asked.update(RUNS_FIRST[scenario])
    return list(dict.fromkeys(e for name, e in SCENARIOS.items() if name in asked))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    """The Redis every engine here saves to and loads from: the module's own redis-server,
    because ``redis_down`` stops it (and it comes back empty)."""
    server = PrivateRedis(tmp_path_factory.mktemp("kv-redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def store_client(store: PrivateRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(store.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-logs")


@pytest.fixture(scope="module")
def engines(
    request: pytest.FixtureRequest,
    tiny_model: Path,
    smollm2_path: Path,
    logs: Path,
    store: PrivateRedis,
) -> Iterator[Ahead]:
    """Every engine of the module, each started while the one before it works."""
    on = connector_on(PREFIX, store.url)
    server_kv = load_settings(kv={"enabled": True, "redis_url": store.url, "key_prefix": PREFIX})
    # B runs without prefix caching: each of its prompts is new to it anyway, and then every
    # cached token of its Redis-down run is one loaded from Redis.
    evicting = (*kv_eviction.probe_args(), "--no-prefix-caching")
    starters: dict[str, Callable[[], Any]] = {
        "A": probe(logs / "A.log", tiny_model, *on),
        "server": lambda: ApiServer(
            tiny_model, transfer_config_json(server_kv), logs / "api_server.log"
        ),
        "B": probe(logs / "B.log", tiny_model, *on, *evicting, env=kv_eviction.probe_env()),
        "C": probe(logs / "C.log", tiny_model),
        "S": probe(logs / "S.log", smollm2_path, *on),
    }
    ahead = Ahead(starters, wanted_engines(request))
    yield ahead
    ahead.close()


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
