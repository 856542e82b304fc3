"""KV blocks saved to Redis by one engine are restored by fresh engines (real vLLM, real Redis).

Engines are expensive to start, so one module fixture runs a small scenario and the tests check
its outcomes:

- A (tiny model, connector on) generates, saving prompt and generated blocks;
- C (tiny model, connector off) is the recompute reference for every prompt;
- a vLLM OpenAI server with the connector restores A's blocks and saves a new prompt;
- B (fresh, connector on) restores everything, including the server's prompt and the
  generated blocks of A's long answer (a crash takeover), and sees one block evicted mid-load;
- S (SmolLM2, connector on, same prefix) must not load the tiny model's blocks;
- D (tiny, connector on a private redis-server) keeps working while that Redis is down.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from rag_stream.kv.config import transfer_config_json
from rag_stream.kv.probe import ProbeProcess
from rag_stream.settings import load_settings
from tests.conftest import REDIS_URL
from tests.support.server import ROOT, free_port

pytestmark = pytest.mark.engine

BLOCK = 128
GEN = 24
LENGTHS = (300, 600, 1100)


def make_prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40000) for _ in range(n)]


def full_blocks(n_tokens: int) -> int:
    """Blocks a fresh engine can restore for a prompt of n tokens (the last is computed)."""
    return (n_tokens - 1) // BLOCK * BLOCK


def stats(client: redis.Redis, prefix: str) -> dict[str, int]:
    raw = client.hgetall(f"{prefix}:stats")
    return {k.decode(): int(v) for k, v in raw.items()}


def wait_for(predicate: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.2)


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

    def complete(self, prompt_ids: list[int], max_tokens: int) -> dict[str, Any]:
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
        if self.proc.poll() is not None:
            return
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
def scenario(
    tiny_model: Path, smollm2_path: Path, kv_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    logs = tmp_path_factory.mktemp("kv-logs")
    shared = redis.Redis.from_url(REDIS_URL)
    private = PrivateRedis(tmp_path_factory.mktemp("private-redis"))
    private.start()
    private_client = redis.Redis.from_url(private.url)

    engines: list[ProbeProcess] = []

    def probe(name: str, model: Path, *extra: str) -> ProbeProcess:
        # one engine at a time: each costs ~3 GB, and the suite's servers are alive too
        for running in engines:
            running.close()
        engine = ProbeProcess(["--model", str(model), *extra], str(logs / f"{name}.log"))
        engines.append(engine)
        return engine

    on = ("--kv-url", REDIS_URL, "--kv-prefix", kv_prefix)
    prompts = {f"len{n}": make_prompt(n, n) for n in LENGTHS}
    prompts["evict"] = make_prompt(11, 700)
    prompts["story"] = make_prompt(7, 200)
    prompts["server"] = make_prompt(13, 500)
    prompts["down"] = make_prompt(17, 400)
    out: dict[str, Any] = {"prompts": prompts}
    kv_json = transfer_config_json(
        load_settings(kv={"enabled": True, "redis_url": REDIS_URL, "key_prefix": kv_prefix})
    )
    # Engines start one after another, each fresh: none has seen a prompt before its first
    # request, which comes after A has saved.
    server: ApiServer | None = None
    try:
        a = probe("A", tiny_model, *on)
        a.wait_ready()
        for name in ("len300", "len600", "len1100", "evict"):
            out[f"A:{name}"] = a.generate(f"a-{name}", prompts[name], GEN)
        story = a.generate("a-story", prompts["story"], 200)
        out["A:story"] = story
        # The stream "crashed" after 190 tokens; the takeover prompt is everything so far.
        prompts["takeover"] = prompts["story"] + story["token_ids"][:190]
        # KV for every position but the last generated token; every full block is saved.
        saved = sum((len(prompts[k]) + GEN - 1) // BLOCK for k in ("len300", "len600", "len1100"))
        saved += (len(prompts["evict"]) + GEN - 1) // BLOCK + (200 + 200 - 1) // BLOCK
        out["A:expected_saved"] = saved
        wait_for(lambda: stats(shared, kv_prefix).get("blocks_saved", 0) >= saved)
        time.sleep(1)  # let any unexpected extra write land before counting
        out["A:stats"] = stats(shared, kv_prefix)
        a.close()

        server = ApiServer(tiny_model, kv_json, logs / "api_server.log")
        server.wait_ready()
        out["server:len600"] = server.complete(prompts["len600"], GEN)
        before = stats(shared, kv_prefix)["blocks_saved"]
        out["server:server"] = server.complete(prompts["server"], GEN)
        wait_for(lambda: stats(shared, kv_prefix)["blocks_saved"] > before)
        out["server:saved"] = stats(shared, kv_prefix)["blocks_saved"] - before
        server.stop()

        c = probe("C", tiny_model)
        c.wait_ready()
        for name, ids in prompts.items():
            max_tokens = 200 - 190 if name == "takeover" else GEN
            out[f"C:{name}"] = c.generate(f"c-{name}", ids, max_tokens)
        b = probe("B", tiny_model, *on, "--kv-extra", '{"test_evict_request_prefix": "evict-"}')
        b.wait_ready()
        for name in ("len300", "len600", "len1100", "server"):
            out[f"B:{name}"] = b.generate(f"b-{name}", prompts[name], GEN)
        out["B:takeover"] = b.generate("b-takeover", prompts["takeover"], 10)
        failures = stats(shared, kv_prefix).get("load_failures", 0)
        out["B:evict"] = b.generate("evict-1", prompts["evict"], GEN)
        wait_for(lambda: stats(shared, kv_prefix).get("load_failures", 0) > failures)
        out["B:stats"] = stats(shared, kv_prefix)
        s = probe("S", smollm2_path, *on)
        s.wait_ready()
        hits = stats(shared, kv_prefix).get("hit_blocks", 0)
        out["S:len600"] = s.generate("s-len600", prompts["len600"], GEN)
        out["S:new_hits"] = stats(shared, kv_prefix).get("hit_blocks", 0) - hits
        out["S:tiny_keys_left"] = sum(1 for _ in shared.scan_iter(f"{kv_prefix}:*", count=1000))
        d = probe(
            "D", tiny_model, "--kv-url", private.url, "--kv-prefix", "d", "--no-prefix-caching"
        )
        d.wait_ready()
        out["D:up"] = d.generate("d-1", prompts["down"], GEN)
        wait_for(lambda: stats(private_client, "d").get("blocks_saved", 0) > 0)
        private.stop()
        out["D:down"] = d.generate("d-2", prompts["down"], GEN)
        private.start()
        time.sleep(6)  # the store waits 5 s before trying a Redis that failed
        out["D:recovered"] = d.generate("d-3", prompts["down"], GEN)
        wait_for(lambda: stats(private_client, "d").get("blocks_saved", 0) > 0)
        out["D:restored"] = d.generate("d-4", prompts["down"], GEN)
    finally:
        if server is not None:
            server.stop()
        for engine in engines:
            engine.close()
        private.stop()
    return out


def test_fresh_engine_restores_prompt_blocks_and_matches_recompute(
    scenario: dict[str, Any],
) -> None:
    for name in ("len300", "len600", "len1100"):
        restored, recomputed = scenario[f"B:{name}"], scenario[f"C:{name}"]
        assert restored["cached_tokens"] == full_blocks(len(scenario["prompts"][name]))
        assert recomputed["cached_tokens"] == 0
        assert restored["token_ids"] == recomputed["token_ids"], name
        assert scenario[f"A:{name}"]["token_ids"] == recomputed["token_ids"], name


def test_every_full_prompt_and_generated_block_is_saved_once(scenario: dict[str, Any]) -> None:
    assert scenario["A:stats"]["blocks_saved"] == scenario["A:expected_saved"]
    assert scenario["A:stats"].get("blocks_loaded", 0) == 0


def test_crash_takeover_restores_generated_blocks(scenario: dict[str, Any]) -> None:
    takeover = scenario["prompts"]["takeover"]
    restored = scenario["B:takeover"]
    # 390 tokens: three full blocks, the third made only of generated tokens.
    assert restored["cached_tokens"] == full_blocks(len(takeover)) == 384
    assert restored["token_ids"] == scenario["C:takeover"]["token_ids"]
    # and the takeover continues exactly where the uninterrupted run went
    assert restored["token_ids"] == scenario["A:story"]["token_ids"][190:200]


def test_block_evicted_mid_load_falls_back_to_recompute(scenario: dict[str, Any]) -> None:
    assert scenario["B:evict"]["token_ids"] == scenario["C:evict"]["token_ids"]
    assert scenario["B:stats"]["load_failures"] >= 1


def test_openai_server_with_connector_loads_and_saves(scenario: dict[str, Any]) -> None:
    # blocks written by the in-process engine are read by the server ...
    assert scenario["server:len600"]["cached_tokens"] == full_blocks(600)
    assert scenario["server:len600"]["token_ids"] == scenario["C:len600"]["token_ids"]
    # ... and blocks the server wrote are read by a fresh in-process engine
    assert scenario["server:saved"] == (500 + GEN - 1) // BLOCK
    assert scenario["B:server"]["cached_tokens"] == full_blocks(500)
    assert scenario["B:server"]["token_ids"] == scenario["C:server"]["token_ids"]


def test_blocks_of_another_model_are_never_loaded(scenario: dict[str, Any]) -> None:
    assert scenario["S:len600"]["cached_tokens"] == 0
    assert scenario["S:new_hits"] == 0
    assert scenario["S:tiny_keys_left"] > 0  # the tiny model's blocks were there to be found


def test_engine_survives_redis_down_and_recovers(scenario: dict[str, Any]) -> None:
    reference = scenario["C:down"]["token_ids"]
    assert scenario["D:up"]["token_ids"] == reference
    assert scenario["D:down"]["cached_tokens"] == 0
    assert scenario["D:down"]["token_ids"] == reference
    assert scenario["D:recovered"]["token_ids"] == reference
    assert scenario["D:restored"]["cached_tokens"] == full_blocks(400)
    assert scenario["D:restored"]["token_ids"] == reference


def test_kv_stats_reports_saved_loaded_and_hit_rate(
    scenario: dict[str, Any], kv_prefix: str
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
    assert result["blocks_saved"] >= scenario["A:expected_saved"]
    assert result["blocks_loaded"] > 0 and result["bytes_loaded"] > 0
    assert 0 < result["hit_rate"] < 1
    assert result["stored_blocks"] > 0 and result["stored_bytes"] > 0
