"""Many concurrent SSE readers on one API process (issue 17, "Load and soak").

    .venv/bin/python scripts/bench_readers.py                  # everything, as in the docs
    .venv/bin/python scripts/bench_readers.py --readers 200 --skip-vllm   # a quick look

One `rag-stream serve` process (tests/support/stub_server.py: the real app on the stub engine,
paced at --delay seconds a token) and a private redis-server on a free port. Phases:

1. fan-out: --readers readers over --streams streams (the POST that starts a stream is one of
   its readers, the rest follow it with GET /v1/streams/{id}/events from the start);
2. own streams: --own-readers readers, each POSTing and reading a stream of its own;
3. the real engine (SmolLM2 float32, vLLM in-process, KV cache --kv-cache-gb): for each of
   --vllm-streams, that many streams with --vllm-readers readers each.

Measured at the client: the time between consecutive events of a reader (counted once every
reader of the run is attached, so the replay a late reader starts with is left out; also by
quarter of the time from then to the last event, to tell a slow start from slowness that
lasts), the spread of one event's arrival across its readers, and each reader's events
against the stream's log read straight from Redis (ids lost or repeated, data that differs).
At the server: CPU seconds and peak RSS of its process tree, CPU of redis-server and of this
client.

The client is a minimal HTTP/1.1 reader over asyncio streams (chunked transfer, SSE frames
split whole), not httpx: on 2 cores the client's own CPU competes with the server's, and
h11's per-chunk cost would be measured instead of the server. Output: docs/bench/readers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import resource
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchkit import (  # noqa: E402
    MODEL,
    STUB_SERVER,
    command,
    machine,
    private_redis,
    start_rag_stream,
    summary,
    write_json,
)
from tests.support.probes import RedisProbe, cpu_seconds, sample_process  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

PREFIX = "rs-bench-readers"
STORY = "Write a long story about a lighthouse keeper and a storm, chapter {n}."
# ASCII: one token an event, so the gap between events is the pace (the stub's default text
# holds Chinese characters, three tokens each, sent as one event: gaps of three paces)
STUB_TEXT = "Resumable streams survive the client, the network and the server. "
# the last line of a traceback: ``package.module.SomeError: message``
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Timeout|Exit)\b(: |$)")


# -- a lean SSE client ----------------------------------------------------------------------


@dataclass
class Reader:
    stream_id: str = ""
    ids: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    digest: Any = field(default_factory=hashlib.sha256)
    error: str | None = None
    attached: asyncio.Event = field(default_factory=asyncio.Event)  # first frame, or failed
    started: float = 0.0  # when its request was sent
    poster: bool = False  # it asked for the stream (POST), the others follow it (GET)


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The body of a chunked HTTP/1.1 response, chunk by chunk."""
    while True:
        line = await reader.readline()
        size = int(line.split(b";")[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def read_sse(
    port: int, method: str, path: str, out: Reader, body: dict[str, Any] | None = None
) -> None:
    """Send one request and read its event stream to the terminal event into ``out``."""
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    except OSError as exc:
        out.error = f"connect: {exc}"
        return
    try:
        payload = json.dumps(body).encode() if body is not None else b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Accept: text/event-stream\r\nConnection: close\r\n"
        )
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        out.started = time.monotonic()
        w.write(head.encode() + b"\r\n" + payload)
        status = await r.readline()
        headers = await r.readuntil(b"\r\n\r\n")
        if b" 200 " not in status or b"chunked" not in headers.lower():
            out.error = f"{status.decode().strip()}"
            return
        buf = b""
        async for chunk in _chunks(r):
            buf += chunk
            if b"\n\n" not in buf:
                continue
            at = time.monotonic()
            *blocks, buf = buf.split(b"\n\n")
            for block in blocks:
                if _frame(block, at, out):
                    return
        out.error = "the stream ended without a terminal event"
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.attached.set()
        w.close()
        with contextlib.suppress(OSError):
            await w.wait_closed()


def _frame(block: bytes, at: float, out: Reader) -> bool:
    """Record one frame; True at the terminal one."""
    event_id, event, data = -1, b"", b""
    for line in block.split(b"\n"):
        if line.startswith(b"id: "):
            event_id = int(line[4:])
        elif line.startswith(b"event: "):
            event = line[7:]
        elif line.startswith(b"data: "):
            data = line[6:]
    if not data:
        return False  # a keep-alive comment alone
    if event_id == 0 and not out.stream_id:
        out.stream_id = json.loads(data)["stream_id"]
    out.attached.set()
    out.ids.append(event_id)
    out.times.append(at)
    out.events.append(event.decode())
    out.digest.update(b"%d\n" % event_id + data + b"\n")
    return event in (b"done", b"error")


# -- measuring ------------------------------------------------------------------------------


class Sampler:
    """Peak RSS of a process tree, sampled every ``every_s`` in a thread."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.pid = pid
        self.peak_rss_mb = 0.0
        self.peak_fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = sample_process(self.pid)
            self.peak_rss_mb = max(self.peak_rss_mb, sample.rss_mb)
            self.peak_fds = max(self.peak_fds, sample.fds)
            self._stop.wait(0.5)


def _expected(probe: RedisProbe, sid: str) -> tuple[list[int], str]:
    """The log's event ids and the digest a reader of the whole stream must end with."""
    digest = hashlib.sha256()
    ids = []
    for i, raw in enumerate(probe.log(sid)):
        digest.update(b"%d\n" % i + raw.encode() + b"\n")
        ids.append(i)
    return ids, digest.hexdigest()


def analyse(readers: list[Reader], probe: RedisProbe, token_events: bool = False) -> dict[str, Any]:
    """Gaps, spreads, and every reader checked against its stream's log."""
    failed = [r for r in readers if r.error]
    good = [r for r in readers if not r.error and r.times]
    attached = max(r.times[0] for r in good) if good else 0.0
    gaps: list[float] = []
    gap_times: list[float] = []  # when each gap ended
    per_event: dict[tuple[str, int], list[float]] = {}
    lost = duplicated = differing = 0
    logs: dict[str, tuple[list[int], str]] = {}
    for r in good:
        if r.stream_id not in logs:
            logs[r.stream_id] = _expected(probe, r.stream_id)
        ids, digest = logs[r.stream_id]
        lost += len(set(ids) - set(r.ids))
        duplicated += len(r.ids) - len(set(r.ids))
        differing += r.digest.hexdigest() != digest
        prev: float | None = None
        for event_id, event, at in zip(r.ids, r.events, r.times, strict=True):
            if token_events and event != "token":
                continue
            if at >= attached:
                if prev is not None:
                    gaps.append((at - prev) * 1000)
                    gap_times.append(at)
                spread = per_event.setdefault((r.stream_id, event_id), [at, at])
                spread[0], spread[1] = min(spread[0], at), max(spread[1], at)
            prev = at if at >= attached else None
    spreads = [(hi - lo) * 1000 for lo, hi in per_event.values()]
    # the reader that asked for the stream (POST) waited this long for its first token
    first_token = [
        (r.times[r.events.index("token")] - r.started) * 1000
        for r in good
        if r.poster and "token" in r.events
    ]
    first = {r.stream_id: r for r in reversed(good)}  # one reader of each stream
    events = sum(len(r.ids) for r in good)
    # the same gaps by quarter of the time from the last reader's attach to the last event:
    # whether slow gaps belong to the start (connects and replays) or last throughout
    quarters: list[list[float]] = [[], [], [], []]
    if gap_times:
        span = max(gap_times) - attached or 1.0
        for gap, at in zip(gaps, gap_times, strict=True):
            quarters[min(3, int((at - attached) / span * 4))].append(gap)
    return {
        "readers": len(readers),
        "readers_failed": len(failed),
        "failures": sorted({r.error or "" for r in failed})[:5],
        "streams": len(logs),
        "events_received": events,
        "token_events": sum(r.events.count("token") for r in first.values()),
        "events_lost": lost,
        "events_duplicated": duplicated,
        "readers_with_different_data": differing,
        "inter_event_ms": summary(gaps, digits=2) if gaps else {},
        "inter_event_ms_by_quarter": [summary(q, digits=2) if q else {} for q in quarters],
        "fanout_spread_ms": summary(spreads, digits=2) if spreads else {},
        "first_token_ms": summary(first_token, digits=1) if first_token else {},
    }


async def _run_readers(
    port: int,
    starts: list[dict[str, Any]],
    followers: int,
    connect_parallel: int = 100,
) -> list[Reader]:
    """POST each body (a reader of its own stream), then ``followers`` GET readers on each
    stream from its start."""
    posters = [Reader(poster=True) for _ in starts]
    tasks = [
        asyncio.create_task(read_sse(port, "POST", "/v1/generate", reader, body))
        for reader, body in zip(posters, starts, strict=True)
    ]
    async with asyncio.timeout(300):
        await asyncio.gather(*(p.attached.wait() for p in posters))
    gate = asyncio.Semaphore(connect_parallel)
    readers = list(posters)

    async def follow(sid: str) -> None:
        reader = Reader(stream_id=sid)
        readers.append(reader)
        async with gate:  # a burst of connects would overflow the listen backlog
            task = asyncio.create_task(read_sse(port, "GET", f"/v1/streams/{sid}/events", reader))
            await reader.attached.wait()
        await task

    tasks += [
        asyncio.create_task(follow(p.stream_id))
        for p in posters
        if p.stream_id
        for _ in range(followers)
    ]
    await asyncio.gather(*tasks)
    return readers


def measure(server: ServerProcess, redis_pid: int, probe: RedisProbe, **run: Any) -> dict[str, Any]:
    """One run of ``_run_readers`` with CPU and memory of the server, Redis and this client."""
    token_events = run.pop("token_events", False)
    cpu0 = cpu_seconds(server.proc.pid)
    redis0 = cpu_seconds(redis_pid)
    me0 = time.process_time()
    wall0 = time.perf_counter()
    with Sampler(server.proc.pid) as sampler:
        readers = asyncio.run(_run_readers(server.port, **run))
    wall = time.perf_counter() - wall0
    result = analyse(readers, probe, token_events=token_events)
    result.update(
        {
            "wall_s": round(wall, 2),
            "server_cpu_s": round(cpu_seconds(server.proc.pid) - cpu0, 2),
            "server_peak_rss_mb": sampler.peak_rss_mb,
            "server_peak_fds": sampler.peak_fds,
            "redis_cpu_s": round(cpu_seconds(redis_pid) - redis0, 2),
            "client_cpu_s": round(time.process_time() - me0, 2),
        }
    )
    result["events_per_s"] = round(result["events_received"] / wall)
    if result["server_cpu_s"]:
        result["events_per_server_cpu_s"] = round(
            result["events_received"] / result["server_cpu_s"]
        )
    return result


# -- servers --------------------------------------------------------------------------------


def start_server(
    data: Path, redis_url: str, engine: str, args: argparse.Namespace
) -> ServerProcess:
    env = {
        "RAG_STREAM_REDIS_URL": redis_url,
        "RAG_STREAM_STREAMING__KEY_PREFIX": PREFIX,
        "RAG_STREAM_STREAMING__KEEPALIVE_S": "15",  # the default profile's, not the tests' 1 s
        "RAG_STREAM_LIMITS__MAX_ACTIVE_STREAMS": str(max(64, *args.own_readers) + 16),
        "RAG_STREAM_LIMITS__MAX_TOKENS": "4096",
    }
    if engine == "stub":
        env["STUB_TOKEN_DELAY_S"] = str(args.delay)
        env["STUB_TEXT"] = STUB_TEXT
    else:
        env["RAG_STREAM_MODEL"] = str(MODEL)
        env["RAG_STREAM_ENGINE__KV_CACHE_GB"] = str(args.kv_cache_gb)
        env["RAG_STREAM_ENGINE__MAX_NUM_SEQS"] = str(max(args.vllm_streams))
    stub = STUB_SERVER if engine == "stub" else None
    server = start_rag_stream(data, env, profile="test", argv=stub)
    server.wait_ready(600)
    return server


def raise_fd_limit(needed: int) -> dict[str, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        soft = min(hard, max(needed, soft))
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return {"soft": soft, "hard": hard}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, default=1000, help="fan-out readers in all")
    parser.add_argument("--streams", type=int, default=4, help="streams they share")
    parser.add_argument("--tokens", type=int, default=300, help="tokens of each stub stream")
    parser.add_argument("--delay", type=float, default=0.05, help="stub seconds per token")
    parser.add_argument(
        "--own-readers", type=_ints, default=[250, 500, 1000], help="runs of N; 0: none"
    )
    parser.add_argument("--own-tokens", type=int, default=200)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-stub", action="store_true")
    parser.add_argument("--vllm-streams", type=_ints, default=[1, 8, 16])
    parser.add_argument("--vllm-readers", type=int, default=4, help="readers per stream")
    parser.add_argument("--vllm-tokens", type=int, default=128)
    parser.add_argument("--kv-cache-gb", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "readers.json")
    parser.add_argument("--keep-logs", type=Path, help="a folder to copy the servers' logs to")
    args = parser.parse_args()

    limit = raise_fd_limit(3 * max(args.readers, *args.own_readers) + 256)
    report: dict[str, Any] = {
        "command": command(),
        "machine": machine() | {"load_avg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "fd_limit": limit,
        "settings": {
            "stub_delay_s": args.delay,
            "keepalive_s": 15,
            "redis_pool_size": 64,
            "client": "raw HTTP/1.1 over asyncio streams, one process",
        },
    }
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp) / "redis") as redis:
        assert redis.proc is not None
        probe = RedisProbe(redis.url, PREFIX)
        try:
            runs = [("stub", args.skip_stub, stub_phases), ("vllm", args.skip_vllm, vllm_phases)]
            for engine, skip, phases in runs:
                if skip:
                    continue
                server = start_server(Path(tmp) / engine, redis.url, engine, args)
                try:
                    phases(server, redis.proc.pid, probe, args, report)
                finally:
                    server.stop()
                    server_log(server, engine, args, report)
        finally:
            probe.close()
    report["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write_json(args.out, report)
    print(json.dumps(report, indent=2))


def server_log(
    server: ServerProcess, engine: str, args: argparse.Namespace, report: dict[str, Any]
) -> None:
    """What the server logged that went wrong (its tracebacks: a reader's HTTP 500 says why
    there), and the whole log kept with --keep-logs."""
    text = server.log_path.read_text(errors="replace")
    lines = text.splitlines()
    errors = [line for line in lines if " ERROR " in line or line.startswith("ERROR")]
    report.setdefault("server_logs", {})[engine] = {
        "error_lines": len(errors),
        "first_error_lines": errors[:5],
        "tracebacks": text.count("Traceback (most recent call last):"),
        # the exceptions the tracebacks end with, counted (a request's error is logged twice:
        # by the app's handler and by uvicorn)
        "exceptions": dict(Counter(line[:300] for line in lines if _EXCEPTION.match(line))),
    }
    if args.keep_logs:
        args.keep_logs.mkdir(parents=True, exist_ok=True)
        (args.keep_logs / f"{engine}.log").write_text(text)


def stub_phases(
    server: ServerProcess,
    redis_pid: int,
    probe: RedisProbe,
    args: argparse.Namespace,
    report: dict[str, Any],
) -> None:
    def bodies(n: int, tokens: int) -> list[dict[str, Any]]:
        return [{"prompt": f"readers {i}", "max_tokens": tokens} for i in range(n)]

    measure(server, redis_pid, probe, starts=bodies(2, 20), followers=2)  # warm-up
    runs: dict[str, Any] = {}
    per_stream = max(1, args.readers // args.streams)
    print(f"reference: {args.streams} streams, 1 reader each", flush=True)
    runs["reference"] = measure(
        server, redis_pid, probe, starts=bodies(args.streams, args.tokens), followers=0
    )
    print(f"fan-out: {args.streams} streams x {per_stream} readers", flush=True)
    runs["fanout"] = measure(
        server,
        redis_pid,
        probe,
        starts=bodies(args.streams, args.tokens),
        followers=per_stream - 1,
    )
    for name in ("reference", "fanout"):
        runs[name]["tokens_per_stream"] = args.tokens
    for n in (n for n in args.own_readers if n > 0):
        print(f"own streams: {n} readers, a stream each", flush=True)
        run = measure(server, redis_pid, probe, starts=bodies(n, args.own_tokens), followers=0)
        run["tokens_per_stream"] = args.own_tokens
        runs[f"own_streams_{n}"] = run
    for run in runs.values():
        run["paced_gap_ms"] = args.delay * 1000
    report["stub"] = runs


def vllm_phases(
    server: ServerProcess,
    redis_pid: int,
    probe: RedisProbe,
    args: argparse.Namespace,
    report: dict[str, Any],
) -> None:
    def bodies(n: int) -> list[dict[str, Any]]:
        return [
            {"prompt": STORY.format(n=i), "chat": True, "max_tokens": args.vllm_tokens}
            for i in range(n)
        ]

    measure(server, redis_pid, probe, starts=bodies(1), followers=0)  # warm-up
    runs = {}
    for n in args.vllm_streams:
        print(f"vllm: {n} streams x {args.vllm_readers} readers", flush=True)
        run = measure(
            server,
            redis_pid,
            probe,
            starts=bodies(n),
            followers=args.vllm_readers - 1,
            token_events=True,
        )
        run["tokens_per_s"] = round(run["token_events"] / run["wall_s"], 1)
        runs[f"{n}_streams"] = run
    report["vllm"] = {
        "model": "SmolLM2-135M-Instruct",
        "dtype": "float32",
        "kv_cache_gb": args.kv_cache_gb,
        "max_tokens": args.vllm_tokens,
        "readers_per_stream": args.vllm_readers,
        "runs": runs,
    }


if __name__ == "__main__":
    main()
