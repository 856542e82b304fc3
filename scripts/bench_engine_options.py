"""Two settings of the in-process engine side by side: prompt-lookup speculative decoding off
and on (``--compare speculative``, issue 37 item 1), the engine's CPU threads, 1 and 2
(``--compare threads``, item 2), or its CPU executor, ``uni`` on 2 threads (the default) and
vLLM's own ``mp`` (``--compare executor``, item 2).

Two `rag-stream serve` processes on the same SmolLM2 engine settings (float32, greedy, prefix
caching; scripts/benchkit.py ``engine_env``) but the one compared, each with the sample KB `docs`
(this repository's documentation). Three workloads, each at several concurrencies, the two
servers alternating which goes first each round (the other is idle meanwhile):

- ``answers``: POST /v1/answers on `docs` (RAG: the answer copies from its sources; a `kb:`
  chat completion runs the same kind);
- ``job``: a one-section job on `docs` (POST /v1/jobs with an outline), to its end;
- ``chat``: POST /v1/generate with `chat: true` and no sources (little to copy: a slowdown
  would show here).

Each request is asked of both servers; per request: time to the last token (the request's wall
time; a job's from creation to its end), TTFT (`timings.ttft_ms`, answers and chat), decode
tokens/s, the API process's own time before the engine (`timings.queue_ms` and
`retrieval_ms`), whether the text is identical, and the sources the answer or job retrieved (each
server searches a KB of its own, so prompts are the same only where these are). With
``speculative``, vLLM's own draft counters (on /metrics) give the acceptance rate.

    .venv/bin/python scripts/bench_engine_options.py --compare speculative --rounds 2 \
        --concurrency 1,4,8 --out docs/bench/speculative.json
    .venv/bin/python scripts/bench_engine_options.py --compare threads --rounds 2 \
        --concurrency 1,4,8 --workloads answers,chat --out docs/bench/engine-threads.json
    .venv/bin/python scripts/bench_engine_options.py --compare executor --rounds 3 \
        --concurrency 1,4,8 --workloads answers,chat --out docs/bench/engine-executor.json
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag_stream.ingest.files import collect_files  # noqa: E402
from rag_stream.ingest.sample_kb import SAMPLE_DOCS_DIR  # noqa: E402
from scripts.benchkit import (  # noqa: E402
    Conditions,
    alternate,
    command,
    engine_env,
    question,
    ratio,
    start_rag_stream,
    summary,
    write_json,
)
from tests.support.server import ServerProcess  # noqa: E402

# the sides of each comparison, in order: (name, settings)
COMPARISONS: dict[str, tuple[tuple[str, dict[str, str]], tuple[str, dict[str, str]]]] = {
    "speculative": (
        ("off", {"RAG_STREAM_ENGINE__SPECULATIVE": "off"}),
        ("ngram", {"RAG_STREAM_ENGINE__SPECULATIVE": "ngram"}),
    ),
    "threads": (
        ("1", {"RAG_STREAM_ENGINE__CPU_THREADS": "1"}),
        ("2", {"RAG_STREAM_ENGINE__CPU_THREADS": "2"}),
    ),
    # mp takes no cpu_threads: vLLM binds its worker's threads itself (VLLM_CPU_OMP_THREADS_BIND)
    "executor": (
        ("uni", {"RAG_STREAM_ENGINE__CPU_EXECUTOR": "uni", "RAG_STREAM_ENGINE__CPU_THREADS": "2"}),
        ("mp", {"RAG_STREAM_ENGINE__CPU_EXECUTOR": "mp"}),
    ),
}
QUESTIONS = (
    "How does a client resume a stream after its connection drops?",
    "What does the server do when Redis restarts empty under running streams?",
    "Which settings bound the size of an upload, and what happens beyond them?",
    "How are KV-cache blocks saved and restored on a takeover?",
    "What does the coalesce option of /v1/generate do?",
    "How do API keys and tenants work?",
    "What happens when the engine core process is killed?",
    "How does the OpenAI-compatible chat completions route report sources?",
)
HEADINGS = (
    "How resuming a stream works",
    "What a takeover after a crash does",
    "How uploads are limited",
    "How priorities order the engine's work",
)
_COUNTER = r"^{}(?:\{{[^}}]*\}})? (\S+)$"


def _counter(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(_COUNTER.format(re.escape(name)), text, re.M))


def drafts(server: ServerProcess) -> tuple[float, float]:
    """vLLM's draft tokens proposed and accepted so far on the server."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return (
        _counter(text, "vllm:spec_decode_num_draft_tokens_total"),
        _counter(text, "vllm:spec_decode_num_accepted_tokens_total"),
    )


def _documents(server: ServerProcess) -> int:
    r = httpx.get(server.url + "/v1/kbs/docs", timeout=30)
    return int(r.json()["document_count"]) if r.status_code == 200 else 0


def ask(server: ServerProcess, workload: str, i: int, max_tokens: int) -> dict[str, Any]:
    """One request; its text, tokens and timings."""
    started = time.perf_counter()
    # an answer's or a job's sources: each server searches a KB of its own, built alike, and
    # the two can rank ties differently; the prompts are the same only when these are
    sources: list[Any] | None = None
    with httpx.Client(base_url=server.url, timeout=1800) as client:
        if workload == "answers":
            body = {"kb": "docs", "question": QUESTIONS[i % len(QUESTIONS)], "stream": False}
            r = client.post("/v1/answers", json={**body, "max_tokens": max_tokens})
            r.raise_for_status()
            out = r.json()
            text, timings, tokens = out["answer"], out["timings"], out["usage"]
            sources = [(c["n"], c["title"], c["snippet"]) for c in out["citations"]]
        elif workload == "chat":
            body = {"prompt": question(0, 0, i), "chat": True, "stream": False}
            r = client.post("/v1/generate", json={**body, "max_tokens": max_tokens})
            r.raise_for_status()
            out = r.json()
            text, timings, tokens = out["text"], out["timings"], out["usage"]
        else:
            heading = HEADINGS[i % len(HEADINGS)]
            body = {"kb": "docs", "title": "rag-stream notes", "outline": [heading]}
            r = client.post("/v1/jobs", json={**body, "section_tokens": max_tokens})
            r.raise_for_status()
            job = r.json()["id"]
            while (status := client.get(f"/v1/jobs/{job}").json()["status"]) not in (
                "completed",
                "failed",
                "cancelled",
            ):
                time.sleep(0.05)
            assert status == "completed", status
            result = client.get(f"/v1/jobs/{job}/result", params={"format": "json"}).json()
            text = "\n".join(s["text"] for s in result["sections"])
            sources = [(c["n"], c["title"], c["heading"]) for c in result["sources"]]
            timings, tokens = None, None
    wall = time.perf_counter() - started
    done: dict[str, Any] = {"wall_s": wall, "text": text, "sources": sources}
    if timings is not None and tokens is not None:
        decode_s = timings["decode_ms"] / 1000
        n = tokens["completion_tokens"]
        done["ttft_ms"] = timings["ttft_ms"]
        # the API process's own part before the engine: admission wait and retrieval
        done["queue_ms"] = timings["queue_ms"]
        done["retrieval_ms"] = timings["retrieval_ms"]
        done["tokens_per_s"] = (n - 1) / decode_s if n > 1 and decode_s > 0 else None
    return done


def run_batch(
    server: ServerProcess, workload: str, c: int, first: int, max_tokens: int
) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(c) as pool:
        return list(
            pool.map(lambda i: ask(server, workload, i, max_tokens), range(first, first + c))
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="speculative")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--workloads", default="answers,job,chat")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    workloads = args.workloads.split(",")
    compared = COMPARISONS[args.compare]
    sides = tuple(name for name, _ in compared)
    before, after = sides
    base = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    env = {**engine_env(), "RAG_STREAM_INGEST__SAMPLE_KB": "true"}
    servers = {
        name: start_rag_stream(base / name, {**env, **settings}) for name, settings in compared
    }
    try:
        for server in servers.values():
            server.wait_ready(timeout=900)
        # the sample KB is ingested in the background: wait for all of it on both (an answer
        # on a KB still filling would search other sources on each side)
        wanted = len(collect_files([SAMPLE_DOCS_DIR])[0])
        for side, server in servers.items():
            deadline = time.monotonic() + 900
            while _documents(server) < wanted:
                assert time.monotonic() < deadline, f"{side}: the docs KB is not whole"
                time.sleep(1)
            ask(server, "answers", 0, 8)  # warm: the first request pays for lazy set-up
        conditions = Conditions()
        rows: list[dict[str, Any]] = []
        start_drafts = drafts(servers[after])
        for workload in workloads:
            for c in levels:
                measured: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
                for rnd in range(args.rounds):
                    first = 1000 * rnd + 100 * c
                    for side in alternate(sides, rnd):
                        batch = run_batch(servers[side], workload, c, first, args.max_tokens)
                        measured[side].extend(batch)
                        print(workload, c, rnd, side, [round(b["wall_s"], 2) for b in batch])
                pairs = list(zip(measured[before], measured[after], strict=True))
                row: dict[str, Any] = {"workload": workload, "concurrency": c}
                row["identical"] = sum(a["text"] == b["text"] for a, b in pairs)
                row["requests"] = len(pairs)
                # answers: the same prompt only when both servers retrieved the same sources
                same = [(a, b) for a, b in pairs if a["sources"] == b["sources"]]
                row["same_sources"] = len(same)
                row["identical_with_same_sources"] = sum(a["text"] == b["text"] for a, b in same)
                for side in sides:
                    row[f"last_token_s_{side}"] = summary(m["wall_s"] for m in measured[side])
                    ttft = [m["ttft_ms"] for m in measured[side] if m.get("ttft_ms") is not None]
                    tps = [m["tokens_per_s"] for m in measured[side] if m.get("tokens_per_s")]
                    row[f"ttft_ms_{side}"] = summary(ttft) if ttft else None
                    for part in ("queue_ms", "retrieval_ms"):
                        seen = [m[part] for m in measured[side] if m.get(part) is not None]
                        row[f"{part}_{side}"] = summary(seen) if seen else None
                    row[f"tokens_per_s_{side}"] = summary(tps) if tps else None
                row["speedup_last_token"] = ratio(
                    row[f"last_token_s_{before}"]["p50"], row[f"last_token_s_{after}"]["p50"]
                )
                print(row)
                rows.append(row)
        end = drafts(servers[after])
        proposed = end[0] - start_drafts[0]
        accepted = end[1] - start_drafts[1]
        report = {
            "command": command(),
            "compare": args.compare,
            "rows": rows,
            "drafts": {
                "proposed": proposed,
                "accepted": accepted,
                "acceptance": round(accepted / proposed, 3) if proposed else None,
            },
            "conditions": conditions.report([]),
        }
        print(report["drafts"])
        if args.out:
            write_json(args.out, report)
    finally:
        for server in servers.values():
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
