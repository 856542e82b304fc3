"""Run the real service in a subprocess on a free port (what a client really talks to)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


# Ports for the servers the tests start come from below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768-60999 by default). A port from bind(0) is an ephemeral
# one, and a server takes seconds to bind it (a vLLM start, 30-60 s): meanwhile any outgoing
# connection (to Redis, PostgreSQL, another server) could be given the same port, and the server
# exits with "address already in use". Below the range only an explicit bind takes a port, so
# each pytest-xdist worker draws from a block of its own, in turn, skipping what is bound.
_PORT_BLOCK = 4000
_PORT_BASE = 16000


def _port_block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    start = _PORT_BASE + (index % 4) * _PORT_BLOCK
    return range(start, start + _PORT_BLOCK)


_ports = _port_block()
_next_port = [os.getpid() % _PORT_BLOCK]  # scripts beside a test run start elsewhere in the block


def free_port() -> int:
    """A port no socket is bound to, which no outgoing connection can be given meanwhile."""
    for _ in range(_PORT_BLOCK):
        port = _ports[_next_port[0] % _PORT_BLOCK]
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {_ports.start}-{_ports.stop - 1}")


def child_pid(parent: int, title: str) -> int:
    """A child process of ``parent`` whose command line holds ``title``: ``EngineCore`` (vLLM's
    engine core, by its process title) or ``edge_worker`` (the embedded vector store's)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if ppid == str(parent) and title.encode() in argv:
            return int(entry.name)
    raise LookupError(f"process {parent} has no child named {title}")


class ServerProcess:
    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        port: int | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        full_env = {**os.environ, **env, "RAG_STREAM_PORT": str(self.port)}
        self._log = open(log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            command or [sys.executable, "-m", "rag_stream", "serve"],
            env=full_env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 300, poll_s: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/readyz", timeout=2)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
        raise TimeoutError(f"server not ready after {timeout} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        self._log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the whole process group (the server and its engine-core child)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._log.close()
