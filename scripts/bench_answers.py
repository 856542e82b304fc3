"""Benchmark POST /v1/answers on the default SmolLM2 engine (issue 4).

In one run, sequentially (2 cores: nothing else runs meanwhile):
  (a) TTFT of /v1/answers with retrieval off (top_k=0) vs the raw in-process engine on the
      identical prompt token ids;
  (b) TTFT with overlap on vs off at conversation histories of 0, 512 and 2048 tokens, and the
      time to the first `citation` event;
  (c) the same with retrieval made 100 ms slower (scripts/serve_slow_retrieval.py).
Every trial uses a fresh conversation, so no trial reuses another's prefix-cache blocks.

    .venv/bin/python scripts/bench_answers.py --trials 5 --out docs/bench/answers.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag_stream.generation.engine import Sampling  # noqa: E402
from rag_stream.generation.prompt import Turn, layout  # noqa: E402
from rag_stream.settings import load_settings  # noqa: E402
from rag_stream.store.models import Conversation, Message  # noqa: E402
from scripts.benchkit import MODEL, MODELS, command, start_rag_stream, summary, write_json  # noqa: E402
from tests.support.server import ServerProcess  # noqa: E402

HISTORIES = (0, 512, 2048)
FILLER = "The committee reviewed the harbour survey, the tide tables and the budget for new buoys. "
DOCS = [
    ("Harbour", "The harbour master keeps the tide tables. New buoys cost 400 crowns each."),
    ("Survey", "The 2024 survey found the north channel silted to two metres at low tide."),
]


def history_turns(tokens: int, tokenizer: Any, salt: str) -> list[Turn]:
    """User/assistant pairs totalling about `tokens` tokens of text, unique per salt."""
    turns: list[Turn] = []
    used = 0
    i = 0
    while used < tokens:
        text = f"[{salt}-{i}] " + FILLER * 4
        used += len(tokenizer.encode(text, add_special_tokens=False))
        turns.append(Turn("user" if i % 2 == 0 else "assistant", text))
        i += 1
    if len(turns) % 2:
        turns.append(Turn("assistant", "Noted."))
    return turns


async def raw_engine_ttft(trials: int) -> tuple[list[float], list[list[int]]]:
    """TTFT of the bare in-process engine on the prompts the service will build."""
    from rag_stream.generation.vllm_engine import VLLMEngine

    settings = load_settings(profile="default")
    engine = await VLLMEngine.start(settings)
    times: list[float] = []
    prompts: list[list[int]] = []
    try:
        for i in range(trials + 1):
            question = f"Trial {uuid.uuid4().hex[:6]}: what do new buoys cost?"
            ids = layout(engine, [], question, 0).full_ids(engine, [])
            started = time.perf_counter()
            async for step in engine.generate(f"raw-{i}", ids, Sampling(max_tokens=1)):
                if step.token_ids:
                    break
            if i:  # the first request warms the engine up
                times.append((time.perf_counter() - started) * 1000)
                prompts.append(ids)
    finally:
        await engine.close()
    return times, prompts


def seed_conversation(db_url: str, kb_id: str, turns: list[Turn]) -> str:
    """Write a conversation with the given history straight into the server's database."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    conv_id = uuid.uuid4().hex
    engine = create_engine(db_url.replace("+aiosqlite", ""))
    with Session(engine) as session:
        session.add(Conversation(id=conv_id, kb_id=kb_id))
        for seq, t in enumerate(turns, start=1):
            session.add(Message(conversation_id=conv_id, seq=seq, role=t.role, content=t.content))
        session.commit()
    engine.dispose()
    return conv_id


def timed_answer(client: httpx.Client, body: dict[str, Any]) -> dict[str, float]:
    started = time.perf_counter()
    first_citation = first_token = None
    done: dict[str, Any] = {}
    with client.stream("POST", "/v1/answers", json=body) as response:
        response.raise_for_status()
        event = ""
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                now = (time.perf_counter() - started) * 1000
                if event == "citation" and first_citation is None:
                    first_citation = now
                elif event == "token" and first_token is None:
                    first_token = now
                elif event == "done":
                    done = json.loads(line[5:])
    return {
        "ttft_ms": first_token or float("nan"),
        "citation_ms": first_citation or float("nan"),
        "cached_tokens": done.get("usage", {}).get("cached_tokens", 0),
        "prompt_tokens": done.get("usage", {}).get("prompt_tokens", 0),
    }


def start_server(data: Path, delay_ms: int = 0, **env: str) -> ServerProcess:
    """The real engine, retrieval made ``delay_ms`` slower (scripts/serve_slow_retrieval.py)."""
    env = {
        "RAG_STREAM_ANSWERS__HISTORY_BUDGET_TOKENS": "3000",
        "SLOW_RETRIEVAL_MS": str(delay_ms),
        **env,
    }
    slow = [sys.executable, str(ROOT / "scripts" / "serve_slow_retrieval.py")]
    server = start_rag_stream(data, env, argv=slow)
    server.wait_ready()
    return server


def run_variant(
    data: Path, trials: int, tokenizer: Any, overlap: bool, delay_ms: int
) -> dict[str, Any]:
    server = start_server(data, delay_ms, RAG_STREAM_ANSWERS__OVERLAP=str(overlap).lower())
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            kb_name = f"bench-{uuid.uuid4().hex[:6]}"
            kb = client.post("/v1/kbs", json={"name": kb_name}).json()
            for title, text in DOCS:
                client.post(f"/v1/kbs/{kb_name}/documents", json={"title": title, "text": text})
            db_url = f"sqlite:///{data / 'rag-stream.db'}"
            results: dict[str, Any] = {}
            timed_answer(client, {"kb": kb_name, "question": "warm-up", "max_tokens": 1})
            for hist in HISTORIES:
                runs = []
                for _ in range(trials):
                    turns = history_turns(hist, tokenizer, uuid.uuid4().hex[:6]) if hist else []
                    conv = seed_conversation(db_url, kb["id"], turns)
                    body = {
                        "kb": kb_name,
                        # unique per trial: no trial may reuse another's cached blocks
                        "question": f"Trial {uuid.uuid4().hex[:6]}: what do new buoys cost?",
                        "conversation_id": conv,
                        "max_tokens": 1,
                    }
                    runs.append(timed_answer(client, body))
                results[str(hist)] = {
                    "ttft_ms": summary([r["ttft_ms"] for r in runs]),
                    "first_citation_ms": summary([r["citation_ms"] for r in runs]),
                    "cached_tokens_median": statistics.median(r["cached_tokens"] for r in runs),
                    "prompt_tokens_median": statistics.median(r["prompt_tokens"] for r in runs),
                }
            return results
    finally:
        server.stop()


def service_ttft_no_retrieval(data: Path, trials: int) -> list[float]:
    server = start_server(data)
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            name = f"empty-{uuid.uuid4().hex[:6]}"
            client.post("/v1/kbs", json={"name": name}).raise_for_status()
            timed_answer(client, {"kb": name, "question": "warm-up", "top_k": 0, "max_tokens": 1})
            times = []
            for _ in range(trials):
                question = f"Trial {uuid.uuid4().hex[:6]}: what do new buoys cost?"
                body = {"kb": name, "question": question, "top_k": 0, "max_tokens": 1}
                times.append(timed_answer(client, body)["ttft_ms"])
            return times
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "answers.json")
    args = parser.parse_args()
    os.environ.setdefault("RAG_STREAM_MODELS_DIR", str(MODELS))
    os.environ.setdefault("RAG_STREAM_DATA_DIR", str(ROOT / ".data"))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))
    report: dict[str, Any] = {"trials": args.trials, "command": command()}
    raw, _ = asyncio.run(raw_engine_ttft(args.trials))
    with tempfile.TemporaryDirectory() as tmp:
        service = service_ttft_no_retrieval(Path(tmp) / "a", args.trials)
        report["a_no_retrieval"] = {
            "raw_engine_ttft_ms": summary(raw),
            "service_ttft_ms": summary(service),
            "added_ttft_ms_p50": round(statistics.median(service) - statistics.median(raw), 1),
        }
        print(json.dumps(report["a_no_retrieval"]), flush=True)
        for delay in (0, 100):
            for overlap in (True, False):
                key = f"{'c' if delay else 'b'}_overlap_{'on' if overlap else 'off'}"
                data = Path(tmp) / key
                report[key] = run_variant(data, args.trials, tokenizer, overlap, delay)
                print(key, json.dumps(report[key]), flush=True)
    write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
