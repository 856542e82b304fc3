"""One in-process engine driven over stdin/stdout: for tests and benchmarks of the connector.

Each engine must be its own process (a fresh engine is the point of a restore), and vLLM's
engine core is spawned, so this module is run as a script::

    python -m rag_stream.kv.probe --model PATH [--kv-url redis://...] [--kv-prefix P]
        [--kv-connector CLASS --kv-connector-module MODULE]

``--kv-connector``/``--kv-connector-module`` load a subclass of ``RedisKVConnector`` instead;
vLLM imports it in the engine processes, which inherit this process's import path.

It prints ``@@kv-probe {"ready": ...}`` once started, then reads one JSON command per line:
``{"op": "generate", "id": ..., "prompt_ids": [...], "max_tokens": N}`` answers with the
token ids, ``cached_tokens`` (vLLM's count of prompt tokens not computed) and timings;
``{"op": "quit"}`` stops. Lines starting with the marker are the only protocol output.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from rag_stream.generation.engine import Sampling
from rag_stream.kv.config import CONNECTOR_MODULE, CONNECTOR_NAME
from rag_stream.settings import load_settings

MARKER = "@@kv-probe "


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(MARKER + json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _generate(engine: Any, cmd: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    stamps: list[float] = []
    tokens: list[int] = []
    cached = 0
    sampling = Sampling(max_tokens=int(cmd["max_tokens"]), temperature=0.0)
    async for step in engine.generate(cmd["id"], cmd["prompt_ids"], sampling):
        if step.token_ids:
            stamps.append(time.perf_counter())
            tokens.extend(step.token_ids)
        cached = max(cached, step.cached_tokens)
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "id": cmd["id"],
        "token_ids": tokens,
        "cached_tokens": cached,
        "ttft_s": stamps[0] - started if stamps else None,
        "tpot_s": sum(gaps) / len(gaps) if gaps else None,
        "gaps_s": gaps,
        "total_s": time.perf_counter() - started,
    }


async def _serve(args: argparse.Namespace) -> None:
    from rag_stream.generation.vllm_engine import VLLMEngine
    from rag_stream.kv.config import transfer_config

    kv: dict[str, Any] = {"enabled": args.kv_url is not None, "redis_url": args.kv_url}
    if args.kv_prefix:
        kv["key_prefix"] = args.kv_prefix
    if args.kv_max_bytes:
        kv["max_bytes"] = args.kv_max_bytes
    settings = load_settings(
        model=args.model,
        dtype=args.dtype,
        engine={
            "max_model_len": args.max_model_len,
            "kv_cache_gb": args.kv_cache_gb,
            "max_num_seqs": 4,
            "enable_prefix_caching": not args.no_prefix_caching,
        },
        kv=kv,
    )
    overrides: dict[str, Any] = {}
    if settings.kv.enabled:
        overrides["kv_transfer_config"] = transfer_config(
            settings,
            connector=args.kv_connector,
            module=args.kv_connector_module,
            extra=json.loads(args.kv_extra),
        )
    started = time.perf_counter()
    engine = await VLLMEngine.start(settings, **overrides)
    _emit({"ready": True, "startup_s": time.perf_counter() - started})
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line or not line.strip():
                if not line:
                    break
                continue
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "generate":
                _emit(await _generate(engine, cmd))
            else:
                _emit({"error": f"unknown op {cmd['op']!r}"})
    finally:
        await engine.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=4608)
    parser.add_argument("--kv-cache-gb", type=float, default=0.5)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--kv-url", default=None, help="Redis URL; enables the connector")
    parser.add_argument("--kv-prefix", default=None)
    parser.add_argument("--kv-max-bytes", type=int, default=None)
    parser.add_argument("--kv-extra", default="{}", help="extra connector config (JSON)")
    parser.add_argument("--kv-connector", default=CONNECTOR_NAME, help="connector class name")
    parser.add_argument("--kv-connector-module", default=CONNECTOR_MODULE)
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()


class ProbeProcess:
    """The client side: start a probe engine in a subprocess and talk to it."""

    def __init__(self, args: list[str], log_path: str, env: dict[str, str] | None = None) -> None:
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rag_stream.kv.probe", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log_path, "a", encoding="utf-8") as log_file:
            for line in self.proc.stdout:
                log_file.write(line)
                log_file.flush()
                if line.startswith(MARKER):
                    self._lines.put(json.loads(line[len(MARKER) :]))
        self._lines.put(None)

    def _next(self, timeout_s: float) -> dict[str, Any]:

        try:
            item = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            message = f"probe gave no answer in {timeout_s} s; see {self.log_path}"
            raise TimeoutError(message) from None
        if item is None:
            raise RuntimeError(f"probe exited ({self.proc.poll()}); see {self.log_path}")
        return item

    def wait_ready(self, timeout_s: float = 600) -> dict[str, Any]:
        return self._next(timeout_s)

    def generate(
        self, req_id: str, prompt_ids: list[int], max_tokens: int, timeout_s: float = 1800
    ) -> dict[str, Any]:
        cmd = {"op": "generate", "id": req_id, "prompt_ids": prompt_ids, "max_tokens": max_tokens}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._next(timeout_s)

    def quit(self) -> None:
        """Ask the engine to stop; ``close`` waits for it."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
            except OSError:
                pass

    def close(self, timeout_s: float = 30) -> None:
        self.quit()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
