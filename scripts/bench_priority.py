"""Benchmark interactive-before-batch priorities: interactive TTFT while long batch requests run.

One ``python -m rag_stream serve`` process per variant, all up at once, driven one at a time:
the same engine arguments as scripts/bench_gateway.py (scripts/benchkit.py: SmolLM2-135M-Instruct,
float32, prefix caching, enforce_eager, seed 0, max_model_len 4096, max_num_seqs 32, a 1 GiB KV
cache, a private redis-server), except the variant's, ``policy[:step_tokens[:max_active_batch]]``:
``engine.scheduling_policy``; after a colon ``engine.max_num_batched_tokens`` (absent or empty:
vLLM's default, 2048); after a second colon ``limits.max_active_batch``, the most batch streams
the process generates at once (absent: no cap). ``--variants priority,fcfs,priority:512`` or
``--variants priority,priority::2,priority:512:1``. With a cap, the batch requests beyond it are
admitted (their streams exist, the response and its stream id come back at once) but wait in the
process's admission queue and produce tokens later; interactive requests never wait behind them.
All have ``limits.long_prompt_tokens`` 1024, so the batch requests below, which ask for no
class, run as ``batch`` because their prompts are long (``--ask-batch``: they ask for it too).

Per round and server (the order of the servers alternates by round):

1. idle: the interactive load alone: ``--requests`` chat prompts (a nonce first, ~50 tokens with
   the template), ``--concurrency`` at a time, greedy, 32 tokens (``ignore_eos``);
2. loaded: 8 batch workers, each sending one long request after another (a ~1500-token prompt of
   its own, 256 tokens with ``ignore_eos``), and, once the first batch token is out, the same
   interactive load again (fresh prompts). Then the batch requests still running or waiting
   for a slot are cancelled (``POST /v1/streams/{id}/cancel``, all at once: a cancelled waiting
   stream ends when a batch slot frees, as the cancelled generating ones do) and the engine is
   left to settle.

All requests are ``POST /v1/chat/completions`` with ``stream: true``; TTFT is to the first chunk
with non-empty ``delta.content``. Per round and server: interactive TTFT p50/p99 idle and loaded,
their ratio, and the batch tokens per second during the loaded phase (content chunks: one token
each at the default coalescing, counted as they arrive, over the phase's wall time: batch
requests waiting behind a cap add nothing until they run). Medians (min–max) across rounds in
the report. With max_num_seqs 32 every request fits in the engine's batch; what waits in vLLM's
queue is prefill work beyond the step's token budget (max_num_batched_tokens, 2048 by default):
the queue the policy orders.

    .venv/bin/python scripts/bench_priority.py            # docs/bench/priority.{json,md}
    .venv/bin/python scripts/bench_priority.py --variants priority,priority::2,priority::1
    .venv/bin/python scripts/bench_priority.py --render docs/bench/priority.json  # the .md
    .venv/bin/python scripts/bench_priority.py --rounds 1 --requests 6 --out /tmp/p.json  # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchkit import (  # noqa: E402
    MODEL,
    Conditions,
    alternate,
    cell,
    command,
    engine_env,
    log_errors,
    private_redis,
    question,
    start_rag_stream,
    summary,
    write_json,
)
from tests.support.server import ServerProcess  # noqa: E402
from tests.support.sse_async import timed_frames  # noqa: E402

BATCH_STREAMS, BATCH_PROMPT_TOKENS, BATCH_MAX_TOKENS = 8, 1500, 256
INTERACTIVE_MAX_TOKENS = 32
LONG_PROMPT_TOKENS = 1024  # limits.long_prompt_tokens on both servers
TARGET = 1.5  # interactive TTFT p50 with priorities, loaded over idle
WORDS = (
    "harbour", "lantern", "granite", "meadow", "orchard", "compass", "ledger", "copper", "willow",
    "furnace", "glacier", "cinder", "pigeon", "quarry", "saddle", "timber", "vessel", "walnut",
    "beacon", "canyon", "dynamo", "ember", "falcon", "gravel", "hammock", "island", "juniper",
)  # fmt: skip


@dataclass(frozen=True)
class Variant:
    policy: str  # engine.scheduling_policy
    step_tokens: int | None  # engine.max_num_batched_tokens; None: vLLM's default
    max_active_batch: int | None  # limits.max_active_batch; None: no cap

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``policy[:step_tokens[:max_active_batch]]``, an empty field for the default."""
        policy, *rest = text.split(":")
        if policy not in ("priority", "fcfs") or len(rest) > 2:
            raise ValueError(f"bad variant {text!r}: policy[:step_tokens[:max_active_batch]]")
        step, cap = (*rest, "", "")[:2]
        return cls(policy, int(step) if step else None, int(cap) if cap else None)


def variants_arg(text: str) -> list[str]:
    names = text.split(",")
    for name in names:
        try:
            Variant.parse(name)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return names


def start_server(name: str, data: Path, redis_url: str) -> ServerProcess:
    variant = Variant.parse(name)
    env = {
        **engine_env(),
        "RAG_STREAM_REDIS_URL": redis_url,
        "RAG_STREAM_ENGINE__SCHEDULING_POLICY": variant.policy,
        "RAG_STREAM_LIMITS__LONG_PROMPT_TOKENS": str(LONG_PROMPT_TOKENS),
        # streams from both servers share the Redis: keep them apart
        "RAG_STREAM_STREAMING__KEY_PREFIX": f"bench-{data.name}",
    }
    if variant.step_tokens is not None:
        env["RAG_STREAM_ENGINE__MAX_NUM_BATCHED_TOKENS"] = str(variant.step_tokens)
    if variant.max_active_batch is not None:
        env["RAG_STREAM_LIMITS__MAX_ACTIVE_BATCH"] = str(variant.max_active_batch)
    return start_rag_stream(data, env)


class Prompts:
    """Chat prompts never used before in the run (a nonce first)."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(MODEL))
        self._n = 0

    def interactive(self, rnd: int) -> str:
        self._n += 1
        return question(0, rnd, self._n)

    def batch(self) -> str:
        """About BATCH_PROMPT_TOKENS tokens of words (the chat template adds ~30)."""
        self._n += 1
        rng = random.Random(self._n)
        words = " ".join(rng.choice(WORDS) for _ in range(2 * BATCH_PROMPT_TOKENS))
        text = f"Job {self._n}-{time.time_ns()}. Summarise these field notes: {words}"
        ids = self._tokenizer.encode(text, add_special_tokens=False)[:BATCH_PROMPT_TOKENS]
        return str(self._tokenizer.decode(ids))


def body(prompt: str, max_tokens: int, priority: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": MODEL.name,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    if priority is not None:
        out["priority"] = priority
    return out


@dataclass
class Reply:
    stream_id: str = ""
    ttft_ms: float | None = None
    chunks: int = 0  # chunks with content: one token each at the default coalescing


async def chat(
    client: httpx.AsyncClient,
    payload: dict[str, Any],
    on_start: Callable[[str], None] | None = None,
    on_token: Callable[[], None] | None = None,
) -> Reply:
    reply = Reply()
    started = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=payload) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        reply.stream_id = response.headers["x-stream-id"]
        if on_start:
            on_start(reply.stream_id)
        async for frame in timed_frames(response):
            if frame.data == "[DONE]":
                break
            chunk = frame.data
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                reply.chunks += 1
                if reply.ttft_ms is None:
                    reply.ttft_ms = (time.perf_counter() - started) * 1000
                if on_token:
                    on_token()
    return reply


async def interactive_load(
    client: httpx.AsyncClient, prompts: Prompts, rnd: int, n: int, c: int
) -> list[float]:
    """TTFT of n requests, c at a time, in the order they were sent."""
    ttfts = [0.0] * n
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            reply = await chat(client, body(prompts.interactive(rnd), INTERACTIVE_MAX_TOKENS, None))
            assert reply.ttft_ms is not None, "an interactive request produced no text"
            ttfts[i] = reply.ttft_ms

    await asyncio.gather(*(worker() for _ in range(c)))
    return ttfts


@dataclass
class BatchLoad:
    """BATCH_STREAMS workers, each sending long requests one after another until stopped."""

    client: httpx.AsyncClient
    prompts: Prompts
    ask: str | None
    running: dict[int, str] = field(default_factory=dict)  # worker -> its stream in flight
    first_token: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: int = 0
    finished: int = 0
    stopping: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._worker(w)) for w in range(BATCH_STREAMS)]

    async def _worker(self, w: int) -> None:
        def token() -> None:
            self.tokens += 1
            self.first_token.set()

        while not self.stopping:
            payload = body(self.prompts.batch(), BATCH_MAX_TOKENS, self.ask)
            reply = await chat(
                self.client, payload, lambda sid: self.running.update({w: sid}), token
            )
            self.running.pop(w, None)
            if reply.chunks >= BATCH_MAX_TOKENS:
                self.finished += 1

    async def stop(self) -> int:
        """Cancel what runs or waits for a slot, including requests whose stream id arrives
        meanwhile. The cancels go out together: each waits (up to 10 s, server side) for its
        stream to end, and one waiting behind a batch cap ends only once a batch slot frees."""
        self.stopping = True
        cancelled: set[str] = set()
        cancels: list[asyncio.Task[httpx.Response]] = []
        while not all(t.done() for t in self.tasks):
            for sid in set(self.running.values()) - cancelled:
                cancels.append(asyncio.create_task(self.client.post(f"/v1/streams/{sid}/cancel")))
                cancelled.add(sid)
            await asyncio.wait(self.tasks, timeout=0.5)
        await asyncio.gather(*self.tasks)  # raises what a worker raised
        responses = await asyncio.gather(*cancels)
        for response in responses:
            response.raise_for_status()
        return sum(bool(r.json()["cancelled"]) for r in responses)  # the others had ended


async def measure(server: ServerProcess, prompts: Prompts, rnd: int, args: Any) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=server.url, timeout=900, limits=limits) as client:
        load1 = os.getloadavg()[0]
        idle = await interactive_load(client, prompts, rnd, args.requests, args.concurrency)
        batch = BatchLoad(client, prompts, "batch" if args.ask_batch else None)
        batch.start()
        await asyncio.wait_for(batch.first_token.wait(), 600)
        t0, tokens0 = time.perf_counter(), batch.tokens
        loaded = await interactive_load(client, prompts, rnd, args.requests, args.concurrency)
        wall = time.perf_counter() - t0
        batch_tokens = batch.tokens - tokens0
        t1 = time.perf_counter()
        cancelled = await batch.stop()
        stop_s = time.perf_counter() - t1
    await asyncio.sleep(3)  # the cancelled requests leave the engine
    i, lo = summary(idle), summary(loaded)
    return {
        "loadavg_1m_before": round(load1, 2),
        "idle_ttft_ms": idle,
        "loaded_ttft_ms": loaded,
        "idle_p50": i["p50"],
        "idle_p99": i["p99"],
        "loaded_p50": lo["p50"],
        "loaded_p99": lo["p99"],
        "p50_over_idle": round(lo["p50"] / i["p50"], 2),
        "p99_over_idle": round(lo["p99"] / i["p99"], 2),
        "loaded_wall_s": round(wall, 1),
        "batch_tokens_per_s": round(batch_tokens / wall, 1),
        "batch_finished": batch.finished,
        "batch_cancelled": cancelled,
        "stop_s": round(stop_s, 1),
    }


METRICS = ("idle_p50", "idle_p99", "loaded_p50", "loaded_p99", "p50_over_idle", "p99_over_idle")
METRICS += ("batch_tokens_per_s",)


def run_all(args: argparse.Namespace, base: Path, redis_url: str) -> dict[str, Any]:
    report: dict[str, Any] = {"command": command()}
    report["concurrency"] = args.concurrency
    report["variants"] = {v: vars(Variant.parse(v)) for v in args.variants}
    conditions = Conditions()
    variants = args.variants
    servers = {v: start_server(v, base / f"v{i}", redis_url) for i, v in enumerate(variants)}
    try:
        for server in servers.values():
            server.wait_ready(900)
        prompts = Prompts()
        for server in servers.values():  # warm-up, unmeasured: short and long prompts
            asyncio.run(warm_up(server, prompts))
        rows = []
        for rnd in range(args.rounds):
            order = alternate(variants, rnd)
            row: dict[str, Any] = {"round": rnd, "order": order}
            for variant in order:
                row[variant] = asyncio.run(measure(servers[variant], prompts, rnd, args))
                shown = {k: row[variant][k] for k in METRICS}
                print(f"round {rnd} {variant}:", shown, flush=True)
            rows.append(row)
        report["rounds"] = rows
        report["by_variant"] = {
            v: {k: summary([r[v][k] for r in rows], digits=2) for k in METRICS} for v in variants
        }
        report["conditions"] = conditions.report(
            [r[p]["loadavg_1m_before"] for r in rows for p in r["order"]]
        )
    except BaseException:
        for v, server in servers.items():
            print(f"--- {v}: {server.log_path}\n{server.log_tail(80)}", file=sys.stderr)
        raise
    finally:
        report["server_log_errors"] = {p: log_errors(s.log_path) for p, s in servers.items()}
        for server in servers.values():
            server.stop()
    return report


async def warm_up(server: ServerProcess, prompts: Prompts) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=900) as client:
        await chat(client, body(prompts.interactive(-1), 8, None))
        await chat(client, body(prompts.batch(), 8, None))


# -- the report -------------------------------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    by = report["by_variant"]
    rounds = report["rounds"]
    n = len(rounds[0][rounds[0]["order"][0]]["idle_ttft_ms"])
    c = report.get("concurrency", 2)
    cond = report["conditions"]
    lines = [
        "# Interactive TTFT while long batch requests run: priorities, step size, batch cap",
        "",
        "Command (raw results, per round, in the `.json` of the same name):",
        "",
        "```bash",
        report["command"],
        "```",
        "",
        f"{len(rounds)} rounds; per round and server {n} interactive requests idle, and as many "
        f"while {BATCH_STREAMS} batch workers run (prompts of ~{BATCH_PROMPT_TOKENS} tokens, "
        f"{BATCH_MAX_TOKENS} tokens each); TTFT in ms, median (min–max) across rounds. A variant "
        "is engine.scheduling_policy[:engine.max_num_batched_tokens[:limits.max_active_batch]] "
        "(an empty or absent field: vLLM's step of 2048 tokens, no cap on batch streams; with a "
        "cap, the batch requests beyond it wait in the server's admission queue and produce "
        "nothing until a batch slot frees). *First sent*: the "
        f"{c} interactive requests sent as the batch prompts arrive (the worst of them; with a "
        "cap, only that many batch prompts reach the engine then); *later*: the rest, sent while "
        "the batch requests decode or one is replaced. Batch tokens/s: tokens received on all "
        f"{BATCH_STREAMS} batch workers' streams over the loaded phase.",
        "",
        "| variant | idle p50 | idle p99 | loaded p50 | loaded p99 | **loaded/idle p50** "
        "| loaded/idle p99 | loaded, first sent (max) | loaded, later p50 | batch tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v, row in by.items():
        cells = [cell(row[k]) for k in METRICS]
        # the lists are in send order: the first c went out with the batch prompts
        first = [max(r[v]["loaded_ttft_ms"][:c]) for r in rounds]
        later = [summary(r[v]["loaded_ttft_ms"][c:])["p50"] for r in rounds]
        cells[-1:-1] = [cell(summary(first, digits=0)), cell(summary(later, digits=0))]
        lines.append(f"| {v} | {' | '.join(cells)} |")
    lines.append("")
    for v, row in by.items():
        if v.startswith("priority"):
            ratio = row["p50_over_idle"]["p50"]
            met = "met" if ratio <= TARGET else f"not met ({ratio / TARGET - 1:.0%} over)"
            lines.append(
                f"Target, {v}: interactive TTFT p50 loaded within {TARGET}x of idle: "
                f"{ratio:g}x, {met}."
            )
    lines += [
        "",
        "What the figures show, and why the target is or is not met: docs/benchmarks.md, "
        '"Interactive before batch".',
        "",
        "## Conditions",
        "",
        f"- Wall time {cond['wall_s']:g} s; CPU used by processes other than this benchmark and "
        f"its servers: {cond['foreign_cpu_s']:g} CPU-s ({cond['foreign_cores']:g} of 2 cores on "
        "average).",
        f"- 1-minute load before each run: {cond['loadavg_1m_before_runs']}.",
        f"- Other heavy processes at the start: {len(cond['others_start'])}, at the end: "
        f"{len(cond['others_end'])} (listed in the JSON).",
    ]
    errors = {p: e for p, e in report.get("server_log_errors", {}).items() if e}
    if errors:
        lines.append(f"- Server log errors: {errors}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--variants",
        type=variants_arg,
        default=["priority", "fcfs"],
        help="policy[:max_num_batched_tokens[:max_active_batch]], comma-separated, an empty "
        "field for the default (e.g. priority,priority::2,priority:512:1; default priority,fcfs)",
    )
    parser.add_argument("--requests", type=int, default=24, help="interactive, per phase")
    parser.add_argument("--concurrency", type=int, default=2, help="interactive")
    parser.add_argument(
        "--ask-batch", action="store_true", help='batch requests send "priority": "batch"'
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "priority.json")
    parser.add_argument("--render", type=Path, help="only write the .md of this JSON report")
    args = parser.parse_args()
    if args.render:
        report = json.loads(args.render.read_text())
        args.render.with_suffix(".md").write_text(markdown(report))
        return
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp) / "redis") as redis:
        report = run_all(args, Path(tmp), redis.url)
    write_json(args.out, report)
    args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
