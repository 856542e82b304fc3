"""Which of the knowledge-base server's actions holds memory? (issue 17, the soak's follow-up)

    .venv/bin/python scripts/memory_by_action.py search 1500
    .venv/bin/python scripts/memory_by_action.py upload 300    # uploads, each over 10 deleted
    .venv/bin/python scripts/memory_by_action.py answer 1000
    .venv/bin/python scripts/memory_by_action.py job 200
    .venv/bin/python scripts/memory_by_action.py chat 600      # kb: chat completions

One server (the stub engine at no delay, everything embedded, through
tests/support/trimmable.py), one action repeated one at a time; every tenth of the way, the
server's anonymous memory (RSS less file-backed pages) after a ``malloc_trim``: what it holds.
A leak in an action shows as a rising column; the soak (scripts/soak.py) runs them together.
Output: one JSON line per sample on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.server import ServerProcess  # noqa: E402
from tests.support.traffic import paragraph  # noqa: E402

KB = "memory"


def held_mb(pid: int) -> float:
    """The server's anonymous memory once glibc has returned what was freed."""
    os.kill(pid, signal.SIGUSR2)
    time.sleep(1.5)
    memory = psutil.Process(pid).memory_info()
    return round((memory.rss - memory.shared) / 2**20, 1)


def act(client: httpx.Client, action: str, rng: random.Random, i: int, docs: list[str]) -> None:
    if action == "search":
        query = paragraph(rng, rng.randint(3, 60))
        client.post(f"/v1/kbs/{KB}/search", json={"query": query, "top_k": 4}).raise_for_status()
    elif action == "upload":
        text = "\n\n".join(
            f"# {paragraph(rng, 3)}\n\n{paragraph(rng, rng.randint(40, 240))}"
            for _ in range(rng.randint(1, 3))
        )
        url = f"/v1/kbs/{KB}/documents"
        if rng.random() < 0.5:
            r = client.post(url, json={"title": f"d{i}", "text": text})
        else:  # a file: parsed in a worker process
            r = client.post(url, files={"file": (f"d{i}.md", text.encode(), "text/markdown")})
        docs.append(r.raise_for_status().json()["id"])
        if len(docs) > 10:
            client.delete(f"{url}/{docs.pop(0)}").raise_for_status()
    elif action == "answer":
        body = {"kb": KB, "question": paragraph(rng, rng.randint(3, 30)), "max_tokens": 8}
        client.post("/v1/answers", json={**body, "stream": False}).raise_for_status()
    elif action == "job":
        outline = [paragraph(rng, 3), paragraph(rng, 3)]
        body = {"kb": KB, "title": paragraph(rng, 4), "outline": outline, "section_tokens": 16}
        job = client.post("/v1/jobs", json=body).raise_for_status().json()
        with client.stream("GET", f"/v1/jobs/{job['id']}/events") as events:
            for _ in events.iter_lines():
                pass
        if rng.random() < 0.4:
            client.delete(f"/v1/jobs/{job['id']}").raise_for_status()
    elif action == "chat":
        question = paragraph(rng, rng.randint(3, 30))
        body = {
            "model": f"kb:{KB}",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 8,
            "stream": rng.random() < 0.5,
        }
        client.post("/v1/chat/completions", json=body).raise_for_status()


def start_server(tmp: str, **env: str) -> ServerProcess:
    """The stub server (no delay, everything embedded) that SIGUSR2 trims, ready."""
    base = {
        "STUB_TOKEN_DELAY_S": "0",
        "RAG_STREAM_DATA_DIR": str(Path(tmp) / "data"),
        "RAG_STREAM_MODELS_DIR": str(ROOT / ".data" / "models"),
    }
    command = [sys.executable, "-m", "tests.support.trimmable", "stub"]
    server = ServerProcess({**base, **env}, Path(tmp) / "server.log", command=command)
    server.wait_ready(300)
    return server


def seed(client: httpx.Client, rng: random.Random) -> None:
    """The KB and six long documents."""
    client.post("/v1/kbs", json={"name": KB}).raise_for_status()
    for i in range(6):
        doc = {"title": f"seed {i}", "text": paragraph(rng, 200)}
        client.post(f"/v1/kbs/{KB}/documents", json=doc).raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["search", "upload", "answer", "job", "chat"])
    parser.add_argument("count", type=int)
    args = parser.parse_args()
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(tmp)
        try:
            pid = server.proc.pid
            with httpx.Client(base_url=server.url, timeout=120) as client:
                seed(client, rng)
                print(json.dumps({"action": args.action, "done": 0, "held_mb": held_mb(pid)}))
                docs: list[str] = []
                for i in range(1, args.count + 1):
                    act(client, args.action, rng, i, docs)
                    if i % max(1, args.count // 10) == 0:
                        sample = {"action": args.action, "done": i, "held_mb": held_mb(pid)}
                        print(json.dumps(sample), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
