"""Benchmark the resumable-stream layer (issue 5).

In one run, against a private redis-server on a free port:
  1. SSE events/s per server CPU-second through the whole layer (HTTP, pipeline, event log, SSE)
     with the stub engine emitting as fast as it can, many concurrent streams, with
     checkpointing to Redis and with the in-process log (streaming.checkpoint=false);
  2. Redis commands and bytes per generated token (INFO deltas over one checkpointed run);
  3. resume latency (reconnect with Last-Event-ID at the middle of a finished stream, to the
     first replayed event) after 100, 1,000 and 10,000 tokens (``--resume-tokens``), of native
     event streams and chat completions (``--resume-wires``): reading from a cursor must cost
     the same however much of the stream came before it. ``--only-resume`` measures only this;
     with ``--against DIR`` (another checkout, e.g. ``git archive HEAD | tar -x -C DIR``) a
     second server runs that code and the trials alternate between the two;
  4. time from kill -9 of the generating process to the first new token from the survivor, on
     the real SmolLM2 engine (a dead producer is found through its Redis presence connection,
     not its lease expiry).

    .venv/bin/python scripts/bench_streams.py --out docs/bench/streams.json
    .venv/bin/python scripts/bench_streams.py --only-resume --trials 20 --out docs/bench/resume.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchkit import (  # noqa: E402
    MODEL,
    Conditions,
    alternate,
    command,
    cpu_seconds,
    private_redis,
    start_rag_stream,
    summary,
    write_json,
)
from tests.support.server import ServerProcess, free_port  # noqa: E402


def serve_stub(port: int, code: Path | None = None, step_ms: float | None = None) -> None:
    """Run the real app with the stub engine (this script re-invoked with --serve-stub), from
    ``code`` (another checkout's root) when given; with ``step_ms``, in lockstep (``lockstep``)."""
    if code is not None:
        sys.path.insert(0, str(code))
    import uvicorn
    from transformers import AutoTokenizer

    from rag_stream.app import create_app
    from rag_stream.generation.engine import Engine
    from rag_stream.generation.stub import StubEngine
    from rag_stream.preflight import migrate
    from rag_stream.settings import Settings, load_settings

    settings = load_settings(port=port)
    migrate(settings)
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))

    async def stub(_: Settings) -> Engine:
        if step_ms is not None:
            return lockstep(StubEngine, step_ms / 1000)(
                tokenizer, max_model_len=settings.engine.max_model_len
            )
        return StubEngine(tokenizer, max_model_len=settings.engine.max_model_len)

    app = create_app(settings, engine_factory=stub)
    log = settings.data_dir / FIRST_BYTE_LOG
    uvicorn.run(timed_resumes(app, log), port=port, log_level="warning")


def lockstep(stub: type[Any], step_s: float) -> type[Any]:
    """The stub engine made to step as vLLM does: every ``step_s`` each running stream gets one
    token, all in the same turn of the event loop (vLLM's output handler hands out one engine
    step's outputs together), and a stream whose reader of the engine comes late gets the steps
    it missed together, as vLLM's per-request output queue merges them. The plain stub emits as
    fast as it can, so its readers find several tokens at each wake-up; here, as behind a real
    engine, a token is a wake-up of its own. A tree whose engine interface has ``push_steps``
    (generation/engine.py ``PushesSteps``) gets its steps pushed, as the vLLM engine pushes
    them: the step loop calls every request's handler in its own turn. Made here rather than in
    the service's stub so that ``--code`` trees of any age run it."""

    class Lockstep(stub):  # type: ignore[misc,valid-type]
        step = 0  # engine steps so far
        _tick: asyncio.Event | None = None
        # requests whose steps are pushed (a tree whose engine interface has ``push_steps``):
        # request id -> [its handler, tokens made, prompt tokens, max tokens, its end]
        _pushed: ClassVar[dict[str, list[Any]]] = {}

        def _start(self) -> None:
            if Lockstep._tick is None:
                Lockstep._tick = asyncio.Event()
                asyncio.get_running_loop().create_task(_steps(self))

        async def generate(self, request_id: str, prompt: Any, sampling: Any) -> Any:
            from rag_stream.generation.engine import EngineStep

            self._start()
            n_prompt = len(self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt)
            made, seen = 0, Lockstep.step
            while made < sampling.max_tokens:
                while Lockstep.step == seen:
                    assert Lockstep._tick is not None
                    await Lockstep._tick.wait()
                n = min(Lockstep.step - seen, sampling.max_tokens - made)
                seen = Lockstep.step
                ids = [self._ids[(n_prompt + made + k) % len(self._ids)] for k in range(n)]
                made += n
                last = made == sampling.max_tokens
                yield EngineStep(ids, n_prompt, 0, "length" if last else None)

        async def push_steps(
            self, request_id: str, prompt: Any, sampling: Any, on_step: Any
        ) -> None:
            """As vLLM's output handler does: each step handed to every request in one turn."""
            self._start()
            n_prompt = len(self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt)
            end = asyncio.get_running_loop().create_future()
            Lockstep._pushed[request_id] = [on_step, 0, n_prompt, sampling.max_tokens, end]
            try:
                await end
            finally:
                Lockstep._pushed.pop(request_id, None)

        async def abort(self, request_id: str) -> None:
            pushed = Lockstep._pushed.pop(request_id, None)
            if pushed is None:
                await super().abort(request_id)
                return
            from rag_stream.generation.engine import EngineStep

            on_step, _, n_prompt, _, end = pushed
            if not end.done():
                on_step(EngineStep([], n_prompt, 0, "cancelled"))
                end.set_result(None)

    async def _steps(engine: Any) -> None:
        from rag_stream.generation.engine import EngineStep

        while True:
            await asyncio.sleep(step_s)
            Lockstep.step += 1
            tick, Lockstep._tick = Lockstep._tick, asyncio.Event()
            assert tick is not None
            tick.set()
            for request_id, pushed in list(Lockstep._pushed.items()):
                on_step, made, n_prompt, most, end = pushed
                if end.done():
                    continue
                token = engine._ids[(n_prompt + made) % len(engine._ids)]
                pushed[1] = made = made + 1
                last = made == most
                more = on_step(EngineStep([token], n_prompt, 0, "length" if last else None))
                if last or not more:
                    Lockstep._pushed.pop(request_id, None)
                    end.set_result(None)

    return Lockstep


FIRST_BYTE_LOG = "first_byte.jsonl"


def timed_resumes(app: Any, log: Path) -> Any:
    """The app, appending to ``log`` for each ``GET .../events`` the server's own time to its
    first body bytes, wall and process CPU (ms): the resume's cost to the server, apart from
    the network and from waiting for a CPU on a busy machine."""
    out = log.open("a", encoding="utf-8")

    async def timed(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/events"):
            await app(scope, receive, send)
            return
        wall0, cpu0 = time.perf_counter(), time.process_time()
        first = True

        async def send_timed(message: Any) -> None:
            nonlocal first
            if first and message["type"] == "http.response.body" and message.get("body"):
                first = False
                wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                out.write(json.dumps({"wall_ms": wall * 1000, "cpu_ms": cpu * 1000}) + "\n")
                out.flush()
            await send(message)

        await app(scope, receive, send_timed)

    return timed


# Long enough for the longest resume case (10,000 tokens after a short prompt).
STUB_MAX_TOKENS = 12_000


def start_stub(
    data: Path,
    redis_url: str,
    checkpoint: bool,
    code: Path | None = None,
    step_ms: float | None = None,
) -> ServerProcess:
    """The stub engine on SmolLM2's tokenizer (``serve_stub``), ready; the service's code from
    ``code`` (another checkout) when given, else from this one; in lockstep with ``step_ms``."""
    port = free_port()
    env = {
        "RAG_STREAM_REDIS_URL": redis_url,
        "RAG_STREAM_STREAMING__CHECKPOINT": str(checkpoint).lower(),
        "RAG_STREAM_LIMITS__MAX_TOKENS": str(STUB_MAX_TOKENS),
        "RAG_STREAM_ENGINE__MAX_MODEL_LEN": str(2 * STUB_MAX_TOKENS),
    }
    stub = [sys.executable, __file__, "--serve-stub", str(port)]
    if code is not None:
        stub += ["--code", str(code)]
    if step_ms is not None:
        stub += ["--step-ms", str(step_ms)]
    server = start_rag_stream(data, env, profile="test", argv=stub, port=port)
    server.wait_ready(120)
    return server


async def _one_stream(client: httpx.AsyncClient, tokens: int) -> int:
    events = 0
    body = {"prompt": "bench", "max_tokens": tokens}
    async with client.stream("POST", "/v1/generate", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                events += 1
    return events


def throughput(server: ServerProcess, streams: int, tokens: int) -> dict[str, float]:
    async def run() -> int:
        limits = httpx.Limits(max_connections=streams)
        async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client:
            counts = await asyncio.gather(*(_one_stream(client, tokens) for _ in range(streams)))
        return sum(counts)

    asyncio.run(run())  # warm-up
    cpu0 = cpu_seconds(server.proc.pid)
    wall0 = time.perf_counter()
    events = asyncio.run(run())
    wall = time.perf_counter() - wall0
    cpu = cpu_seconds(server.proc.pid) - cpu0
    return {
        "events": events,
        "wall_s": round(wall, 2),
        "server_cpu_s": round(cpu, 2),
        "events_per_s": round(events / wall),
        "events_per_cpu_s": round(events / cpu),
    }


def redis_cost(server: ServerProcess, redis_url: str, tokens: int) -> dict[str, float]:
    import redis

    r = redis.Redis.from_url(redis_url)

    def stats() -> tuple[dict[str, int], int]:
        info = r.info("stats")
        calls = {
            k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()
        }
        return calls, int(info["total_net_input_bytes"]) + int(info["total_net_output_bytes"])

    c0, b0 = stats()
    streams = 10
    asyncio.run(_gather_streams(server, streams, tokens))
    c1, b1 = stats()
    generated = streams * tokens
    per_command = {k: round((v - c0.get(k, 0)) / generated, 3) for k, v in c1.items()}
    return {
        "tokens": generated,
        # commandstats counts the XADDs etc. run inside the append script too
        "redis_commands_per_token": round(sum(per_command.values()), 3),
        "by_command_per_token": {k: v for k, v in per_command.items() if v},
        "redis_bytes_per_token": round((b1 - b0) / generated, 1),
    }


async def _gather_streams(server: ServerProcess, streams: int, tokens: int) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
        await asyncio.gather(*(_one_stream(client, tokens) for _ in range(streams)))


def finished_stream(client: httpx.Client, tokens: int, wire: str) -> tuple[str, int]:
    """A finished stream of ``tokens`` tokens and the cursor at its middle: a ``/v1/generate``
    stream (native events) or a chat completion on the engine's model (``chat``: chunks
    rendered from the events)."""
    if wire == "chat":
        messages = [{"role": "user", "content": "x"}]
        body = {"model": "stub", "messages": messages, "max_tokens": tokens, "stream": False}
        r = client.post("/v1/chat/completions", json=body)
    else:
        r = client.post("/v1/generate", json={"prompt": "x", "max_tokens": tokens, "stream": False})
    r.raise_for_status()
    sid = r.json()["stream_id"]
    status = client.get(f"/v1/streams/{sid}").json()
    return sid, status["last_event_id"] // 2


def first_event_ms(client: httpx.Client, sid: str, cursor: int) -> float:
    """Milliseconds from a reconnect with Last-Event-ID to the first replayed event."""
    started = time.perf_counter()
    with client.stream(
        "GET", f"/v1/streams/{sid}/events", headers={"Last-Event-ID": str(cursor)}
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                return (time.perf_counter() - started) * 1000
    raise RuntimeError(f"stream {sid}: nothing replayed after {cursor}")


def resume_latency(
    servers: Mapping[str, ServerProcess],
    cases: Sequence[int],
    trials: int,
    wires: Sequence[str] = ("native",),
) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """The time to the first replayed event per server, wire and stream length, each resume
    right after its stream finished: at the client, and in the server (``timed_resumes``: its
    wall time and CPU time to the first bytes). With several servers (this code and
    ``--against``'s), each trial alternates their order so neither always goes first."""
    keys = [(wire, n) for wire in wires for n in cases]
    times: dict[str, dict[tuple[str, int], list[tuple[float, float, float]]]] = {
        name: {key: [] for key in keys} for name in servers
    }
    clients = {
        name: httpx.Client(base_url=server.url, timeout=600) for name, server in servers.items()
    }

    def server_side(name: str) -> tuple[float, float]:
        log = servers[name].log_path.parent / FIRST_BYTE_LOG  # (its data folder)
        last = json.loads(log.read_text().splitlines()[-1])
        return last["wall_ms"], last["cpu_ms"]

    try:
        for name in servers:  # one warm-up each (first connection, first imports)
            for wire in wires:
                first_event_ms(clients[name], *finished_stream(clients[name], 100, wire))
        for trial in range(trials):
            for wire, n in keys:
                for name in alternate(list(servers), trial):
                    client = clients[name]
                    ms = first_event_ms(client, *finished_stream(client, n, wire))
                    times[name][wire, n].append((ms, *server_side(name)))
    finally:
        for client in clients.values():
            client.close()
    return {
        name: {
            f"{'' if wire == 'native' else wire + '_'}after_{n}_tokens_ms": {
                part: summary([t[i] for t in by_key[wire, n]], digits=2)
                for i, part in enumerate(("client", "server", "server_cpu"))
            }
            for wire, n in keys
        }
        for name, by_key in times.items()
    }


def kill_to_first_token(data: Path, redis_url: str, trials: int) -> dict[str, Any]:
    env = {"RAG_STREAM_MODEL": str(MODEL), "RAG_STREAM_REDIS_URL": redis_url}
    survivor = start_rag_stream(data / "s", env, profile="test")
    survivor.wait_ready()
    gaps = []
    try:
        for i in range(trials):
            victim = start_rag_stream(data / f"v{i}", env, profile="test")
            victim.wait_ready()
            with (
                httpx.Client(base_url=victim.url, timeout=600) as client,
                client.stream(
                    "POST", "/v1/generate", json={"prompt": "Tell a long story.", "max_tokens": 200}
                ) as response,
            ):
                sid, last = "", -1
                for line in response.iter_lines():
                    if line.startswith("id:"):
                        last = int(line[3:])
                    if line.startswith("data:") and not sid:
                        sid = json.loads(line[5:])["stream_id"]
                    if last >= 10:
                        break
            killed = time.perf_counter()
            victim.kill()
            victim.stop()
            with (
                httpx.Client(base_url=survivor.url, timeout=600) as client,
                client.stream(
                    "GET", f"/v1/streams/{sid}/events", headers={"Last-Event-ID": str(last)}
                ) as response,
            ):
                event = ""
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        event = line.split(":", 1)[1].strip()
                    if line.startswith("data:") and event == "token":
                        gaps.append((time.perf_counter() - killed) * 1000)
                        break
    finally:
        survivor.stop()
    return {
        "kill_to_first_new_token_ms": summary(gaps, digits=2) if gaps else {},
        "lease_ms": 3000,
        "samples_ms": [round(g, 1) for g in gaps],
    }


def resume_only(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """The resume table alone, for this code and, with ``--against``, another checkout's."""
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp) / "redis") as redis:
        sides: dict[str, Path | None] = {"this": None}
        if args.against is not None:
            sides["against"] = args.against.resolve()
        servers: dict[str, ServerProcess] = {}
        try:
            for name, code in sides.items():
                servers[name] = start_stub(Path(tmp) / name, redis.url, True, code)
            conditions, load = Conditions(), os.getloadavg()[0]
            report["resume"] = resume_latency(
                servers, args.resume_tokens, args.trials, args.resume_wires
            )
            report["conditions"] = conditions.report([round(load, 2)])
        finally:
            for server in servers.values():
                server.stop()
    if args.against is not None:
        report["against"] = str(args.against)
    print(json.dumps({k: report[k] for k in ("resume", "conditions")}, indent=2), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve-stub", type=int)
    parser.add_argument("--code", type=Path, help="(with --serve-stub) run this checkout's code")
    parser.add_argument("--step-ms", type=float, help="(with --serve-stub) the stub in lockstep")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument(
        "--resume-tokens",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[100, 1000, 10_000],
        help="stream lengths the resume is measured at (comma-separated)",
    )
    parser.add_argument(
        "--resume-wires",
        type=lambda text: text.split(","),
        default=["native", "chat"],
        help="(with --only-resume) native (SSE events) and/or chat (chat-completion chunks)",
    )
    parser.add_argument("--kill-trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "streams.json")
    parser.add_argument(
        "--only-takeover", action="store_true", help="measure only kill -9 -> first new token"
    )
    parser.add_argument("--only-resume", action="store_true", help="measure only the resume")
    parser.add_argument(
        "--against",
        type=Path,
        help="(with --only-resume) also a stub server on another checkout's code, e.g. one made "
        "with `git archive HEAD | tar -x -C DIR`, its trials alternating with this code's",
    )
    args = parser.parse_args()
    if args.serve_stub:
        serve_stub(args.serve_stub, args.code, args.step_ms)
        return
    if args.resume_tokens and max(args.resume_tokens) > STUB_MAX_TOKENS:
        parser.error(f"--resume-tokens: at most {STUB_MAX_TOKENS}")
    report: dict[str, Any] = {"command": command()}
    if args.only_resume:
        resume_only(args, report)
        write_json(args.out, report)
        print(f"wrote {args.out}")
        return
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp) / "redis") as redis:
        base = Path(tmp)
        for checkpoint in () if args.only_takeover else (True, False):
            server = start_stub(base / f"stub-{checkpoint}", redis.url, checkpoint)
            try:
                key = "checkpoint_on" if checkpoint else "checkpoint_off"
                report[f"sse_{key}"] = throughput(server, args.streams, args.tokens)
                print(key, report[f"sse_{key}"], flush=True)
                if checkpoint:
                    report["redis_cost"] = redis_cost(server, redis.url, args.tokens)
                    print(report["redis_cost"], flush=True)
                    resume = resume_latency(
                        {"this": server}, args.resume_tokens, args.trials, args.resume_wires
                    )
                    report["resume"] = resume["this"]
                    print(report["resume"], flush=True)
            finally:
                server.stop()
        report["takeover"] = kill_to_first_token(base, redis.url, args.kill_trials)
        print(report["takeover"], flush=True)
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
