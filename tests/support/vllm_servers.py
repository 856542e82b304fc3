"""Plain vLLM OpenAI servers (``python -m vllm.entrypoints.openai.api_server``): the engine
replicas a rag-stream server with ``engine_urls`` generates on."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.server import ROOT, free_port


def metric(url: str, name: str) -> float:
    """The sum of a Prometheus metric's samples on a vLLM server (0 when it is down)."""
    try:
        text = httpx.get(url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


class VllmServer:
    """float32, greedy-exact, prefix caching on, cached tokens reported; ``extra`` arguments
    are added (a KV connector, say)."""

    def __init__(
        self,
        model: Path,
        log_path: Path,
        *extra: str,
        served_name: str | None = None,
        max_model_len: int = 2048,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = served_name or str(model)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "vllm.entrypoints.openai.api_server"),
                *("--model", str(model), "--served-model-name", self.model),
                *("--dtype", "float32", "--enforce-eager", "--seed", "0"),
                *("--distributed-executor-backend", "uni"),
                *("--max-model-len", str(max_model_len)),
                *("--kv-cache-memory-bytes", str(512 << 20), "--gpu-memory-utilization", "0.3"),
                *("--port", str(self.port), "--enable-prompt-tokens-details", *extra),
            ],
            cwd=ROOT,
            # the model in the engine-core process on one thread, as scripts/cluster.sh runs it
            env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its engine-core child goes with it on kill()
        )

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited; see {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vLLM server not ready; see {self.log_path}")

    def metric(self, name: str) -> float:
        return metric(self.url, name)

    def kill(self) -> None:
        """kill -9 of the server and its engine core."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
