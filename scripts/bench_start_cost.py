"""What a server process costs to start, by embedder backend: its own CPU time (utime +
stime, not its children's: a vLLM server's engine core is left out) until ``/readyz`` says
ready, and its resident memory then.

    .venv/bin/python scripts/bench_start_cost.py --rounds 3 --vllm-rounds 1 \
        --json docs/bench/start-cost.json

Each round starts one server per backend, the order alternating between rounds, one at a
time, against the local Redis under a key prefix of its own. ``stub`` servers run the test
suite's stub engine (most of the suite's servers, the cluster's API processes); ``vllm``
servers the real SmolLM2 engine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.benchkit import (  # noqa: E402
    MODEL,
    STUB_SERVER,
    alternate,
    command,
    cpu_seconds,
    start_rag_stream,
    summary,
    write_json,
)

BACKENDS = ("onnx", "torch")


def start_once(engine: str, backend: str, data: Path) -> dict[str, float]:
    env = {
        "RAG_STREAM_STREAMING__KEY_PREFIX": f"bench-start-{data.name}",
        "RAG_STREAM_EMBEDDER_BACKEND": backend,
    }
    if engine != "stub":
        env["RAG_STREAM_MODEL"] = str(MODEL)
    started = time.monotonic()
    stub = STUB_SERVER if engine == "stub" else None
    server = start_rag_stream(data, env, profile="test", argv=stub)
    try:
        server.wait_ready(600, poll_s=0.1)  # polled often: the CPU time is read once ready
        return {
            "cpu_s": cpu_seconds(server.proc.pid),
            "rss_mb": psutil.Process(server.proc.pid).memory_info().rss / 2**20,
            "wall_s": time.monotonic() - started,
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="stub-engine rounds")
    parser.add_argument("--vllm-rounds", type=int, default=1, help="real-engine rounds")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        plan = [("stub", r) for r in range(args.rounds)]
        plan += [("vllm", r) for r in range(args.vllm_rounds)]
        for n, (engine, r) in enumerate(plan):
            for backend in alternate(BACKENDS, r):
                got = start_once(engine, backend, Path(tmp) / f"{n}-{backend}")
                runs.setdefault(engine, {}).setdefault(backend, []).append(got)
                print(engine, backend, {k: round(v, 2) for k, v in got.items()}, flush=True)
    report: dict[str, Any] = {"command": command(), "results": {}}
    for engine, by_backend in runs.items():
        for backend, rows in by_backend.items():
            report["results"][f"{engine}/{backend}"] = {
                key: summary([row[key] for row in rows], 2) for key in ("cpu_s", "rss_mb", "wall_s")
            }
    for name, figures in report["results"].items():
        shown = (f"{k} {v['p50']} ({v['min']}-{v['max']})" for k, v in figures.items())
        print(name, ", ".join(shown))
    if args.json:
        write_json(args.json, report)


if __name__ == "__main__":
    main()
