"""The CPU a request costs the API process apart from its tokens, for the code of two trees side
by side: streams of 2 tokens, 8 at a time (``bench_gateway.stub_requests``), on two stub-engine
servers (``bench_streams.start_stub``) sharing one private Redis, one from this checkout and one
from ``--before`` (another checkout of the service, e.g. ``git archive REV | tar -x -C DIR``),
which goes first alternating by round.

    .venv/bin/python scripts/bench_request_cpu.py --before /tmp/before --rounds 6 --requests 800
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_gateway import stub_requests  # noqa: E402
from scripts.bench_streams import start_stub  # noqa: E402
from scripts.benchkit import alternate, command, private_redis, summary, write_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other tree's root")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=800, help="per server and round")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trees: dict[str, Path | None] = {"before": args.before, "after": None}
    with (
        tempfile.TemporaryDirectory() as tmp,
        private_redis(Path(tmp) / "redis", unix_socket=True) as redis,
    ):
        url = redis.socket_url or redis.url
        servers = {
            name: start_stub(Path(tmp) / name, url, True, code) for name, code in trees.items()
        }
        try:
            for server in servers.values():
                asyncio.run(stub_requests(server, 200))  # warm
            ms: dict[str, list[float]] = {name: [] for name in servers}
            for rnd in range(args.rounds):
                for name in alternate(list(servers), rnd):
                    row = asyncio.run(stub_requests(servers[name], args.requests))
                    ms[name].append(row["cpu_ms_per_request"])
                    print(rnd, name, row, flush=True)
        finally:
            for server in servers.values():
                server.stop()
    ratios = [a / b for a, b in zip(ms["after"], ms["before"], strict=True)]
    report = {
        "command": command(),
        "cpu_ms_per_request": {name: summary(v, 2) for name, v in ms.items()},
        "after_over_before": summary(ratios, 3),
        "rounds": ms,
    }
    print(report["cpu_ms_per_request"], "after/before", report["after_over_before"])
    print("median of ratios", round(statistics.median(ratios), 3))
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()
