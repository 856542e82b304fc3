"""Benchmark the resumable-stream layer (issue 5).

In one run, against a private redis-server on a free port:
  1. SSE events/s per server CPU-second through the whole layer (HTTP, pipeline, event log, SSE)
     with the stub engine emitting as fast as it can, many concurrent streams, with
     checkpointing to Redis and with the in-process log (streaming.checkpoint=false);
  2. Redis commands and bytes per generated token (INFO deltas over one checkpointed run);
  3. resume latency (reconnect with Last-Event-ID to the first replayed event) after 100 and
     1,000 tokens;
  4. time from kill -9 of the generating process to the first new token from the survivor, on
     the real SmolLM2 engine (a dead producer is found through its Redis presence connection,
     not its lease expiry).

    .venv/bin/python scripts/bench_streams.py --out docs/bench/streams.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchkit import (  # noqa: E402
    MODEL,
    command,
    cpu_seconds,
    private_redis,
    start_rag_stream,
    summary,
    write_json,
)
from tests.support.server import ServerProcess, free_port  # noqa: E402


def serve_stub(port: int) -> None:
    """Run the real app with the stub engine (this script re-invoked with --serve-stub)."""
    import uvicorn
    from transformers import AutoTokenizer

    from rag_stream.app import create_app
    from rag_stream.generation.engine import Engine
    from rag_stream.generation.stub import StubEngine
    from rag_stream.preflight import migrate
    from rag_stream.settings import Settings, load_settings

    settings = load_settings(port=port)
    migrate(settings)
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))

    async def stub(_: Settings) -> Engine:
        return StubEngine(tokenizer)

    uvicorn.run(create_app(settings, engine_factory=stub), port=port, log_level="warning")


def start_stub(data: Path, redis_url: str, checkpoint: bool) -> ServerProcess:
    """The stub engine on SmolLM2's tokenizer (``serve_stub``), ready."""
    port = free_port()
    env = {
        "RAG_STREAM_REDIS_URL": redis_url,
        "RAG_STREAM_STREAMING__CHECKPOINT": str(checkpoint).lower(),
        "RAG_STREAM_LIMITS__MAX_TOKENS": "4096",
        "RAG_STREAM_ENGINE__MAX_MODEL_LEN": "8192",
    }
    stub = [sys.executable, __file__, "--serve-stub", str(port)]
    server = start_rag_stream(data, env, profile="test", argv=stub, port=port)
    server.wait_ready(120)
    return server


async def _one_stream(client: httpx.AsyncClient, tokens: int) -> int:
    events = 0
    body = {"prompt": "bench", "max_tokens": tokens}
    async with client.stream("POST", "/v1/generate", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                events += 1
    return events


def throughput(server: ServerProcess, streams: int, tokens: int) -> dict[str, float]:
    async def run() -> int:
        limits = httpx.Limits(max_connections=streams)
        async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client:
            counts = await asyncio.gather(*(_one_stream(client, tokens) for _ in range(streams)))
        return sum(counts)

    asyncio.run(run())  # warm-up
    cpu0 = cpu_seconds(server.proc.pid)
    wall0 = time.perf_counter()
    events = asyncio.run(run())
    wall = time.perf_counter() - wall0
    cpu = cpu_seconds(server.proc.pid) - cpu0
    return {
        "events": events,
        "wall_s": round(wall, 2),
        "server_cpu_s": round(cpu, 2),
        "events_per_s": round(events / wall),
        "events_per_cpu_s": round(events / cpu),
    }


def redis_cost(server: ServerProcess, redis_url: str, tokens: int) -> dict[str, float]:
    import redis

    r = redis.Redis.from_url(redis_url)

    def stats() -> tuple[dict[str, int], int]:
        info = r.info("stats")
        calls = {
            k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()
        }
        return calls, int(info["total_net_input_bytes"]) + int(info["total_net_output_bytes"])

    c0, b0 = stats()
    streams = 10
    asyncio.run(_gather_streams(server, streams, tokens))
    c1, b1 = stats()
    generated = streams * tokens
    per_command = {k: round((v - c0.get(k, 0)) / generated, 3) for k, v in c1.items()}
    return {
        "tokens": generated,
        # commandstats counts the XADDs etc. run inside the append script too
        "redis_commands_per_token": round(sum(per_command.values()), 3),
        "by_command_per_token": {k: v for k, v in per_command.items() if v},
        "redis_bytes_per_token": round((b1 - b0) / generated, 1),
    }


async def _gather_streams(server: ServerProcess, streams: int, tokens: int) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
        await asyncio.gather(*(_one_stream(client, tokens) for _ in range(streams)))


def resume_latency(server: ServerProcess, tokens: int, trials: int) -> dict[str, float]:
    times = []
    with httpx.Client(base_url=server.url, timeout=600) as client:
        for _ in range(trials):
            r = client.post(
                "/v1/generate", json={"prompt": "x", "max_tokens": tokens, "stream": False}
            )
            sid = r.json()["stream_id"]
            status = client.get(f"/v1/streams/{sid}").json()
            cursor = status["last_event_id"] // 2
            started = time.perf_counter()
            with client.stream(
                "GET", f"/v1/streams/{sid}/events", headers={"Last-Event-ID": str(cursor)}
            ) as response:
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        times.append((time.perf_counter() - started) * 1000)
                        break
    return summary(times, digits=2)


def kill_to_first_token(data: Path, redis_url: str, trials: int) -> dict[str, Any]:
    env = {"RAG_STREAM_MODEL": str(MODEL), "RAG_STREAM_REDIS_URL": redis_url}
    survivor = start_rag_stream(data / "s", env, profile="test")
    survivor.wait_ready()
    gaps = []
    try:
        for i in range(trials):
            victim = start_rag_stream(data / f"v{i}", env, profile="test")
            victim.wait_ready()
            with (
                httpx.Client(base_url=victim.url, timeout=600) as client,
                client.stream(
                    "POST", "/v1/generate", json={"prompt": "Tell a long story.", "max_tokens": 200}
                ) as response,
            ):
                sid, last = "", -1
                for line in response.iter_lines():
                    if line.startswith("id:"):
                        last = int(line[3:])
                    if line.startswith("data:") and not sid:
                        sid = json.loads(line[5:])["stream_id"]
                    if last >= 10:
                        break
            killed = time.perf_counter()
            victim.kill()
            victim.stop()
            with (
                httpx.Client(base_url=survivor.url, timeout=600) as client,
                client.stream(
                    "GET", f"/v1/streams/{sid}/events", headers={"Last-Event-ID": str(last)}
                ) as response,
            ):
                event = ""
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        event = line.split(":", 1)[1].strip()
                    if line.startswith("data:") and event == "token":
                        gaps.append((time.perf_counter() - killed) * 1000)
                        break
    finally:
        survivor.stop()
    return {
        "kill_to_first_new_token_ms": summary(gaps, digits=2) if gaps else {},
        "lease_ms": 3000,
        "samples_ms": [round(g, 1) for g in gaps],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve-stub", type=int)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--kill-trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "streams.json")
    parser.add_argument(
        "--only-takeover", action="store_true", help="measure only kill -9 -> first new token"
    )
    args = parser.parse_args()
    if args.serve_stub:
        serve_stub(args.serve_stub)
        return
    report: dict[str, Any] = {"command": command()}
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp) / "redis") as redis:
        base = Path(tmp)
        for checkpoint in () if args.only_takeover else (True, False):
            server = start_stub(base / f"stub-{checkpoint}", redis.url, checkpoint)
            try:
                key = "checkpoint_on" if checkpoint else "checkpoint_off"
                report[f"sse_{key}"] = throughput(server, args.streams, args.tokens)
                print(key, report[f"sse_{key}"], flush=True)
                if checkpoint:
                    report["redis_cost"] = redis_cost(server, redis.url, args.tokens)
                    print(report["redis_cost"], flush=True)
                    for n in (100, 1000):
                        report[f"resume_after_{n}_tokens_ms"] = resume_latency(
                            server, n, args.trials
                        )
                        print(n, report[f"resume_after_{n}_tokens_ms"], flush=True)
            finally:
                server.stop()
        report["takeover"] = kill_to_first_token(base, redis.url, args.kill_trials)
        print(report["takeover"], flush=True)
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
