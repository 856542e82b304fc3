"""KV blocks saved to Redis by one engine are restored by fresh engines (real vLLM, real Redis).

Engines are expensive to start, so each scenario is one module fixture that runs one engine
(or server) to the end and returns what it saw, and the tests check those outcomes. Only one
engine is alive at a time. A scenario that fails errors only the tests that use it:

- ``reference`` (C: tiny model, connector off) recomputes every prompt;
- ``saved`` (A: tiny, connector on) generates, saving prompt and generated blocks;
- ``served`` (a vLLM OpenAI server with the connector) restores A's blocks and saves a prompt;
- ``restored`` (B: fresh, connector on) restores A's blocks, including the generated blocks of
  A's long answer (a crash takeover), and the server's prompt; one block is evicted mid-load;
- ``other_model`` (S: SmolLM2, connector on, same prefix) must not load the tiny model's blocks;
- ``redis_down`` (D: tiny, connector on a private redis-server) keeps working while it is down.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from rag_stream.kv.config import transfer_config_json
from rag_stream.kv.probe import ProbeProcess
from rag_stream.kv.store import index_key, stats_key, total_key
from rag_stream.settings import load_settings
from tests.conftest import REDIS_URL
from tests.support import kv_eviction
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


def connector_on(prefix: str, url: str = REDIS_URL) -> tuple[str, ...]:
    return ("--kv-url", url, "--kv-prefix", prefix)


@contextlib.contextmanager
def engine(
    logs: Path, name: str, model: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[ProbeProcess]:
    """A fresh probe engine, stopped on the way out (each holds ~3 GB)."""
    probe = ProbeProcess(["--model", str(model), *args], str(logs / f"{name}.log"), env)
    try:
        probe.wait_ready()
        yield probe
    finally:
        probe.close()


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


@pytest.fixture(scope="module")
def kv_prefix() -> Iterator[str]:
    prefix = f"test-kv:{uuid.uuid4().hex[:8]}"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{prefix}:*", count=1000):
        client.delete(key)


@pytest.fixture(scope="module")
def shared() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-logs")


@pytest.fixture(scope="module")
def reference(tiny_model: Path, logs: Path) -> dict[str, Outcome]:
    """C: every prompt recomputed with the connector off, and the takeover of its long answer."""
    out: dict[str, Outcome] = {}
    with engine(logs, "C", tiny_model) as c:
        for name, ids in PROMPTS.items():
            out[name] = c.generate(f"c-{name}", ids, STORY if name == "story" else GEN)
        out["takeover"] = c.generate("c-takeover", takeover_prompt(out["story"]), STORY - CUT)
    return out


@pytest.fixture(scope="module")
def saved(tiny_model: Path, kv_prefix: str, shared: redis.Redis, logs: Path) -> dict[str, Any]:
    """A: the first engine on a fresh prefix; its answers and the counters once saves landed."""
    out: dict[str, Any] = {}
    with engine(logs, "A", tiny_model, *connector_on(kv_prefix)) as a:
        for name, max_tokens in A_ANSWERS.items():
            out[name] = a.generate(f"a-{name}", PROMPTS[name], max_tokens)
        settle(lambda: stats(shared, kv_prefix).get("blocks_saved", 0) >= A_SAVES)
        time.sleep(1)  # let any unexpected extra write land before counting
        out["stats"] = stats(shared, kv_prefix)
    return out


@pytest.fixture(scope="module")
def served(
    tiny_model: Path,
    kv_prefix: str,
    shared: redis.Redis,
    logs: Path,
    saved: dict[str, Any],  # A's blocks are in Redis before the server starts
) -> dict[str, Any]:
    """The vLLM OpenAI server: a prompt A saved, then a new prompt, and how many blocks it saved."""
    settings = load_settings(kv={"enabled": True, "redis_url": REDIS_URL, "key_prefix": kv_prefix})
    server = ApiServer(tiny_model, transfer_config_json(settings), logs / "api_server.log")
    out: dict[str, Any] = {}
    try:
        server.wait_ready()
        out["len600"] = server.complete(PROMPTS["len600"], GEN)
        before = stats(shared, kv_prefix).get("blocks_saved", 0)
        out["server"] = server.complete(PROMPTS["server"], GEN)
        expected = before + saved_blocks(len(PROMPTS["server"]), GEN)
        settle(lambda: stats(shared, kv_prefix).get("blocks_saved", 0) >= expected)
        out["saved"] = stats(shared, kv_prefix).get("blocks_saved", 0) - before
    finally:
        server.stop()
    return out


@pytest.fixture(scope="module")
def restored(
    request: pytest.FixtureRequest,
    tiny_model: Path,
    kv_prefix: str,
    shared: redis.Redis,
    logs: Path,
    saved: dict[str, Any],
) -> dict[str, Any]:
    """B: a fresh engine on A's prefix, with a connector that evicts one block mid-load."""
    # The server runs first, so that this engine also reads the blocks the server saved. If it
    # fails, its own test reports it and everything else here is still checked.
    with contextlib.suppress(Exception):
        request.getfixturevalue("served")
    out: dict[str, Any] = {}
    args = (*connector_on(kv_prefix), *kv_eviction.probe_args())
    with engine(logs, "B", tiny_model, *args, env=kv_eviction.probe_env()) as b:
        for name in (*LONG, "server"):
            out[name] = b.generate(f"b-{name}", PROMPTS[name], GEN)
        out["takeover"] = b.generate("b-takeover", takeover_prompt(saved["story"]), STORY - CUT)
        failures = stats(shared, kv_prefix).get("load_failures", 0)
        out["evict"] = b.generate(f"{kv_eviction.EVICT_PREFIX}1", PROMPTS["evict"], GEN)
        settle(lambda: stats(shared, kv_prefix).get("load_failures", 0) > failures)
        out["evict_load_failures"] = stats(shared, kv_prefix).get("load_failures", 0) - failures
    return out


@pytest.fixture(scope="module")
def other_model(
    smollm2_path: Path,
    kv_prefix: str,
    shared: redis.Redis,
    logs: Path,
    saved: dict[str, Any],  # the tiny model's blocks are there to be found
) -> dict[str, Any]:
    """S: SmolLM2 on the tiny model's prefix, asked a prompt whose blocks are stored."""
    bookkeeping = {f(kv_prefix).encode() for f in (stats_key, index_key, total_key)}
    keys = shared.scan_iter(f"{kv_prefix}:*", count=1000)
    out: dict[str, Any] = {"blocks_stored": sum(1 for key in keys if key not in bookkeeping)}
    with engine(logs, "S", smollm2_path, *connector_on(kv_prefix)) as s:
        hits = stats(shared, kv_prefix).get("hit_blocks", 0)
        out["len600"] = s.generate("s-len600", PROMPTS["len600"], GEN)
        out["new_hits"] = stats(shared, kv_prefix).get("hit_blocks", 0) - hits
    return out


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path_factory.mktemp("private-redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_down(tiny_model: Path, logs: Path, private_redis: PrivateRedis) -> dict[str, Any]:
    """D: the same prompt while Redis is up, down, back (empty), and once it saved again."""
    client = redis.Redis.from_url(private_redis.url)

    def has_saved() -> bool:
        return stats(client, "d").get("blocks_saved", 0) > 0

    out: dict[str, Any] = {}
    args = (*connector_on("d", private_redis.url), "--no-prefix-caching")
    with engine(logs, "D", tiny_model, *args) as d:
        out["up"] = d.generate("d-1", PROMPTS["down"], GEN)
        wait_for(has_saved)
        private_redis.stop()
        out["down"] = d.generate("d-2", PROMPTS["down"], GEN)
        private_redis.start()
        time.sleep(6)  # the store waits 5 s before trying a Redis that failed
        out["recovered"] = d.generate("d-3", PROMPTS["down"], GEN)
        settle(has_saved)
        out["restored"] = d.generate("d-4", PROMPTS["down"], GEN)
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


def test_kv_stats_reports_saved_loaded_and_hit_rate(
    saved: dict[str, Any], restored: dict[str, Any], kv_prefix: str
) -> None:
    import asyncio

    from redis.asyncio import Redis

    from rag_stream.kv.metrics import kv_stats

    async def read() -> dict[str, int | float]:
        client = Redis.from_url(REDIS_URL)
        try:
            return await kv_stats(client, kv_prefix)
        finally:
            await client.aclose()

    result = asyncio.run(read())
    assert result["blocks_saved"] >= A_SAVES
    assert result["blocks_loaded"] > 0 and result["bytes_loaded"] > 0
    assert 0 < result["hit_rate"] < 1
    assert result["stored_blocks"] > 0 and result["stored_bytes"] > 0
