"""What ``scripts/chaos.py`` runs and breaks, beside the private redis-server and PostgreSQL of
tests/support: rag-stream API servers (SmolLM2 float32 in-process), and a prober that records
what ``/readyz`` said and when new requests succeeded again after a fault."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.server import ROOT, ServerProcess, child_pid


@dataclass
class Api:
    """One API server process that can be killed and started again on the same folder."""

    name: str
    env: dict[str, str]
    logs: Path
    server: ServerProcess | None = None
    ready: bool = False
    starts: int = 0

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def start(self, wait: bool = True) -> None:
        self.starts += 1
        log = self.logs / f"{self.name}-{self.starts}.log"
        port = self.server.port if self.server is not None else None
        self.server = ServerProcess(self.env, log, port=port)
        self.ready = False
        if wait:
            self.wait()

    def wait(self) -> None:
        assert self.server is not None
        self.server.wait_ready(600)
        self.ready = True

    def kill(self) -> None:
        self.ready = False
        assert self.server is not None
        self.server.kill(signal.SIGKILL)

    def child_pid(self, title: str) -> int:
        assert self.server is not None
        return child_pid(self.server.proc.pid, title)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@dataclass
class Recovery:
    """After a fault: when a small new request first succeeded on each server, and every
    distinct ``/readyz`` answer seen meanwhile (with the seconds after the fault)."""

    fault_at: float
    first_success_s: dict[str, float] = field(default_factory=dict)
    readyz: dict[str, list[tuple[float, int, str]]] = field(default_factory=dict)

    def report(self) -> dict[str, object]:
        return {
            "first_success_s": {k: round(v, 2) for k, v in self.first_success_s.items()},
            "readyz_seen": {
                name: [{"at_s": round(t, 2), "status": s, "body": b} for t, s, b in seen]
                for name, seen in self.readyz.items()
            },
        }


def probe_recovery(apis: list[Api], fault_at: float, limit_s: float = 240) -> Recovery:
    """Poll every server until a new request succeeds on each (or ``limit_s`` passes)."""
    out = Recovery(fault_at)
    body = {"prompt": "Say hi.", "chat": True, "max_tokens": 2, "stream": False}
    while time.monotonic() - fault_at < limit_s and len(out.first_success_s) < len(apis):
        for api in apis:
            if api.name in out.first_success_s or api.server is None:
                continue
            try:
                ready = httpx.get(api.url + "/readyz", timeout=2)
                seen = out.readyz.setdefault(api.name, [])
                text = ready.text[:300]
                if not seen or seen[-1][1:] != (ready.status_code, text):
                    seen.append((time.monotonic() - fault_at, ready.status_code, text))
                r = httpx.post(api.url + "/v1/generate", json=body, timeout=30)
                if r.status_code == 200:
                    out.first_success_s[api.name] = time.monotonic() - fault_at
            except httpx.HTTPError as exc:
                seen = out.readyz.setdefault(api.name, [])
                if not seen or seen[-1][1] != 0:
                    seen.append((time.monotonic() - fault_at, 0, type(exc).__name__))
        time.sleep(0.25)
    return out


def run_cli(env: dict[str, str], *args: str) -> None:
    import sys

    subprocess.run(
        [sys.executable, "-m", "rag_stream", *args],
        env={**os.environ, **env}, cwd=ROOT, check=True, capture_output=True, timeout=900,
    )  # fmt: skip


def background(target: object) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread
