"""The API process's CPU for the code of two trees side by side, on the stub engine: one from
this checkout and one from ``--before`` (another checkout of the service, e.g.
``git archive REV | tar -x -C DIR``), two stub servers (``bench_streams.start_stub``) sharing
one private Redis, the one that goes first alternating by round. Two workloads:

- ``requests``: streams of 2 tokens, 8 at a time (``bench_gateway.stub_requests``): what a
  request costs apart from its tokens, in ms;
- ``lockstep``: ``--streams`` streams of ``--tokens`` tokens at once, the stub stepping as vLLM
  does (every ``--step-ms`` one token to each stream, ``bench_streams.lockstep``): the CPU per
  token behind a real engine, where every token wakes its stream up, in µs.

    .venv/bin/python scripts/bench_request_cpu.py --before /tmp/before --rounds 6 --requests 800
    .venv/bin/python scripts/bench_request_cpu.py --before /tmp/before --workload lockstep
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_gateway import stub_batch, stub_requests  # noqa: E402
from scripts.bench_streams import start_stub  # noqa: E402
from scripts.benchkit import alternate, command, private_redis, summary, write_json  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402


def measure(server: ServerProcess, args: argparse.Namespace) -> tuple[float, dict[str, Any]]:
    """One round on one server: the figure compared, and the round's row."""
    if args.workload == "requests":
        row = asyncio.run(stub_requests(server, args.requests))
        return row["cpu_ms_per_request"], row
    rows = [
        asyncio.run(stub_batch(server, args.streams, args.tokens, None))
        for _ in range(args.batches)
    ]
    tokens = sum(r["tokens"] for r in rows)
    cpu = sum(r["server_cpu_s"] for r in rows)
    return round(cpu / tokens * 1e6, 1), {"tokens": tokens, "server_cpu_s": round(cpu, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other tree's root")
    parser.add_argument("--workload", choices=("requests", "lockstep"), default="requests")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=800, help="(requests) per server, round")
    parser.add_argument("--streams", type=int, default=32, help="(lockstep) streams at once")
    parser.add_argument("--tokens", type=int, default=64, help="(lockstep) tokens a stream")
    parser.add_argument("--batches", type=int, default=3, help="(lockstep) per server, round")
    parser.add_argument("--step-ms", type=float, default=20, help="(lockstep) the engine step")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    unit = "cpu_ms_per_request" if args.workload == "requests" else "cpu_us_per_token"
    step = args.step_ms if args.workload == "lockstep" else None
    trees: dict[str, Path | None] = {"before": args.before, "after": None}
    with (
        tempfile.TemporaryDirectory() as tmp,
        private_redis(Path(tmp) / "redis", unix_socket=True) as redis,
    ):
        url = redis.socket_url or redis.url
        servers = {
            name: start_stub(Path(tmp) / name, url, True, code, step)
            for name, code in trees.items()
        }
        try:
            for server in servers.values():
                asyncio.run(stub_requests(server, 200))  # warm
            figures: dict[str, list[float]] = {name: [] for name in servers}
            for rnd in range(args.rounds):
                for name in alternate(list(servers), rnd):
                    figure, row = measure(servers[name], args)
                    figures[name].append(figure)
                    print(rnd, name, {unit: figure, **row}, flush=True)
        finally:
            for server in servers.values():
                server.stop()
    ratios = [a / b for a, b in zip(figures["after"], figures["before"], strict=True)]
    report = {
        "command": command(),
        "workload": args.workload,
        unit: {name: summary(v, 2) for name, v in figures.items()},
        "after_over_before": summary(ratios, 3),
        "rounds": figures,
    }
    print(report[unit], "after/before", report["after_over_before"])
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()
