"""Benchmark long-document jobs (issue 15) on SmolLM2-135M float32, CPU.

(a) A 6-section job's output tokens/s, from its `outline` event (before the first section's
    retrieval) to `done` (retrieval, prompt fitting, SQL writes and the event log included),
    against the raw in-process engine generating the very same section prompts back to back
    (rebuilt from the job's events with the job's own code, checked token for token) for the
    same number of tokens.
(b) The time from a kill -9 of the process running a job (mid-section) to the job producing
    tokens again on a second process sharing Redis and PostgreSQL, with KV snapshots off and on.

    .venv/bin/python scripts/bench_jobs.py --out docs/bench/jobs.json

Needs the Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432, db `test`) the tests use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag_stream.generation.engine import Sampling  # noqa: E402
from rag_stream.kinds.job.prompt import fit_section  # noqa: E402
from rag_stream.retrieval.retriever import SearchHit  # noqa: E402
from rag_stream.schemas.jobs import JobSpec  # noqa: E402
from rag_stream.settings import load_settings  # noqa: E402
from scripts.benchkit import MODELS, command, start_rag_stream, summary, write_json  # noqa: E402
from tests.support.pg import postgres_database  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402
from tests.support.sse import Frame, read_stream  # noqa: E402

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
OUTLINE = [
    "What a stream is",
    "Resuming a stream",
    "Crash takeover",
    "Citations and sources",
    "Keys and tenants",
    "Running in production",
]
TITLE = "Operating rag-stream"
DOC_FILES = ["protocol.md", "architecture.md", "reliability.md"]
# as the servers run (scripts/benchkit.py), for the CLI's ingest and reindex
CLI_ENV = {
    "RAG_STREAM_PROFILE": "default",
    "RAG_STREAM_INGEST__SAMPLE_KB": "false",
    "RAG_STREAM_MODELS_DIR": str(MODELS),
}


def _server(data: Path, **env: str) -> ServerProcess:
    # the published figures were taken at the default profile's log level
    return start_rag_stream(data, {"RAG_STREAM_LOG_LEVEL": "info", **env})


def _cli(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "rag_stream", *args],
        env={**os.environ, **CLI_ENV, **env},
        cwd=ROOT,
        check=True,
        capture_output=True,
    )


def _docs_dir(tmp: Path) -> Path:
    docs = tmp / "docs"
    docs.mkdir()
    for name in DOC_FILES:
        (docs / name).write_text((ROOT / "docs" / name).read_text())
    return docs


def _job(url: str, section_tokens: int, outline: list[str]) -> dict[str, Any]:
    body = {"kb": "bench", "title": TITLE, "outline": outline, "section_tokens": section_tokens}
    r = httpx.post(f"{url}/v1/jobs", json=body, timeout=120)
    r.raise_for_status()
    return dict(r.json())


def _timed_events(url: str, job_id: str, after: int | None = None) -> list[tuple[float, Frame]]:
    out: list[tuple[float, Frame]] = []
    headers = {} if after is None else {"Last-Event-ID": str(after)}
    with httpx.Client(base_url=url, timeout=1200) as client:
        read_stream(
            client,
            "GET",
            f"/v1/jobs/{job_id}/events",
            headers=headers,
            on_frame=lambda f: out.append((time.monotonic(), f)),
        )
    return out


def throughput(tmp: Path, section_tokens: int, trials: int) -> dict[str, Any]:
    data = tmp / "throughput"
    _cli({"RAG_STREAM_DATA_DIR": str(data)}, "ingest", str(_docs_dir(tmp)), "--kb", "bench")
    server = _server(data)
    try:
        server.wait_ready()
        return asyncio.run(_alternate(server, section_tokens, trials))
    finally:
        server.stop()


async def _alternate(server: ServerProcess, section_tokens: int, trials: int) -> dict[str, Any]:
    """Trials of the job on the server, each followed by the raw in-process engine on the same
    prompts (the two never run at once; alternating evens out the machine's load)."""
    from rag_stream.generation.vllm_engine import VLLMEngine

    engine = await VLLMEngine.start(load_settings(profile="default"))
    warm = {"prompt": "Hello", "max_tokens": 8, "stream": False}
    await asyncio.to_thread(
        lambda: httpx.post(f"{server.url}/v1/generate", json=warm, timeout=120).raise_for_status()
    )
    async for _ in engine.generate("warm", "Hello", Sampling(max_tokens=8)):
        pass
    jobs: list[dict[str, Any]] = []
    raws: list[dict[str, Any]] = []
    try:
        for _ in range(trials):
            job = await asyncio.to_thread(_job, server.url, section_tokens, OUTLINE)
            timed = await asyncio.to_thread(_timed_events, server.url, job["id"])
            # from the outline (before the first section's retrieval) to `done`
            start = next(t for t, f in timed if f.event == "outline")
            tokens = timed[-1][1].data["usage"]["completion_tokens"]
            seconds = timed[-1][0] - start
            jobs.append({"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds})
            raws.append(await _raw_engine(engine, [f for _, f in timed], section_tokens))
    finally:
        await engine.close()
    job_rates = [j["tokens_per_s"] for j in jobs]
    raw_rates = [r["tokens_per_s"] for r in raws]
    return {
        "sections": len(OUTLINE),
        "section_tokens": section_tokens,
        "trials": trials,
        "job_tokens": jobs[0]["tokens"],
        "job_tokens_per_s": summary(job_rates),
        "raw_engine_tokens_per_s": summary(raw_rates),
        "ratio_of_medians": round(statistics.median(job_rates) / statistics.median(raw_rates), 3),
        "raw_same_tokens_as_the_job": all(r["same"] for r in raws),
    }


async def _raw_engine(engine: Any, frames: list[Frame], section_tokens: int) -> dict[str, Any]:
    """The job's section prompts, rebuilt from its events with its own code, generated by the
    in-process engine back to back for the same numbers of tokens."""
    settings = load_settings(profile="default")
    spec = JobSpec(
        title=TITLE,
        outline=OUTLINE,
        sections=len(OUTLINE),
        section_tokens=section_tokens,
        top_k=settings.jobs.default_top_k,
    )
    sections: list[dict[str, Any]] = []
    for f in frames:
        if f.event == "section":
            sections.append({"hits": [], "ids": [], "done": None})
        elif f.event == "citation":
            c = f.data
            hit = SearchHit(
                c["chunk_id"],
                c["document_id"],
                c["title"],
                c["heading"],
                c["snippet"],
                c["offsets"][0],
                c["offsets"][1],
                c["score"],
            )
            sections[-1]["hits"].append(hit)
        elif f.event == "token":
            sections[-1]["ids"].extend(f.data["token_ids"])
        elif f.event == "section_done":
            sections[-1]["done"] = f.data
    known: dict[str, int] = {}
    prompts = []
    for i, s in enumerate(sections):
        tail = sections[i - 1]["ids"][-settings.jobs.tail_tokens :] if i else []
        fitted = fit_section(engine, spec, OUTLINE, i, tail, s["hits"], known)
        assert len(fitted.prompt_ids) == s["done"]["prompt_tokens"], (i, s["done"])
        known.update({h.chunk_id: n for n, h in fitted.cited})
        prompts.append(fitted.prompt_ids)
    tokens = 0
    same = True
    started = time.monotonic()
    for i, (prompt, s) in enumerate(zip(prompts, sections, strict=True)):
        ids: list[int] = []
        sampling = Sampling(max_tokens=s["done"]["tokens"], ignore_eos=True)
        async for step in engine.generate(f"raw-{i}-{uuid.uuid4().hex}", prompt, sampling):
            ids.extend(step.token_ids)
        tokens += len(ids)
        same = same and [t for t in ids if t not in engine.stop_token_ids] == s["ids"]
    seconds = time.monotonic() - started
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "same": same}


def takeover(tmp: Path, kv: bool, section_tokens: int) -> dict[str, Any]:
    """Kill the owner of a job mid-section; the time until the survivor's tokens come."""
    databases = postgres_database("rag_stream_bench_jobs")
    db = next(databases)
    prefix = f"bench-jobs-{uuid.uuid4().hex[:6]}"
    dirs = [tmp / f"victim-{kv}", tmp / f"survivor-{kv}"]
    base = {"RAG_STREAM_DATABASE_URL": db}
    _cli(
        {**base, "RAG_STREAM_DATA_DIR": str(dirs[0])}, "ingest", str(tmp / "docs"), "--kb", "bench"
    )
    _cli({**base, "RAG_STREAM_DATA_DIR": str(dirs[1])}, "reindex", "--no-progress")
    env = {**base, "RAG_STREAM_REDIS_URL": REDIS_URL, "RAG_STREAM_STREAMING__KEY_PREFIX": prefix}
    if kv:
        env |= {"RAG_STREAM_KV__ENABLED": "true", "RAG_STREAM_KV__KEY_PREFIX": f"{prefix}-kv"}
    servers = [_server(d, **env) for d in dirs]
    try:
        for s in servers:
            s.wait_ready()
        victim, survivor = servers
        job = _job(victim.url, section_tokens, OUTLINE[:3])
        seen: list[Frame] = []

        def follow() -> None:
            try:
                with httpx.Client(base_url=victim.url, timeout=600) as client:
                    read_stream(client, "GET", f"/v1/jobs/{job['id']}/events", on_frame=seen.append)
            except httpx.HTTPError:
                pass

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        while sum(f.event == "token" and f.data["section"] == 1 for f in list(seen)) < 40:
            time.sleep(0.005)
        victim.kill()
        killed = time.monotonic()
        reader.join(30)
        last = seen[-1]
        first_new: float | None = None
        with httpx.Client(base_url=survivor.url, timeout=600) as client:
            for frame in _frames_after(client, job["id"], last.id):
                if frame.event == "token":
                    first_new = time.monotonic()
                    break
        assert first_new is not None
        prompt = next(f for f in seen if f.event == "section" and f.data["index"] == 1)
        return {
            "kv_snapshots": kv,
            "killed_after_tokens_of_section": sum(
                len(f.data["token_ids"])
                for f in seen
                if f.event == "token" and f.data["section"] == 1
            ),
            "section_started_event": prompt.id,
            "kill_to_tokens_s": round(first_new - killed, 3),
        }
    finally:
        for s in servers:
            s.stop()
        next(databases, None)  # drops it


def _frames_after(client: httpx.Client, job_id: str, after: int) -> Any:
    from httpx_sse import connect_sse

    with connect_sse(
        client, "GET", f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": str(after)}
    ) as source:
        for sse in source.iter_sse():
            if sse.data:
                yield Frame(int(sse.id), sse.event, json.loads(sse.data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "jobs.json")
    parser.add_argument("--section-tokens", type=int, default=128)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--skip-takeover", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        result: dict[str, Any] = {"throughput": throughput(tmp, args.section_tokens, args.trials)}
        print(json.dumps(result, indent=2), flush=True)
        if not args.skip_takeover:
            result["takeover"] = [takeover(tmp, kv, 256) for kv in (False, True)]
    result["load_average"] = os.getloadavg()
    write_json(args.out, {"command": command(), **result})
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
