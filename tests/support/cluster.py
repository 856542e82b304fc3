"""``scripts/cluster.sh`` driven from tests: 2 vLLM servers with the KV connector, 2 API
processes, the machine's PostgreSQL and Redis, in a folder, database and key prefixes of
their own (dropped afterwards). ``Cluster.begin`` launches the script and returns at once, so
a session can start it ahead of its module; ``wait`` waits for it to print its URLs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.support.server import ROOT, free_port
from tests.support.vllm_servers import metric


@dataclass
class Node:
    """One process of the cluster (the leader of its own process group)."""

    url: str
    pid_file: Path

    @property
    def pid(self) -> int:
        return int(self.pid_file.read_text())

    def kill(self) -> None:
        """kill -9 of the process and everything it started (an engine core, say)."""
        pid = self.pid
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def metric(self, name: str) -> float:
        return metric(self.url, name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # not our child: once dead it stays a zombie of the script until that exits
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class Cluster:
    def __init__(self, folder: Path, model: Path, redis_url: str, postgres_url: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.folder = folder
        self.redis_url = redis_url
        self._postgres_admin = postgres_url.replace("postgresql+asyncpg", "postgresql")
        self.database = f"rag_cluster_{tag}"
        self.stream_prefix = f"cluster-{tag}"
        vllm_ports = [free_port(), free_port()]
        api_ports = [free_port(), free_port()]
        self.env = {
            **os.environ,
            "CLUSTER_DIR": str(folder),
            "MODEL": str(model),
            "VLLM_PORTS": " ".join(map(str, vllm_ports)),
            "API_PORTS": " ".join(map(str, api_ports)),
            "REDIS_URL": redis_url,
            "DATABASE": self.database,
            "RAG_STREAM_STREAMING__KEY_PREFIX": self.stream_prefix,
            "RAG_STREAM_KV__KEY_PREFIX": f"{self.stream_prefix}-kv",
        }
        self.replicas = [
            Node(f"http://127.0.0.1:{p}", folder / f"vllm-{p}.pid") for p in vllm_ports
        ]
        self.apis = [Node(f"http://127.0.0.1:{p}", folder / f"api-{p}.pid") for p in api_ports]
        self._starting: subprocess.Popen[bytes] | None = None
        self._log = folder / "cluster.log"

    def begin(self) -> None:
        with open(self._log, "ab") as log:
            self._starting = subprocess.Popen(
                ["bash", "scripts/cluster.sh", "start"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait(self, timeout_s: float = 900) -> None:
        assert self._starting is not None
        if self._starting.wait(timeout_s) != 0:
            raise RuntimeError(f"scripts/cluster.sh start failed:\n{self._log.read_text()}")

    def add_api(self, **env: str) -> Node:
        """One more API process on the running engines, with ``env`` on top (a setting)."""
        port = free_port()
        started = subprocess.run(
            ["bash", "scripts/cluster.sh", "start-api", str(port)],
            cwd=ROOT,
            env={**self.env, **env},
            capture_output=True,
            timeout=600,
        )
        if started.returncode != 0:
            log = self.folder / f"api-{port}.log"
            raise RuntimeError(f"the API process did not start:\n{log.read_text()[-4000:]}")
        node = Node(f"http://127.0.0.1:{port}", self.folder / f"api-{port}.pid")
        self.apis.append(node)
        return node

    def stop(self) -> None:
        if self._starting is not None and self._starting.poll() is None:
            self._starting.kill()
        subprocess.run(["bash", "scripts/cluster.sh", "stop"], cwd=ROOT, env=self.env, timeout=120)
        self._drop()

    def _drop(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        try:
            keys = list(client.scan_iter(f"{self.stream_prefix}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()

        async def drop() -> None:
            import asyncpg

            conn = await asyncpg.connect(self._postgres_admin)
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            finally:
                await conn.close()

        asyncio.run(drop())
