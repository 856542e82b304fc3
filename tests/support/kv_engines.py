"""The engines of test_kv_restore.py and the Redis they share, startable ahead of the module.

Each scenario of that module runs on its own fresh engine (five of them, each 20-45 s to
start). ``start_kv_engines`` makes the module's redis-server and an ``Ahead`` that starts the
engines in the order the scenarios ask for them, three alive at most (an engine holds a few
GB; there are 24 here), so the session fixture ``kv_engines_start`` (session_servers.py) can
have the first ones starting while an earlier module's tests run.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from rag_stream.kv.config import transfer_config_json
from rag_stream.kv.probe import ProbeProcess
from rag_stream.settings import load_settings
from tests.support import kv_eviction
from tests.support.ahead import Ahead
from tests.support.server import free_port
from tests.support.vllm_servers import VllmServer

Outcome = dict[str, Any]

PREFIX = "test-kv"  # the store is the module's own: no other user to keep apart from

# The engine of each scenario fixture, in the order the module's tests first ask for them.
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
MAX_ALIVE = 3  # a few GB each; A, the server and B, which run one after the other, start at once


def settle(predicate: Callable[[], bool], timeout_s: float = 30, poll_s: float = 0.2) -> bool:
    """Wait for asynchronous saves or counters; the tests assert on what was reached."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
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


class ApiServer(VllmServer):
    """``python -m vllm.entrypoints.openai.api_server`` with the connector."""

    def __init__(self, model: Path, kv_config: str, log_path: Path) -> None:
        super().__init__(model, log_path, "--kv-transfer-config", kv_config, max_model_len=4608)

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


def wanted_engines(fixturenames: Iterable[Iterable[str]]) -> list[str]:
    """The engines needed by tests with these fixture names, in the order they ask for them
    (a run of one test starts no engine it does not need)."""
    asked: set[str] = set()
    for names in fixturenames:
        asked.update(names)
    for scenario in reversed(RUNS_FIRST):
        if scenario in asked:
            asked.update(RUNS_FIRST[scenario])
    return list(dict.fromkeys(e for name, e in SCENARIOS.items() if name in asked))


@dataclass
class KvEngines:
    """The module's redis-server and its engines (started ahead, in order)."""

    store: PrivateRedis
    ahead: Ahead

    def close(self) -> None:
        self.ahead.close()
        self.store.stop()


def start_kv_engines(
    workdir: Path, tiny_model: Path, other_model: Path, order: list[str]
) -> KvEngines:
    """Start the redis-server, then the first engines of ``order`` (not waited for)."""
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    store = PrivateRedis(workdir)
    store.start()
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
        # another model with the very same layout: only the model in the key namespace keeps
        # its engine from loading the tiny model's blocks
        "S": probe(logs / "S.log", other_model, *on),
    }
    ahead = Ahead(starters, order, max_alive=MAX_ALIVE)
    ahead.start_ahead()
    return KvEngines(store, ahead)
