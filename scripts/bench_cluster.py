"""Benchmark the scale-out topology (issue 18) on ``scripts/cluster.sh``: 2 vLLM servers
(SmolLM2-135M float32, CPU, KV connector on), API processes sharing PostgreSQL and Redis.

(a) One vs two API processes in front of the same two engines: the same concurrent clients
    send fresh prompts (``/v1/generate``), all to one API process or split over two; aggregate
    output tokens/s, TTFT seen by the clients, and the API processes' own CPU per token.
    Rounds alternate the order (1, 2, 2, 1, ...).
(b) Prefix reuse for multi-turn conversations over the two replicas, with affinity routing
    (the default) and with round-robin (an API process started with
    ``RAG_STREAM_ENGINE__REPLICA_ROUTING=round_robin``): each conversation sends its whole
    history each turn (``/v1/chat/completions``, as OpenAI clients do). Reported: cached / prompt
    tokens of turns after the first (what clients see in ``usage``), and from the replicas'
    metrics the share served by their own prefix cache vs loaded by the KV connector from Redis.

    .venv/bin/python scripts/bench_cluster.py --out docs/bench/cluster.json

Needs the machine's Redis and PostgreSQL (as the tests do); ~10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import connect_sse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchkit import (  # noqa: E402
    MODEL,
    alternate,
    command,
    cpu_seconds,
    summary,
    write_json,
)
from tests.support.cluster import Cluster, Node  # noqa: E402

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
TOPICS = [
    "a lighthouse", "a bakery", "a glacier", "a library", "a night train", "a vineyard",
    "a beehive", "a harbour", "a desert well", "a clock tower", "an orchard", "a mine",
    "a ferry", "a market", "a volcano", "an observatory", "a canal", "a mill", "a forest", "a dam",
]  # fmt: skip
HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"


def generate(url: str, prompt: str, max_tokens: int) -> tuple[float, int]:
    """(TTFT s, output tokens) of one streamed request."""
    body = {"prompt": prompt, "chat": True, "max_tokens": max_tokens, "temperature": 0}
    started = time.monotonic()
    ttft = None
    tokens = 0
    with (
        httpx.Client(base_url=url, timeout=600) as client,
        connect_sse(client, "POST", "/v1/generate", json=body) as source,
    ):
        source.response.raise_for_status()
        for sse in source.iter_sse():
            if sse.event == "token":
                ttft = ttft if ttft is not None else time.monotonic() - started
                tokens += len(json.loads(sse.data)["token_ids"])
            elif sse.event in ("done", "error"):
                assert sse.event == "done", sse.data
                break
    assert ttft is not None
    return ttft, tokens


def throughput_round(
    apis: list[Node], clients: int, per_client: int, max_tokens: int, tag: str
) -> dict[str, Any]:
    cpu_before = [cpu_seconds(a.pid) for a in apis]  # the API processes, not their children

    def client(n: int) -> list[tuple[float, int]]:
        url = apis[n % len(apis)].url
        return [
            generate(url, f"({tag}-{n}-{i}) Tell me about {TOPICS[(n + i) % 20]}.", max_tokens)
            for i in range(per_client)
        ]

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.monotonic() - started
    tokens = sum(t for _, t in results)
    cpu = sum(cpu_seconds(a.pid) for a in apis) - sum(cpu_before)
    return {
        "tokens_per_s": tokens / wall,
        "ttft_ms": [1000 * t for t, _ in results],
        "api_cpu_ms_per_token": 1000 * cpu / tokens,
    }


def chat_turn(url: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, int, int]:
    """(answer, prompt tokens, cached tokens) of one streamed chat completion."""
    body = {
        "model": "SmolLM2-135M-Instruct",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text, usage = [], None
    with (
        httpx.Client(base_url=url, timeout=600) as client,
        connect_sse(client, "POST", "/v1/chat/completions", json=body) as source,
    ):
        source.response.raise_for_status()
        for sse in source.iter_sse():
            if sse.data == "[DONE]":
                break
            chunk = json.loads(sse.data)
            for choice in chunk.get("choices") or []:
                text.append(choice.get("delta", {}).get("content") or "")
            usage = chunk.get("usage") or usage
    assert usage is not None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return "".join(text), usage["prompt_tokens"], cached


def conversations(
    api: Node, replicas: list[Node], n: int, turns: int, max_tokens: int, tag: str
) -> dict[str, Any]:
    before = {name: sum(r.metric(name) for r in replicas) for name in (*HITS, EXTERNAL_HITS)}
    histories: list[list[dict[str, str]]] = []
    for c in range(n):
        notes = " ".join(
            f"Note {k} ({tag}-{c}): the keeper of {TOPICS[c]} wrote down the weather, the "
            f"visitors and one unusual thing that happened on day {k}."
            for k in range(8)
        )  # over one 128-token KV block, unique to the conversation
        histories.append([{"role": "system", "content": notes}])
    later_prompt = later_cached = 0
    order = random.Random(1)  # the same orders for both routings
    for turn in range(turns):
        # interleaved, as many users at once would be, in a new order each turn: in a fixed
        # order an even number of conversations would meet round-robin's alternation in step,
        # each always on the same replica (what the first run of this script measured)
        for history in order.sample(histories, len(histories)):
            history.append({"role": "user", "content": f"Question {turn + 1}: what happened next?"})
            answer, prompt, cached = chat_turn(api.url, history, max_tokens)
            history.append({"role": "assistant", "content": answer})
            if turn > 0:
                later_prompt += prompt
                later_cached += cached
    after = {name: sum(r.metric(name) for r in replicas) for name in (*HITS, EXTERNAL_HITS)}
    delta = {name: after[name] - before[name] for name in after}
    queries = delta[HITS[1]]
    return {
        "cached_share_after_first_turn": later_cached / later_prompt,
        "replica_prefix_cache_hit_rate": delta[HITS[0]] / queries if queries else 0.0,
        "kv_connector_loaded_share": delta[EXTERNAL_HITS] / queries if queries else 0.0,
        "prompt_tokens_after_first_turn": later_prompt,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as folder:
        cluster = Cluster(Path(folder), MODEL, REDIS_URL, POSTGRES_URL)
        cluster.begin()
        try:
            cluster.wait()
            report = run(cluster, args)
        finally:
            cluster.stop()
    print(json.dumps(report, indent=2))
    if args.out:
        write_json(args.out, report)


def run(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    generate(cluster.apis[0].url, "Warm up.", 8)
    generate(cluster.apis[1].url, "Warm up.", 8)
    per: dict[str, list[dict[str, Any]]] = {"1": [], "2": []}
    for r in range(args.rounds):
        for setup in alternate(("1", "2"), r):
            apis = cluster.apis[:1] if setup == "1" else cluster.apis[:2]
            per[setup].append(
                throughput_round(apis, args.clients, args.per_client, args.max_tokens, f"{tag}{r}")
            )
            print(f"round {r} {setup} API: {per[setup][-1]['tokens_per_s']:.1f} tok/s", flush=True)
    throughput = {
        f"{setup}_api": {
            "tokens_per_s": summary([x["tokens_per_s"] for x in rounds]),
            "ttft_ms": summary([t for x in rounds for t in x["ttft_ms"]], 0),
            "api_cpu_ms_per_token": summary([x["api_cpu_ms_per_token"] for x in rounds], 2),
        }
        for setup, rounds in per.items()
    }
    ratio = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(per["1"], per["2"], strict=True)]
    round_robin = cluster.add_api(RAG_STREAM_ENGINE__REPLICA_ROUTING="round_robin")
    routing = {}
    for name, api in (("affinity", cluster.apis[0]), ("round_robin", round_robin)):
        routing[name] = conversations(
            api, cluster.replicas, args.conversations, args.turns, 24, f"{tag}-{name}"
        )
        print(name, routing[name], flush=True)
    return {
        "command": command(),
        "setup": {
            "engines": "2 vLLM OpenAI servers, SmolLM2-135M-Instruct float32, KV connector on",
            "clients": args.clients,
            "requests_per_client": args.per_client,
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "conversations": args.conversations,
            "turns": args.turns,
            "cpus": os.cpu_count(),
        },
        "throughput": throughput,
        "two_over_one_tokens_per_s": summary(ratio, 3),
        "two_over_one_median": summary(ratio, 3)["p50"],
        "routing": routing,
    }


if __name__ == "__main__":
    main()
