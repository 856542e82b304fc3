"""How vLLM runs the model on a CPU: ``engine.cpu_executor`` "uni" against vLLM's own "mp".

Per round and executor (the order alternates by round), a fresh process starts the in-process
engine (``VLLMEngine.start``, SmolLM2-135M-Instruct float32, as the service does) and reports:
  - start: wall seconds and CPU seconds of the process tree until the engine is ready;
  - decode: fresh chat prompts (a nonce first: no cached prefix), greedy, one at a time; wall
    tokens/s and the CPU seconds the engine's processes spent per output token;
  - room left: a CPU-bound probe process (a pure-Python loop) runs while the engine decodes,
    its rate against the probe alone in the same round (what a second process, the API server
    on a 2-core machine say, still gets);
  - the token ids of one fixed prompt, which must be the same in every run (greedy float32).

    .venv/bin/python scripts/bench_cpu_executor.py --rounds 3 --out docs/bench/cpu_executor.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchkit import alternate, command, summary, tree_cpu_seconds, write_json  # noqa: E402

PROBE = (
    "import time\nt = time.time(); n = 0\n"
    "while time.time() - t < {s}:\n    sum(range(10000)); n += 1\nprint(n)"
)


async def child(executor: str, prompts: int, max_tokens: int, probe_s: float) -> None:
    """One engine: runs in its own session, prints one JSON line."""
    from rag_stream.generation.engine import Sampling
    from rag_stream.generation.vllm_engine import VLLMEngine
    from rag_stream.settings import load_settings

    me = os.getpid()  # with the engine core, when the executor starts one
    started = time.monotonic()
    settings = load_settings(
        profile="default", dtype="float32", engine={"cpu_executor": executor, "kv_cache_gb": 0.5}
    )
    engine = await VLLMEngine.start(settings)
    start_wall = time.monotonic() - started
    start_cpu = tree_cpu_seconds(me)
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    async def decode(i: int, nonce: bool = True) -> list[int]:
        text = f"Write a long story about lighthouse number {i}."
        if nonce:
            text = f"[{uuid.uuid4().hex[:8]}] {text}"
        prompt = engine.chat_prompt([{"role": "user", "content": text}])
        ids: list[int] = []
        async for step in engine.generate(f"b{i}-{uuid.uuid4().hex}", prompt, sampling):
            ids.extend(step.token_ids)
        return ids

    # unmeasured warm-up, on the same prompt in every run: its ids are compared across runs
    reference = await decode(-1, nonce=False)
    cpu0, wall0 = tree_cpu_seconds(me), time.monotonic()
    for i in range(prompts):
        await decode(i)
    decode_wall, decode_cpu = time.monotonic() - wall0, tree_cpu_seconds(me) - cpu0
    # the probe starts once the engine's CPU time has been read
    probe = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PROBE.format(s=probe_s),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    finished = asyncio.ensure_future(probe.communicate())
    busy = 0
    while not finished.done():  # keep the engine decoding for as long as the probe runs
        await decode(prompts + busy)
        busy += 1
    probe_out, _ = await finished
    tokens = prompts * max_tokens
    print(
        json.dumps(
            {
                "executor": executor,
                "start_wall_s": start_wall,
                "start_cpu_s": start_cpu,
                "tokens_per_s": tokens / decode_wall,
                "engine_cpu_ms_per_token": 1000 * decode_cpu / tokens,
                "probe_while_decoding": int(probe_out),
                "token_ids": reference,
            }
        ),
        flush=True,
    )
    await engine.close()


def run_one(executor: str, args: argparse.Namespace) -> dict[str, Any]:
    out = subprocess.run(
        [
            *(sys.executable, __file__, "--child", executor, "--prompts", str(args.prompts)),
            *("--max-tokens", str(args.max_tokens), "--probe-s", str(args.probe_s)),
        ],
        capture_output=True,
        text=True,
        start_new_session=True,
        cwd=ROOT,
        timeout=900,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{executor} run failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def probe_alone(seconds: float) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE.format(s=seconds)], capture_output=True)
    return int(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--probe-s", type=float, default=8.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", choices=["uni", "mp"])
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child, args.prompts, args.max_tokens, args.probe_s))
        return
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        alone = probe_alone(args.probe_s)
        for executor in alternate(("uni", "mp"), r):
            run = run_one(executor, args)
            run["round"] = r
            run["probe_share"] = run["probe_while_decoding"] / alone
            runs.append(run)
            print(
                f"round {r} {executor}: start {run['start_wall_s']:.1f} s "
                f"({run['start_cpu_s']:.1f} CPU-s), {run['tokens_per_s']:.1f} tok/s, "
                f"{run['engine_cpu_ms_per_token']:.1f} engine CPU-ms/token, "
                f"probe kept {run['probe_share']:.2f}",
                flush=True,
            )
    same = len({tuple(run["token_ids"]) for run in runs}) == 1
    report: dict[str, Any] = {
        "command": command(),
        "same_tokens_everywhere": same,
        "args": vars(args) | {"out": None},
    }
    for executor in ("uni", "mp"):
        mine = [run for run in runs if run["executor"] == executor]
        report[executor] = {
            key: summary([run[key] for run in mine], 2)
            for key in (
                "start_wall_s",
                "start_cpu_s",
                "tokens_per_s",
                "engine_cpu_ms_per_token",
                "probe_share",
            )
        }
    by_round = {
        r: {run["executor"]: run for run in runs if run["round"] == r} for r in range(args.rounds)
    }
    report["ratios_uni_over_mp"] = {
        key: summary([by_round[r]["uni"][key] / by_round[r]["mp"][key] for r in by_round], 2)
        for key in ("start_cpu_s", "tokens_per_s", "engine_cpu_ms_per_token")
    }
    report["runs"] = [{k: v for k, v in run.items() if k != "token_ids"} for run in runs]
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))
    if args.out:
        write_json(args.out, report, indent=1)
    if not same:
        print("the executors gave different tokens", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
