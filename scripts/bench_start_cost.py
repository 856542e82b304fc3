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
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.benchstats import cpu_seconds, summary  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

MODELS = ROOT / ".data" / "models"
BACKENDS = ("onnx", "torch")


def start_once(engine: str, backend: str, data: Path) -> dict[str, float]:
    env = {
        "RAG_STREAM_PROFILE": "test",
        "RAG_STREAM_DATA_DIR": str(data),
        "RAG_STREAM_MODELS_DIR": str(MODELS),
        "RAG_STREAM_STREAMING__KEY_PREFIX": f"bench-start-{data.name}",
        "RAG_STREAM_EMBEDDER_BACKEND": backend,
        "RAG_STREAM_LOG_LEVEL": "warning",
    }
    command = None
    if engine == "stub":
        command = [sys.executable, "-m", "tests.support.stub_server"]
    else:
        env["RAG_STREAM_MODEL"] = str(MODELS / "SmolLM2-135M-Instruct")
    data.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    server = ServerProcess(env, data / "server.log", command=command)
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
            order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
            for backend in order:
                got = start_once(engine, backend, Path(tmp) / f"{n}-{backend}")
                runs.setdefault(engine, {}).setdefault(backend, []).append(got)
                print(engine, backend, {k: round(v, 2) for k, v in got.items()}, flush=True)
    report: dict[str, Any] = {"command": " ".join(sys.argv), "results": {}}
    for engine, by_backend in runs.items():
        for backend, rows in by_backend.items():
            report["results"][f"{engine}/{backend}"] = {
                key: summary([row[key] for row in rows], 2) for key in ("cpu_s", "rss_mb", "wall_s")
            }
    for name, figures in report["results"].items():
        shown = (f"{k} {v['p50']} ({v['min']}-{v['max']})" for k, v in figures.items())
        print(name, ", ".join(shown))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
