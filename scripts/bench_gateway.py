"""Benchmark rag-stream's gateway against vLLM's own OpenAI server, driven by one client.

Part A, the real engine. SmolLM2-135M-Instruct with the engine arguments rag-stream uses (float32,
prefix caching, enforce_eager, seed 0, max_model_len 4096, max_num_seqs 32, a 1 GiB KV cache,
gpu_memory_utilization 0.3) runs behind ``python -m vllm.entrypoints.openai.api_server`` ("raw",
streaming POST /v1/chat/completions) and behind ``python -m rag_stream serve`` ("ours", POST
/v1/generate with ``chat: true``, SSE). Both servers are up at once, but only one is driven at a
time. For each concurrency c and round, both targets get the same max(16, 2c) chat prompts, c at a
time, greedy, max_tokens 64; a prompt starts with a nonce unique in the run, so nothing past the
chat template's system part is ever a cached prefix. Which target goes first alternates by round.
Per target and round: TTFT p50/p99 (to the first non-empty ``delta.content`` / first ``token``
event), TPOT p50, output tokens/s over the batch's wall time, and CPU µs per output token of the
server's own process (utime+stime of the PID launched, not its engine-core child). Ratios ours/raw
are taken per round, then summarized (median and spread) across rounds. With ``--before DIR``, a
third server runs rag-stream from another tree (``git archive REV rag_stream configs migrations
| tar -x -C DIR``) on the same settings: a change's effect against the code before it, beside
raw, in one run (the order then rotates, so that each target goes first and last in turn).

Part B, the SSE layer alone: the stub engine (scripts/bench_streams.py) emitting as fast as it can,
many concurrent streams; SSE events (every event, a token event once whatever it carries) and
tokens per server CPU-second, with ``streaming.checkpoint`` on and off, each with the request field
``coalesce: {"tokens": 3, "ms": 20}`` and without (recorded as "unsupported" if the server
answers 422 for it). The variants' order alternates by round. With ``--stub-requests N``, also
N streams of 2 tokens, 8 at a time, per server and round: the server's CPU per request.

    .venv/bin/python scripts/bench_gateway.py --out docs/bench/gateway.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_streams import start_stub  # noqa: E402
from scripts.benchkit import (  # noqa: E402
    RAW_SERVED,
    across,
    alternate,
    cell,
    cmdline,
    command,
    cpu_seconds,
    engine_env,
    private_redis,
    question,
    ratio,
    start_rag_stream,
    start_raw_vllm,
    summary,
    wait_health,
    write_json,
)
from tests.support.server import ServerProcess  # noqa: E402
from tests.support.sse_async import TimedFrame, timed_frames  # noqa: E402

COALESCE = {"tokens": 3, "ms": 20}


class Step(NamedTuple):
    token: bool = False  # new text arrived
    tokens: int | None = None  # completion tokens, from the final usage
    finish: str | None = None


def raw_body(q: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": RAW_SERVED,
        "messages": [{"role": "user", "content": q}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def raw_step(frame: TimedFrame) -> Step:
    chunk = frame.data
    if chunk == "[DONE]":
        return Step()
    if "error" in chunk:
        raise RuntimeError(f"raw: {chunk['error']}")
    choices, usage = chunk.get("choices") or [], chunk.get("usage")
    content = choices and (choices[0].get("delta") or {}).get("content")
    finish = choices[0].get("finish_reason") if choices else None
    return Step(bool(content), usage["completion_tokens"] if usage else None, finish)


def ours_body(q: str, max_tokens: int) -> dict[str, Any]:
    return {"prompt": q, "chat": True, "max_tokens": max_tokens, "temperature": 0, "stream": True}


def ours_step(frame: TimedFrame) -> Step:
    if frame.event == "token":
        return Step(token=True)
    if frame.event == "done":
        done = frame.data
        return Step(False, done["usage"]["completion_tokens"], done["finish_reason"])
    if frame.event == "error":
        raise RuntimeError(f"ours: {frame.data}")
    return Step()


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    pid: int
    body: Callable[[str, int], dict[str, Any]]
    read: Callable[[TimedFrame], Step]


async def one_request(
    client: httpx.AsyncClient, target: Target, q: str, max_tokens: int
) -> dict[str, Any]:
    started = time.perf_counter()
    first = last = 0.0
    tokens, finish = 0, ""
    async with client.stream("POST", target.url, json=target.body(q, max_tokens)) as response:
        if response.status_code != 200:
            body = (await response.aread())[:300]
            raise RuntimeError(f"{target.name}: HTTP {response.status_code}: {body!r}")
        async for frame in timed_frames(response):
            step = target.read(frame)
            if step.token:
                last = time.perf_counter()
                first = first or last
            tokens = step.tokens if step.tokens is not None else tokens
            finish = step.finish or finish
    return {
        "ttft_ms": (first - started) * 1000 if first else None,
        "tpot_ms": (last - first) * 1000 / (tokens - 1) if first and tokens > 1 else None,
        "tokens": tokens,
        "finish": finish,
    }


async def run_batch(
    client: httpx.AsyncClient, target: Target, prompts: list[str], c: int, max_tokens: int
) -> dict[str, Any]:
    """All prompts, c at a time; the server's own CPU around the whole batch."""
    samples: list[dict[str, Any]] = [{}] * len(prompts)
    pending = iter(enumerate(prompts))

    async def worker() -> None:
        for i, q in pending:
            samples[i] = await one_request(client, target, q, max_tokens)

    cpu0, wall0 = cpu_seconds(target.pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(c)))
    wall, cpu = time.perf_counter() - wall0, cpu_seconds(target.pid) - cpu0
    tokens = sum(s["tokens"] for s in samples)
    ttfts = [s["ttft_ms"] for s in samples if s["ttft_ms"] is not None]
    tpots = [s["tpot_ms"] for s in samples if s["tpot_ms"] is not None]
    return {
        "requests": len(samples),
        "tokens": tokens,
        "tokens_per_request": [s["tokens"] for s in samples],
        "finish": dict(Counter(s["finish"] for s in samples)),
        "wall_s": round(wall, 3),
        "server_cpu_s": round(cpu, 3),
        "ttft_ms_p50": summary(ttfts)["p50"] if ttfts else None,
        "ttft_ms_p99": summary(ttfts)["p99"] if ttfts else None,
        "tpot_ms_p50": summary(tpots, digits=2)["p50"] if tpots else None,
        "tokens_per_s": round(tokens / wall, 1),
        "cpu_us_per_token": round(cpu * 1e6 / tokens) if tokens else None,
    }


# per target and round -> median and spread across rounds (with these digits)
METRICS = {"ttft_ms_p50": 1, "ttft_ms_p99": 1, "tpot_ms_p50": 2, "tokens_per_s": 1}
METRICS["cpu_us_per_token"] = 0
RATIOS = ("ttft_ms_p50", "tokens_per_s", "cpu_us_per_token")


async def engine_rounds(args: argparse.Namespace, targets: list[Target]) -> dict[str, Any]:
    """``targets``: raw first, then ours (and the ``--before`` tree's, when given)."""
    raw = targets[0]
    top = max(args.concurrency)
    limits = httpx.Limits(max_connections=top, max_keepalive_connections=top)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        result: dict[str, Any] = {}
        for c in args.concurrency:
            for target in targets:  # warm-up at this concurrency, prompts of its own
                warm = [f"Warm-up {c}-{i}. Say hello." for i in range(c)]
                await run_batch(client, target, warm, c, 8)
            n = args.requests or max(16, 2 * c)
            rounds = []
            for rnd in range(args.rounds):
                prompts = [question(c, rnd, i) for i in range(n)]
                # each target goes first, and last, in turn (two targets: alternate; with a
                # third, reversing would keep the middle one in the middle for good)
                order = [*targets[rnd % len(targets) :], *targets[: rnd % len(targets)]]
                row: dict[str, Any] = {"round": rnd, "first": order[0].name}
                for target in order:
                    row[target.name] = await run_batch(client, target, prompts, c, args.max_tokens)
                for other in targets[1:]:
                    r, o = row[raw.name], row[other.name]
                    row[f"{other.name}_ratios"] = {k: ratio(o[k], r[k]) for k in RATIOS}
                    pairs = zip(r["tokens_per_request"], o["tokens_per_request"], strict=True)
                    row[f"{other.name}_token_count_mismatches"] = sum(a != b for a, b in pairs)
                row["ratios"] = row["ours_ratios"]
                if "before" in row:  # this tree's CPU a token against the other's, same round
                    row["ours_over_before_cpu"] = ratio(
                        row["ours"]["cpu_us_per_token"], row["before"]["cpu_us_per_token"]
                    )
                shown = {k: v for k, v in row.items() if k == "first" or k.endswith("ratios")}
                print(f"c={c} round {rnd}:", shown, row.get("ours_over_before_cpu", ""), flush=True)
                rounds.append(row)
            agg: dict[str, Any] = {"requests_per_target": n, "rounds": rounds}
            for target in targets:
                name = target.name
                agg[name] = {k: across([x[name][k] for x in rounds], d) for k, d in METRICS.items()}
            for other in targets[1:]:
                agg[f"{other.name}_over_raw"] = {
                    k: across([x[f"{other.name}_ratios"][k] for x in rounds], 3) for k in RATIOS
                }
            if len(targets) > 2:
                agg["ours_over_before_cpu"] = across([x["ours_over_before_cpu"] for x in rounds], 3)
            result[str(c)] = agg
    return result


def engine_part(args: argparse.Namespace, base: Path, redis_url: str) -> dict[str, Any]:
    servers: list[ServerProcess] = []
    spy: subprocess.Popen[bytes] | None = None
    report: dict[str, Any] = {}
    try:  # all load at once (~30-60 s each), then wait for all
        # vLLM's own executor on the CPU (``mp``, its default), as the raw server runs it: the
        # same engine on both sides (rag-stream's default, ``uni`` on 2 threads, decodes faster
        # here, which would compare engines, not gateways)
        ours_env = {
            "RAG_STREAM_REDIS_URL": redis_url,
            **engine_env(),
            "RAG_STREAM_ENGINE__CPU_EXECUTOR": "mp",
        }
        servers += [
            start_raw_vllm(base / "raw-vllm.log"),
            start_rag_stream(base / "ours", ours_env),
        ]
        if args.before:  # another tree's code, the same settings (a Redis prefix of its own)
            before_env = {**ours_env, "RAG_STREAM_STREAMING__KEY_PREFIX": "rs-before"}
            before = start_rag_stream(base / "before", before_env, argv=_serve_from(args.before))
            servers.append(before)
        raw_server, ours_server = servers[:2]
        wait_health(raw_server)
        for server in servers[1:]:
            server.wait_ready(600)
        pids = {"raw": raw_server.proc.pid, "ours": ours_server.proc.pid}
        if args.before:
            pids["before"] = servers[2].proc.pid
        report["measured_processes"] = {k: cmdline(p) for k, p in pids.items()}
        assert "vllm.entrypoints.openai.api_server" in report["measured_processes"]["raw"]
        assert "-m rag_stream serve" in report["measured_processes"]["ours"]
        if args.before:
            report["before_tree"] = str(args.before)
        if args.profile_ours:
            beside = Path(sys.executable).with_name("py-spy")
            exe = str(beside) if beside.exists() else shutil.which("py-spy")
            if exe is None:
                print("py-spy is not on the PATH: --profile-ours ignored", flush=True)
            else:
                out = str(args.profile_ours)
                # collapsed stacks (text): flamegraph tools and a grep read them
                record = [exe, "record", "-f", "raw", "-r", "200", "-o", out]
                spy = subprocess.Popen([*record, "--pid", str(pids["ours"])])
                report["profiled_ours"] = out  # sampling slows ours down: ratios are skewed
        raw_url = raw_server.url + "/v1/chat/completions"
        targets = [
            Target("raw", raw_url, pids["raw"], raw_body, raw_step),
            Target("ours", ours_server.url + "/v1/generate", pids["ours"], ours_body, ours_step),
        ]
        if args.before:
            url = servers[2].url + "/v1/generate"
            targets.append(Target("before", url, pids["before"], ours_body, ours_step))
        report["by_concurrency"] = asyncio.run(engine_rounds(args, targets))
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(120)
        for server in servers:
            server.stop()
    return report


def _serve_from(tree: Path) -> list[str]:
    """``rag-stream serve`` with the service's code taken from another checkout's root."""
    boot = f"import sys; sys.path.insert(0, {str(tree)!r}); from rag_stream.cli import main; "
    return [sys.executable, "-c", boot + "sys.exit(main(['serve']))"]


async def stub_batch(
    server: ServerProcess, streams: int, tokens: int, coalesce: dict[str, int] | None
) -> dict[str, float]:
    body: dict[str, Any] = {"prompt": "bench", "max_tokens": tokens}
    if coalesce:
        body["coalesce"] = coalesce
    counts = Counter[str]()

    async def one(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/generate", json=body) as response:
            async for frame in timed_frames(response):
                counts["events"] += 1
                if frame.event == "token":
                    counts["tokens"] += len(frame.data["token_ids"])

    limits = httpx.Limits(max_connections=streams)
    async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client:
        cpu0, wall0 = cpu_seconds(server.proc.pid), time.perf_counter()
        await asyncio.gather(*(one(client) for _ in range(streams)))
        wall, cpu = time.perf_counter() - wall0, cpu_seconds(server.proc.pid) - cpu0
    return {
        **counts,
        "wall_s": round(wall, 3),
        "server_cpu_s": round(cpu, 3),
        "events_per_s": round(counts["events"] / wall),
        "events_per_cpu_s": round(counts["events"] / cpu),
        "tokens_per_cpu_s": round(counts["tokens"] / cpu),
    }


STUB_METRICS = ("events_per_cpu_s", "tokens_per_cpu_s", "events_per_s")
SHORT_CONCURRENCY = 8  # the per-request measure: this many 2-token streams at a time


async def stub_requests(server: ServerProcess, n: int) -> dict[str, float]:
    """``n`` streams of 2 tokens, SHORT_CONCURRENCY at a time: what a request costs the
    server's process apart from its tokens (admission, the stream's records, the response)."""
    body = {"prompt": "bench", "max_tokens": 2}
    queue = list(range(n))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            queue.pop()
            async with client.stream("POST", "/v1/generate", json=body) as response:
                async for _ in timed_frames(response):
                    pass

    limits = httpx.Limits(max_connections=SHORT_CONCURRENCY)
    async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client:
        cpu0, wall0 = cpu_seconds(server.proc.pid), time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(SHORT_CONCURRENCY)))
        wall, cpu = time.perf_counter() - wall0, cpu_seconds(server.proc.pid) - cpu0
    return {"requests": n, "wall_s": round(wall, 3), "cpu_ms_per_request": round(cpu / n * 1000, 2)}


def stub_part(args: argparse.Namespace, base: Path, redis_url: str) -> dict[str, Any]:
    servers: dict[str, ServerProcess] = {}
    report: dict[str, Any] = {"streams": args.stub_streams, "tokens": args.stub_tokens}
    try:
        for checkpoint in (True, False):
            name = f"checkpoint_{'on' if checkpoint else 'off'}"
            servers[name] = start_stub(base / f"stub-{checkpoint}", redis_url, checkpoint)
        probe = {"prompt": "bench", "max_tokens": 4, "stream": False, "coalesce": COALESCE}
        status = httpx.post(servers["checkpoint_on"].url + "/v1/generate", json=probe).status_code
        if status not in (200, 422):
            raise RuntimeError(f"coalesce probe: HTTP {status}")
        report["coalesce"] = COALESCE if status == 200 else "unsupported"
        variants: list[tuple[str, dict[str, int] | None]] = [(name, None) for name in servers]
        if status == 200:
            variants += [(f"{name}+coalesce", COALESCE) for name in servers]
        for server in servers.values():  # warm-up
            asyncio.run(stub_batch(server, 4, 50, None))
        rows: dict[str, list[dict[str, float]]] = {name: [] for name, _ in variants}
        for rnd in range(args.stub_rounds):
            for name, coalesce in alternate(variants, rnd):
                server = servers[name.split("+")[0]]
                row = asyncio.run(stub_batch(server, args.stub_streams, args.stub_tokens, coalesce))
                print(f"stub round {rnd} {name}:", row, flush=True)
                rows[name].append(row)
        report["variants"] = {
            name: {k: summary([r[k] for r in runs], digits=0) for k in STUB_METRICS}
            | {"rounds": runs}
            for name, runs in rows.items()
        }
        if args.stub_requests:
            short: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
            for rnd in range(args.stub_rounds):
                for name in alternate(list(servers), rnd):
                    row = asyncio.run(stub_requests(servers[name], args.stub_requests))
                    print(f"stub requests round {rnd} {name}:", row, flush=True)
                    short[name].append(row)
            report["per_request"] = {
                name: {"cpu_ms_per_request": summary(r["cpu_ms_per_request"] for r in runs)}
                | {"rounds": runs}
                for name, runs in short.items()
            }
    finally:
        for server in servers.values():
            server.stop()
    return report


def markdown(report: dict[str, Any]) -> str:
    lines = []
    if "engine" in report:
        lines += [
            "| c | target | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | tokens/s | CPU µs/token |",
            "|---|---|---|---|---|---|---|",
        ]
        for c, agg in report["engine"]["by_concurrency"].items():
            for name, label in (("raw", "vLLM OpenAI server"), ("ours", "rag-stream")):
                lines.append(
                    f"| {c} | {label} | {' | '.join(cell(agg[name][k]) for k in METRICS)} |"
                )
            ratios = agg["ours_over_raw"]
            cells = [cell(ratios[k]) if k in ratios else "" for k in METRICS]
            lines.append(f"| {c} | **ours / raw** | {' | '.join(cells)} |")
    if "stub" in report:
        lines += [
            "",
            f"SSE layer, stub engine (coalesce: {report['stub']['coalesce']}):",
            "",
            "| variant | events / CPU-s | tokens / CPU-s | events/s |",
            "|---|---|---|---|",
        ]
        for name, v in report["stub"]["variants"].items():
            lines.append(f"| {name} | {' | '.join(cell(v[k]) for k in STUB_METRICS)} |")
        if "per_request" in report["stub"]:
            lines += ["", "| server | CPU ms per 2-token request |", "|---|---|"]
            for name, v in report["stub"]["per_request"].items():
                lines.append(f"| {name} | {cell(v['cpu_ms_per_request'])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="rag-stream gateway vs raw vLLM OpenAI server")
    parser.add_argument("--skip-engine", action="store_true", help="no part A (real engine)")
    parser.add_argument("--skip-stub", action="store_true", help="no part B (stub engine)")
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 4, 8, 16],
        help="comma-separated concurrency levels (default 1,4,8,16)",
    )
    parser.add_argument("--requests", type=int, help="per target and round (max(16, 2c))")
    ints = {"rounds": 3, "max-tokens": 64, "stub-rounds": 3, "stub-streams": 32, "stub-tokens": 500}
    for name, default in ints.items():
        parser.add_argument(f"--{name}", type=int, default=default, help=f"default {default}")
    parser.add_argument(
        "--stub-requests",
        type=int,
        default=0,
        help="part B also: this many 2-token streams, 8 at a time, per server and round: the "
        "server's CPU per request (0: not measured)",
    )
    parser.add_argument(
        "--redis",
        choices=("tcp", "unix"),
        default="tcp",
        help="how rag-stream reaches its private Redis: loopback TCP (default) or a unix socket",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "gateway.json")
    parser.add_argument(
        "--before",
        type=Path,
        help="part A also drives a third server, rag-stream from this tree (another checkout's "
        "root, e.g. git archive REV | tar -x -C DIR), alternated with the others: both trees' "
        "CPU a token against raw's and against each other's, in the same run",
    )
    parser.add_argument(
        "--profile-ours",
        type=Path,
        metavar="PATH",
        help="record rag-stream with `py-spy record -o PATH --pid` during part A (skews the "
        "ratios); ignored with a warning when py-spy is not on the PATH (it is not installed "
        "by default)",
    )
    args = parser.parse_args()
    report: dict[str, Any] = {"command": command(), "loadavg_start": os.getloadavg()}
    with (
        tempfile.TemporaryDirectory() as tmp,
        private_redis(Path(tmp) / "redis", unix_socket=args.redis == "unix") as redis,
    ):
        redis_url = redis.socket_url or redis.url
        report["redis_url"] = redis_url
        if not args.skip_engine:
            report["engine"] = engine_part(args, Path(tmp), redis_url)
        if not args.skip_stub:
            report["stub"] = stub_part(args, Path(tmp), redis_url)
    report["loadavg_end"] = os.getloadavg()
    write_json(args.out, report)
    print(markdown(report))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
