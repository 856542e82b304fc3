"""What the cap of two malloc arenas costs the knowledge-base server (issue 17).

    .venv/bin/python scripts/bench_arenas.py                    # 3 rounds each, ~10 min
    .venv/bin/python scripts/bench_arenas.py --rounds 1 --seconds 20

The service caps glibc's arenas at two (rag_stream/malloc_arenas.py) because the embedding
threads otherwise leave memory held in arenas of their own. Fewer arenas can mean threads
waiting on each other's malloc lock. This runs the same concurrent knowledge-base traffic
(searches, each embedding its query, and uploads, each embedding its chunks, some parsed in a
worker process; the oldest documents deleted) against one server with the service's cap and
one with glibc's default for this machine (``MALLOC_ARENA_MAX`` = 8 per core), fresh for each
round, the order alternating. Reported per configuration: actions a second, search and upload
latency p50/p99, and the memory the server holds at the end (anonymous, after ``malloc_trim``).
Output: one JSON line per round, then a summary (medians and ranges) on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memory_by_action import act, held_mb, seed, start_server  # noqa: E402

from scripts.benchkit import alternate, command, percentile  # noqa: E402

CONFIGS = {
    "capped": {},  # the service's own cap (no MALLOC_ARENA_MAX in its environment)
    "glibc": {"MALLOC_ARENA_MAX": str(8 * (os.cpu_count() or 1))},
}


def _ms(seconds: list[float], q: float) -> float:
    return round(1000 * percentile(seconds, q), 1) if seconds else float("nan")


def run_round(config: str, seconds: float, users: int, round_seed: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(tmp, **CONFIGS[config])
        try:
            with httpx.Client(base_url=server.url, timeout=120) as client:
                seed(client, random.Random(round_seed))
            latencies: dict[str, list[float]] = {"search": [], "upload": []}
            errors: list[str] = []
            start = time.monotonic()
            warm_until, stop_at = start + 10, start + 10 + seconds

            def user(n: int) -> None:
                urng = random.Random(round_seed * 100 + n)
                docs: list[str] = []
                with httpx.Client(base_url=server.url, timeout=120) as client:
                    i = 0
                    while (now := time.monotonic()) < stop_at:
                        i += 1
                        action = "upload" if urng.random() < 0.3 else "search"
                        try:
                            act(client, action, urng, n * 100_000 + i, docs)
                        except httpx.HTTPError as exc:
                            errors.append(f"{action}: {exc}")
                            continue
                        if now >= warm_until:
                            latencies[action].append(time.monotonic() - now)

            threads = [threading.Thread(target=user, args=(n,)) for n in range(users)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            done = sum(len(v) for v in latencies.values())
            return {
                "config": config,
                "actions_per_s": round(done / seconds, 2),
                "searches": len(latencies["search"]),
                "uploads": len(latencies["upload"]),
                "search_ms_p50": _ms(latencies["search"], 0.5),
                "search_ms_p99": _ms(latencies["search"], 0.99),
                "upload_ms_p50": _ms(latencies["upload"], 0.5),
                "upload_ms_p99": _ms(latencies["upload"], 0.99),
                "held_anon_mb": held_mb(server.proc.pid),
                "errors": errors[:5],
                "error_count": len(errors),
            }
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--users", type=int, default=6)
    args = parser.parse_args()
    os.environ.pop("MALLOC_ARENA_MAX", None)  # the servers inherit this environment
    rounds: list[dict[str, object]] = []
    for r in range(args.rounds):
        for config in alternate(list(CONFIGS), r):
            result = {"round": r, **run_round(config, args.seconds, args.users, round_seed=r + 1)}
            rounds.append(result)
            print(json.dumps(result), flush=True)
    summary: dict[str, object] = {"command": command(), "users": args.users}
    for config in CONFIGS:
        mine = [x for x in rounds if x["config"] == config]
        for field in (
            "actions_per_s",
            "search_ms_p50",
            "search_ms_p99",
            "upload_ms_p50",
            "held_anon_mb",
        ):
            values = [float(x[field]) for x in mine]  # type: ignore[arg-type]
            summary[f"{config}.{field}"] = {
                "median": round(statistics.median(values), 1),
                "range": [min(values), max(values)],
            }
    capped = statistics.median(float(x["actions_per_s"]) for x in rounds if x["config"] == "capped")  # type: ignore[arg-type]
    default = statistics.median(float(x["actions_per_s"]) for x in rounds if x["config"] == "glibc")  # type: ignore[arg-type]
    summary["throughput_ratio_capped_to_glibc"] = round(capped / default, 3)
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
