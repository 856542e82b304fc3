"""A soak of mixed traffic (issue 17, "Load and soak"): is anything left behind?

    .venv/bin/python scripts/soak.py                      # 10 minutes, 2 servers, stub engine
    .venv/bin/python scripts/soak.py --minutes 2 --servers 1
    .venv/bin/python scripts/soak.py --engine vllm --servers 1 --users 4

Servers (`rag-stream serve` code paths; the stub engine paced at 5 ms a token by default, or
SmolLM2 on in-process vLLM) share the machine's Redis, under a key prefix of the run's own, and
a scratch PostgreSQL database made for the run and dropped after it. Traffic
(tests/support/traffic.py): every kind of stream, streamed or not, resumes with Last-Event-ID
on the other server, cancels, clients leaving mid-stream, a small job now and then, uploads and
deletes of documents.

Every --sample-s seconds: RSS and open fds of each server's process tree, its TCP connections
to Redis (matched with CLIENT LIST), the keys under the prefix, SQL rows per table. Phases: a
warm-up burst, a wait until the keys are back (the baseline), the soak, a wait until every
stream has ended and expired, the end. Reported: memory slope (MB/min, least squares over the
second half of the soak, and first to last sample), fds / Redis keys / connections at the end
against the baseline, and SQL rows against what the traffic asked for. RSS counts heap memory
freed but kept by glibc: each server's RSS is also taken right after a ``malloc_trim``
(tests/support/trimmable.py) before the warm-up, at the baseline (after the warm-up, so with
the embedding model loaded and the pools at their working size) and at the end; held memory
that grows from the baseline to the end is a leak, a heap that grew to its working size once
is not. (The trim at the baseline lowers the soak's first samples: RSS then climbs back to
the heap's working size within a minute or two, which the first-to-last figure and the
whole-soak slope include and the second-half slope does not.) With --trim-each-sample every
sample is taken after a trim, so the curve is the memory held. Each server's anonymous memory
(its RSS less file-backed and shared pages) is reported next to its RSS: when other processes
press on memory the kernel drops mapped library pages and RSS falls with them, which says
nothing of a leak (there is no swap to hide anonymous memory in). Each child process's RSS
(vector-store worker, parse workers, vLLM's engine core) is reported apart. At the very end,
after the servers stop, what they left in Redis. Every stream a client saw end must have its
SQL row: any without one is a problem, named with its kind, and the servers' logs are kept
next to the output whenever there was a problem.

So that "back to baseline" can be seen within minutes, finished streams are kept for
--retention-s (60 s, not the default hour) and streams nobody reads are abandoned after
--abandon-s (5 s, not 30 s). Output: docs/bench/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchkit import MODEL, MODELS, command, machine, summary, write_json  # noqa: E402
from tests.support.pg import postgres_database  # noqa: E402
from tests.support.probes import (  # noqa: E402
    Probe,
    RedisProbe,
    sample_process,
    slope_per_min,
    streams_missing,
)
from tests.support.server import ServerProcess  # noqa: E402
from tests.support.traffic import (  # noqa: E402
    WEIGHTS,
    Traffic,
    TrafficConfig,
    engine_model,
    seed_kb,
    wait_until,
)

REDIS_URL = os.environ.get("SOAK_REDIS_URL", "redis://127.0.0.1:6379/0")
KB = "soak"


def start_servers(args: argparse.Namespace, database: str, prefix: str, tmp: Path) -> list[Any]:
    env = {
        "RAG_STREAM_PROFILE": "test",
        "RAG_STREAM_MODELS_DIR": str(MODELS),
        "RAG_STREAM_REDIS_URL": REDIS_URL,
        "RAG_STREAM_DATABASE_URL": database,
        "RAG_STREAM_STREAMING__KEY_PREFIX": prefix,
        "RAG_STREAM_STREAMING__KEEPALIVE_S": "15",
        "RAG_STREAM_STREAMING__RETENTION_S": str(args.retention_s),
        "RAG_STREAM_STREAMING__ABANDON_AFTER_S": str(args.abandon_s),
        "RAG_STREAM_LIMITS__MAX_TOKENS": "4000",
        # both cross-process limits on, high enough never to refuse: their keys come and go
        "RAG_STREAM_LIMITS__PER_TENANT_ACTIVE": "1000",
        "RAG_STREAM_LIMITS__REQUESTS_PER_MINUTE": "1000000",
    }
    # both through tests/support/trimmable.py: SIGUSR2 trims the heap (see trimmed_rss)
    command = [sys.executable, "-m", "tests.support.trimmable", "serve"]
    if args.engine == "stub":
        env["STUB_TOKEN_DELAY_S"] = str(args.stub_delay)
        command[-1] = "stub"
    else:
        env["RAG_STREAM_MODEL"] = str(MODEL)
        env["RAG_STREAM_ENGINE__KV_CACHE_GB"] = str(args.kv_cache_gb)
    servers = []
    for i in range(args.servers):
        data = tmp / f"server-{i}"
        data.mkdir()
        servers.append(
            ServerProcess(
                {**env, "RAG_STREAM_DATA_DIR": str(data)}, tmp / f"server-{i}.log", command=command
            )
        )
    for server in servers:
        server.wait_ready(600)
    return servers


async def trim(pids: dict[str, int], wait_s: float = 3) -> None:
    """Have each server's glibc return freed heap memory (tests/support/trimmable.py)."""
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR2)
    await asyncio.sleep(wait_s)


async def trimmed_rss(pids: dict[str, int]) -> dict[str, dict[str, float]]:
    """Each server's own RSS, then again once glibc has returned freed heap memory (SIGUSR2,
    tests/support/trimmable.py): what it holds, apart from what it once used."""
    before = {name: sample_process(pid).main_rss_mb for name, pid in pids.items()}
    await trim(pids)
    after = {name: sample_process(pid) for name, pid in pids.items()}
    return {
        name: {
            "rss_mb": before[name],
            "after_trim_mb": after[name].main_rss_mb,
            "anon_after_trim_mb": after[name].main_anon_mb,
        }
        for name in pids
    }


def traffic_config(engine: str) -> TrafficConfig:
    if engine == "stub":
        return TrafficConfig(short_tokens=(20, 160), long_tokens=3000, answer_tokens=48)
    # SmolLM2 on 2 cores: ~20-30 tokens/s a stream; a "long" stream must outlive a cancel
    return TrafficConfig(
        short_tokens=(8, 48), long_tokens=400, answer_tokens=24, job_section_tokens=16
    )


def _series(samples: list[dict[str, Any]], name: str, key: str, since: float) -> list[Any]:
    return [
        (s["t_s"], s["processes"][name][key])
        for s in samples
        if s["phase"] == "soak" and s["t_s"] >= since
    ]


def memory_report(samples: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    soak = [s for s in samples if s["phase"] == "soak"]
    start, end = soak[0]["t_s"], soak[-1]["t_s"]
    half = start + (end - start) / 2
    out = {}
    for name in names:
        row: dict[str, Any] = {}
        for key in ("rss_mb", "main_rss_mb", "main_anon_mb"):
            whole = _series(samples, name, key, start)
            second = _series(samples, name, key, half)
            slope_all = slope_per_min(whole)
            slope_half = slope_per_min(second)
            row[key] = {
                "first": whole[0][1],
                "last": whole[-1][1],
                "peak": max(v for _, v in whole),
                "first_to_last_mb": round(whole[-1][1] - whole[0][1], 1),
                "slope_mb_per_min_second_half": None
                if slope_half is None
                else round(slope_half, 2),
                "slope_mb_per_min_whole": None if slope_all is None else round(slope_all, 2),
            }
        children: dict[str, Any] = {}
        for role in sorted({r for s in soak for r in s["processes"][name]["children_rss_mb"]}):
            points = [
                (s["t_s"], s["processes"][name]["children_rss_mb"][role])
                for s in soak
                if role in s["processes"][name]["children_rss_mb"]
            ]
            slope = slope_per_min([p for p in points if p[0] >= half])
            counts = [
                s["processes"][name]["children_by_role"].get(role, 0)
                for s in soak
                if role in s["processes"][name]["children_rss_mb"]
            ]
            children[role] = {
                "first": points[0][1],
                "last": points[-1][1],
                "peak": max(v for _, v in points),
                "samples": len(points),
                # summed over the processes of the role (parse workers come and go: a slope
                # across a change in their number is not one process growing)
                "processes_first_last_max": [counts[0], counts[-1], max(counts)],
                "slope_mb_per_min_second_half": None if slope is None else round(slope, 2),
            }
        row["children_rss_mb"] = children
        out[name] = row
    return out


def process_report(
    baseline: dict[str, Any], end: dict[str, Any], samples: list[dict[str, Any]], names: list[str]
) -> dict[str, Any]:
    out = {}
    for name in names:
        b, e = baseline["processes"][name], end["processes"][name]
        peak = {
            key: max(s["processes"][name][key] for s in samples)
            for key in ("fds", "other_fds", "redis_sockets", "db_sockets", "threads", "children")
        }
        out[name] = {
            key: {"baseline": b[key], "end": e[key], "peak": peak[key]}
            for key in ("fds", "other_fds", "redis_sockets", "db_sockets", "threads", "children")
        }
        out[name]["redis_clients_end"] = e["redis_clients"]
        out[name]["redis_names_end"] = e["redis_names"]
    return out


async def soak(args: argparse.Namespace, servers: list[Any], probe: Probe) -> dict[str, Any]:
    urls = [s.url for s in servers]
    names = list(probe.pids)
    samples: list[dict[str, Any]] = []
    phase = {"name": "idle"}

    async def sampler() -> None:
        while True:
            if args.trim_each_sample:
                await trim(probe.pids, wait_s=1)
            snap = await probe.snapshot(ttl_check=True)
            snap["phase"] = phase["name"]
            snap["load_avg"] = [round(x, 2) for x in os.getloadavg()]
            samples.append(snap)
            line = " ".join(
                f"{n}: {p['rss_mb']} MB {p['fds']} fds {p['redis_sockets']} redis"
                for n, p in snap["processes"].items()
            )
            print(
                f"[{snap['t_s']:7.1f} s {phase['name']:>8}] {line}; keys {snap['redis_keys']}, "
                f"running {snap['running_streams']}, streams rows {snap['sql_rows']['streams']}",
                flush=True,
            )
            await asyncio.sleep(args.sample_s)

    idle = await probe.snapshot(ttl_check=True)  # before any request: presence keys only
    idle_keys = idle["redis_key_shapes"]
    idle_trim = await trimmed_rss(probe.pids)  # (before the warm-up: the soak's curve is its own)
    seeded = await seed_kb(urls[0], KB, documents=4)
    model = await engine_model(urls[0])
    task = asyncio.create_task(sampler())
    cfg = traffic_config(args.engine)

    async def settle(timeout_s: float, rate_keys: bool = True) -> float | None:
        """Wait until no stream runs and the keys are the idle ones (``rate_keys``: the
        per-minute request counters too, which expire 2 minutes after their minute)."""

        async def back() -> bool:
            snap = await probe.snapshot(rows=False)
            shapes = dict(snap["redis_key_shapes"])
            if not rate_keys:
                shapes.pop("rate:*", None)
            return snap["running_streams"] == 0 and shapes == idle_keys

        return await wait_until(back, timeout_s, every_s=2)

    try:
        phase["name"] = "warm-up"
        async with Traffic(urls, KB, model, seed=args.seed, config=cfg) as warm:
            await warm.run(args.warmup_s, args.users)
            await warm.check_abandoned(timeout_s=300)
        phase["name"] = "settle-1"
        warm_settled = await settle(args.retention_s + 240, rate_keys=False)
        base_trim = await trimmed_rss(probe.pids)  # (sleeps 3 s)
        baseline = await probe.snapshot(ttl_check=True)

        phase["name"] = "soak"
        started = time.monotonic()
        async with Traffic(urls, KB, model, seed=args.seed + 1, config=cfg) as traffic:
            await traffic.run(args.minutes * 60, args.users)
            traffic_end = time.monotonic()
            soak_s = traffic_end - started
            phase["name"] = "drain"
            await traffic.check_abandoned(timeout_s=300)
            await traffic.check_deleted()
        phase["name"] = "settle-2"
        settle_start = time.monotonic()
        settled = await settle(args.retention_s + 300)
        await asyncio.sleep(2)
        end = await probe.snapshot(ttl_check=True)
        end["phase"] = "end"
        end_trim = await trimmed_rss(probe.pids)
    finally:
        task.cancel()
    ledger = traffic.ledger
    expected = ledger.expected_rows(baseline["sql_rows"])
    # every stream a client saw end must have its row: name those that do not, by kind
    missing = await streams_missing(probe.database_url, list(ledger.streams))
    for sid in missing:
        ledger.problem(f"stream {sid} ({ledger.streams[sid]}) ended but has no SQL row")
    no_ttl = sorted({k for s in samples for k in s.get("keys_without_ttl", [])})
    peak_keys = max(s["redis_keys"] for s in samples)
    return {
        "servers": {
            n: {"url": u, "pid": pid} for (n, pid), u in zip(probe.pids.items(), urls, strict=True)
        },
        "seeded_documents": len(seeded),
        "warmup": warm.ledger.summary() | {"problems_list": warm.ledger.problems},
        "warmup_settled_after_s": warm_settled,
        "soak_s": round(soak_s, 1),
        "traffic": ledger.summary(),
        "problems": ledger.problems,
        "client_inter_token_ms": summary(ledger.gaps_ms, digits=2) if ledger.gaps_ms else {},
        "results": {
            "memory": memory_report(samples, names),
            "memory_trimmed": {
                "idle": idle_trim,
                "baseline": base_trim,
                "end": end_trim,
                # memory still held at the end that was not at the baseline: a leak's measure
                "held_growth_mb": {
                    n: round(end_trim[n]["after_trim_mb"] - base_trim[n]["after_trim_mb"], 1)
                    for n in names
                },
                # the same in anonymous memory, which memory pressure does not shrink
                "held_anon_growth_mb": {
                    n: round(
                        end_trim[n]["anon_after_trim_mb"] - base_trim[n]["anon_after_trim_mb"], 1
                    )
                    for n in names
                },
            },
            "processes": process_report(baseline, end, samples, names),
            "redis_keys": {
                "idle": idle["redis_key_shapes"],
                "baseline": baseline["redis_key_shapes"],
                "end": end["redis_key_shapes"],
                "peak": peak_keys,
                # None: not within the wait
                "back_to_idle_s_after_traffic": None
                if settled is None
                else round(settle_start + settled - traffic_end, 1),
                "keys_seen_without_ttl": no_ttl,
            },
            "sql_rows": {
                "idle": idle["sql_rows"],
                "before_soak": baseline["sql_rows"],
                "expected": expected,
                "end": end["sql_rows"],
                "match": expected == end["sql_rows"],
                "streams_without_a_row": {sid: ledger.streams[sid] for sid in missing},
            },
        },
        "idle": idle,
        "baseline": baseline,
        "end": end,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--engine", choices=["stub", "vllm"], default="stub")
    parser.add_argument("--users", type=int, default=8, help="concurrent simulated users")
    parser.add_argument("--warmup-s", type=float, default=30)
    parser.add_argument("--sample-s", type=float, default=10)
    parser.add_argument("--retention-s", type=int, default=60)
    parser.add_argument("--abandon-s", type=float, default=5)
    parser.add_argument("--stub-delay", type=float, default=0.005, help="seconds per token")
    parser.add_argument("--kv-cache-gb", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--trim-each-sample",
        action="store_true",
        help="malloc_trim the servers before every sample: the curve is the memory held",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "soak.json")
    args = parser.parse_args()

    prefix = f"rs-soak-{uuid.uuid4().hex[:8]}"
    report: dict[str, Any] = {
        "command": command(),
        "machine": machine(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "settings": {
            "engine": args.engine,
            "servers": args.servers,
            "users": args.users,
            "stub_delay_s": args.stub_delay if args.engine == "stub" else None,
            "trim_each_sample": args.trim_each_sample,
            # glibc's own cap on malloc arenas when set (the service caps them at 2 otherwise,
            # since rag_stream/malloc_arenas.py; the runs before it had glibc's default)
            "malloc_arena_max_env": os.environ.get("MALLOC_ARENA_MAX"),
            "kv_cache_gb": args.kv_cache_gb if args.engine == "vllm" else None,
            "weights": WEIGHTS,
            "shortened": {
                "streaming.retention_s": args.retention_s,
                "streaming.abandon_after_s": args.abandon_s,
            },
            "limits": {"per_tenant_active": 1000, "requests_per_minute": 1000000},
            "redis": "the machine's, prefix of the run's own",
            "database": "a scratch PostgreSQL database",
        },
    }
    databases = postgres_database("rag_stream_soak")
    database = next(databases)
    redis = RedisProbe(REDIS_URL, prefix)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            servers = start_servers(args, database, prefix, Path(tmp))
            try:
                pids = {f"server-{i}": s.proc.pid for i, s in enumerate(servers)}
                probe = Probe(pids, redis, database, db_port=5432)
                report.update(asyncio.run(soak(args, servers, probe)))
            finally:
                for server in servers:
                    server.stop()
            # what the stopped servers leave in Redis, once their leases would have lapsed
            time.sleep(7)
            report.setdefault("results", {})["redis_keys_after_servers_stopped"] = (
                redis.key_census()
            )
            logs = [Path(tmp) / f"server-{i}.log" for i in range(args.servers)]
            report["server_log_tracebacks"] = sum(
                log.read_text(errors="replace").count("Traceback") for log in logs
            )
            if report.get("problems") or report["server_log_tracebacks"]:
                # the servers' logs, to find what the problems were
                kept = args.out.with_suffix(".logs")
                kept.mkdir(parents=True, exist_ok=True)
                for log in logs:
                    shutil.copy(log, kept / log.name)
                report["server_logs_kept_in"] = str(kept)
    finally:
        redis.delete_all()
        redis.close()
        next(databases, None)  # drops the database
    report["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    print(json.dumps({k: report[k] for k in ("traffic", "results", "problems")}, indent=2))


if __name__ == "__main__":
    main()
