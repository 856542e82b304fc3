"""Benchmark interactive answers while a large upload is ingested: TTFT idle and under ingest.

One ``rag-stream serve`` process on the real engine (scripts/benchkit.py's SmolLM2 settings, a
private redis-server), its default profile otherwise (embedder on ONNX Runtime, edge vectors,
SQLite). A knowledge base holds a few short documents. Per round:

1. idle: ``--answers`` answers (``POST /v1/answers``, streamed, a fresh question each, greedy,
   ``--max-tokens`` tokens), one after another; TTFT is to the first ``token`` event;
2. loaded: a large text (``--chars`` characters of prose, a fresh one per round) is uploaded:
   it is over ``ingest.background_above_chars``, so the server answers 202 and embeds it in the
   background; once its first chunks are embedded the same number of answers runs again, one
   after another, while the ingest goes on. Then the script waits for the document to be ready
   (or deletes it, with ``--no-wait``), and reports the ingest's chunks per second.

The ratio loaded/idle of the TTFT medians is the figure the target is on (1.5x at most).

    .venv/bin/python scripts/bench_ingest_ttft.py                 # docs/bench/ingest_ttft.json
    .venv/bin/python scripts/bench_ingest_ttft.py --rounds 1 --answers 5 --out /tmp/i.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchkit import (  # noqa: E402
    Conditions,
    command,
    engine_env,
    log_errors,
    private_redis,
    question,
    start_rag_stream,
    summary,
    write_json,
)
from tests.support.sse_async import timed_frames  # noqa: E402

KB = "bench"
SEED_DOCS = [
    ("Tides", "Tides rise and fall twice a day because the Moon's gravity pulls the oceans."),
    ("Volcanoes", "A volcano erupts when magma rises through cracks in the Earth's crust."),
    ("Honeybees", "Honeybees dance to tell their hive where flowers with nectar are found."),
]
WORDS = [
    *("river", "mountain", "valley", "forest", "meadow", "harbour", "village", "lantern"),
    *("orchard", "bridge", "tower", "castle", "island", "canyon", "glacier", "prairie"),
    *("desert", "marsh", "delta", "cliff", "summit", "ridge", "basin", "grove", "spring"),
]


def prose(chars: int, rnd: int) -> str:
    """About ``chars`` characters of paragraphs no other round uploads (a nonce first)."""
    rng = random.Random(rnd)
    parts = [f"Round {rnd} nonce {rng.random()}."]
    size = 0
    while size < chars:
        paragraph = " ".join(rng.choice(WORDS) for _ in range(60)) + "."
        parts.append(paragraph)
        size += len(paragraph) + 2
    return "\n\n".join(parts)


async def answer_ttft(client: httpx.AsyncClient, text: str, max_tokens: int) -> float:
    body = {"kb": KB, "question": text, "max_tokens": max_tokens, "temperature": 0.0}
    started = time.perf_counter()
    async with client.stream("POST", "/v1/answers", json=body) as response:
        response.raise_for_status()
        ttft = None
        async for frame in timed_frames(response):
            if frame.event == "token" and ttft is None:
                ttft = (time.perf_counter() - started) * 1000
            if frame.event == "error":
                raise RuntimeError(f"answer failed: {frame.data}")
    assert ttft is not None, "the answer produced no token"
    return ttft


async def answers(client: httpx.AsyncClient, rnd: int, n: int, max_tokens: int) -> list[float]:
    return [await answer_ttft(client, question(0, rnd, i), max_tokens) for i in range(n)]


async def document(client: httpx.AsyncClient, doc: str) -> dict[str, Any]:
    r = await client.get(f"/v1/kbs/{KB}/documents/{doc}")
    r.raise_for_status()
    result: dict[str, Any] = r.json()
    return result


async def polled(
    client: httpx.AsyncClient, doc: str, done: Callable[[dict[str, Any]], bool], every_s: float
) -> dict[str, Any]:
    """The document, read every ``every_s`` until ``done`` holds for it."""
    for _ in itertools.count():
        seen = await document(client, doc)
        if done(seen):
            break
        await asyncio.sleep(every_s)
    return seen


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        (await client.post("/v1/kbs", json={"name": KB})).raise_for_status()
        for title, text in SEED_DOCS:
            r = await client.post(f"/v1/kbs/{KB}/documents", json={"title": title, "text": text})
            r.raise_for_status()
        await answers(client, 99, 3, args.max_tokens)  # warm-up: compiled paths, caches
        for rnd in range(args.rounds):
            idle = await answers(client, 2 * rnd, args.answers, args.max_tokens)
            r = await client.post(
                f"/v1/kbs/{KB}/documents",
                json={"title": f"large {rnd}", "text": prose(args.chars, rnd)},
            )
            assert r.status_code == 202, r.text
            doc = r.json()["id"]
            seen = await polled(client, doc, lambda d: d["chunks_done"] > 0, 0.2)
            began, done0 = time.perf_counter(), seen["chunks_done"]
            loaded = await answers(client, 2 * rnd + 1, args.answers, args.max_tokens)
            during = await document(client, doc)
            overlapped = during["status"] == "processing"
            if args.no_wait:
                await client.delete(f"/v1/kbs/{KB}/documents/{doc}")
                final = during
            else:
                final = await polled(client, doc, lambda d: d["status"] != "processing", 0.5)
            wall = time.perf_counter() - began
            chunks = final["chunks_done"] - done0
            rounds.append(
                {
                    "idle_ttft_ms": summary(idle),
                    "loaded_ttft_ms": summary(loaded),
                    "ratio_p50": round(summary(loaded)["p50"] / summary(idle)["p50"], 2),
                    "ingest_overlapped_all_answers": overlapped,
                    "ingest_status": final["status"],
                    "ingest_chunks": final["chunk_count"],
                    "ingest_chunks_per_s": round(chunks / wall, 1) if wall else None,
                }
            )
            print(json.dumps(rounds[-1]), flush=True)
    return {"rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--answers", type=int, default=10, help="per phase")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--chars", type=int, default=400_000, help="the large upload's text")
    parser.add_argument("--no-wait", action="store_true", help="delete it instead of waiting")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "ingest_ttft.json")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="server setting"
    )
    args = parser.parse_args()
    conditions = Conditions()
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp) / "redis") as redis:
        extra = dict(item.split("=", 1) for item in args.env)
        env = {**engine_env(), "RAG_STREAM_REDIS_URL": redis.url, **extra}
        server = start_rag_stream(Path(tmp) / "data", env)
        try:
            server.wait_ready(900)
            loadavg = [os.getloadavg()[0]]
            report = asyncio.run(run(args, server.url))
            report["conditions"] = conditions.report(loadavg)
            report["server_errors"] = log_errors(Path(tmp) / "data" / "server.log")
        finally:
            server.stop()
    report["command"] = command()
    report["settings"] = extra
    write_json(args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
